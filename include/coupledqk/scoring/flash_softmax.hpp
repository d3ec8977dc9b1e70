// Masked softmax attention of one head of one sequence without the T x T matrix: the fast CPU path.
//
// Queries and keys are cut into tiles of `tile` rows. For a query tile, only the key tiles its mask
// reaches are visited (scoring/mask.hpp: causal stops at the diagonal, a window starts w - 1 keys
// before the tile's first query; tiles the mask empties are skipped, so a window of w costs
// O(T w)); within a visited tile each row keeps its own range of keys. A running row maximum m and sum
// l (online softmax) rescale the accumulated output. The forward keeps, per row, the log-sum-exp
// lse = m + log l; the backward rebuilds each probability tile from it, P = exp(s - lse), so only
// O(T) statistics are stored instead of the T x T probabilities.
//
//     q, k: [T, d]   v, o: [T, dv]   lse: [T]
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "../core/parallel.hpp"
#include "../core/types.hpp"
#include "mask.hpp"

namespace coupledqk {

template <class S>
struct FlashSoftmax {
  static constexpr Index tile = 64;

  /// The tiles and row statistics of one head's pass. Its content never carries from one call to
  /// the next, so results do not depend on which workspace (thread) runs a head.
  struct Workspace {
    Matrix<S> s, acc, dp;   // [tile, tile], [tile, dv], [tile, tile]
    Vector<S> m, l, delta;  // [tile], [tile], [T]
    void reserve(Index T, Index dv) {
      s.resize(tile, tile);
      dp.resize(tile, tile);
      acc.resize(tile, dv);
      m.resize(tile);
      l.resize(tile);
      delta.resize(T);
    }
  };
  /// One workspace per thread of a parallel loop over heads, all sized here by the calling thread
  /// (so the loop allocates nothing, whichever thread runs which head); `work` is kept by the caller
  /// from call to call (the scorings keep it in their saved state).
  static void prepare(std::vector<Workspace>& work, Index T, Index dv) {
    // every thread of the coming loop, or the calling thread when the loop runs on it alone
    const auto n = static_cast<std::size_t>(std::max(max_threads(), thread_index() + 1));
    if (work.size() < n) work.resize(n);
    for (Workspace& w : work) w.reserve(T, dv);
  }

  /// The key tiles query rows [i0, i0 + bi) reach: tiles starting at j0 = first, first + tile, ...
  /// while j0 < last (first is a multiple of tile, so the tiles are the same as without a mask).
  static void key_tiles(const Mask& mask, Index i0, Index bi, Index T, Index& first, Index& last) {
    first = (mask.begin(i0) / tile) * tile;
    last = mask.end(i0 + bi - 1, T);
  }

  /// o (=) and lse (=) for one head of one sequence of T = q.rows() tokens.
  static void forward(const ConstBlockRef<S>& q, const ConstBlockRef<S>& k, const ConstBlockRef<S>& v,
                      S scale, BlockRef<S> o, S* lse, Workspace& w, const Mask& mask = {}) {
    const Index T = q.rows(), dv = v.cols();
    w.reserve(T, dv);  // nothing to do when prepare() sized it
    Matrix<S>&s = w.s, &acc = w.acc;
    Vector<S>&m = w.m, &l = w.l;
    for (Index i0 = 0; i0 < T; i0 += tile) {
      const Index bi = std::min(tile, T - i0);
      m.head(bi).setConstant(-std::numeric_limits<S>::infinity());
      l.head(bi).setZero();
      acc.topRows(bi).setZero();
      Index first = 0, last = 0;
      key_tiles(mask, i0, bi, T, first, last);
      for (Index j0 = first; j0 < last; j0 += tile) {
        const Index bj = std::min(tile, T - j0);
        auto sb = s.topLeftCorner(bi, bj);
        sb.noalias() = q.middleRows(i0, bi) * k.middleRows(j0, bj).transpose();
        for (Index r = 0; r < bi; ++r) {
          // row i0 + r sees the columns [c0, c1) of this tile (causal: c0 = 0, c1 up to the diagonal)
          const Index c0 = std::max<Index>(0, mask.begin(i0 + r) - j0);
          const Index c1 = std::min(bj, mask.end(i0 + r, T) - j0);
          if (c1 <= c0) {  // nothing of this tile (a window's edge): the row's state is unchanged
            sb.row(r).setZero();
            continue;
          }
          S mx = m[r];
          for (Index c = c0; c < c1; ++c) mx = std::max(mx, scale * sb(r, c));
          const S alpha = std::exp(m[r] - mx);  // 0 on the row's first tile (m = -inf)
          S sum = 0;
          for (Index c = c0; c < c1; ++c) {
            const S e = std::exp(scale * sb(r, c) - mx);
            sb(r, c) = e;
            sum += e;
          }
          for (Index c = 0; c < c0; ++c) sb(r, c) = S(0);
          for (Index c = c1; c < bj; ++c) sb(r, c) = S(0);
          l[r] = l[r] * alpha + sum;
          m[r] = mx;
          acc.row(r) *= alpha;
        }
        acc.topRows(bi).noalias() += sb * v.middleRows(j0, bj);
      }
      for (Index r = 0; r < bi; ++r) {
        o.row(i0 + r) = acc.row(r) / l[r];
        lse[i0 + r] = m[r] + std::log(l[r]);
      }
    }
  }

  /// Accumulates (+=) dq, dk, dv of one head of one sequence from its forward's o and lse (same
  /// mask) and the cotangent d_o.
  static void backward(const ConstBlockRef<S>& q, const ConstBlockRef<S>& k, const ConstBlockRef<S>& v,
                       const ConstBlockRef<S>& o, const ConstBlockRef<S>& d_o, const S* lse, S scale,
                       BlockRef<S> dq, BlockRef<S> dk, BlockRef<S> dv, Workspace& w, const Mask& mask = {}) {
    const Index T = q.rows();
    w.reserve(T, v.cols());
    // delta_i = sum_j P_ij dP_ij = d_o_i . o_i
    Vector<S>& delta = w.delta;
    delta = (d_o.array() * o.array()).rowwise().sum().matrix();
    Matrix<S>&p = w.s, &dp = w.dp;
    for (Index i0 = 0; i0 < T; i0 += tile) {
      const Index bi = std::min(tile, T - i0);
      Index first = 0, last = 0;
      key_tiles(mask, i0, bi, T, first, last);
      for (Index j0 = first; j0 < last; j0 += tile) {
        const Index bj = std::min(tile, T - j0);
        auto pb = p.topLeftCorner(bi, bj);
        auto dpb = dp.topLeftCorner(bi, bj);
        pb.noalias() = q.middleRows(i0, bi) * k.middleRows(j0, bj).transpose();
        for (Index r = 0; r < bi; ++r) {
          const Index c0 = std::min(bj, std::max<Index>(0, mask.begin(i0 + r) - j0));
          const Index c1 = std::max(c0, std::min(bj, mask.end(i0 + r, T) - j0));
          for (Index c = 0; c < c0; ++c) pb(r, c) = S(0);
          for (Index c = c0; c < c1; ++c) pb(r, c) = std::exp(scale * pb(r, c) - lse[i0 + r]);
          for (Index c = c1; c < bj; ++c) pb(r, c) = S(0);
        }
        dv.middleRows(j0, bj).noalias() += pb.transpose() * d_o.middleRows(i0, bi);
        dpb.noalias() = d_o.middleRows(i0, bi) * v.middleRows(j0, bj).transpose();
        // dS = P * (dP - delta), times the score scale
        dpb.array() = scale * pb.array() * (dpb.array().colwise() - delta.segment(i0, bi).array());
        dq.middleRows(i0, bi).noalias() += dpb * k.middleRows(j0, bj);
        dk.middleRows(j0, bj).noalias() += dpb.transpose() * q.middleRows(i0, bi);
      }
    }
  }
};

}  // namespace coupledqk
