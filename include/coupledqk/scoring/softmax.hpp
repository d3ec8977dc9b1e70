// Softmax scoring: standard scaled dot-product attention, sequence by sequence and head by head.
//
//     O[b, :, h] = softmax(Q'_bh K'_bh^T / sqrt(d) + mask) V_bh      mask: causal by default (scoring/mask.hpp)
#pragma once

#include <vector>

#include "../core/parameters.hpp"
#include "../core/random.hpp"
#include "../core/error.hpp"
#include "../core/parallel.hpp"
#include "masked_softmax.hpp"
#include "policy.hpp"
#include "flash_softmax.hpp"

namespace coupledqk {

struct Softmax {
  static constexpr const char* name = "softmax";
  /// Forward FLOPs of B sequences of T tokens at width D: the unmasked (causal) half of Q K^T and
  /// of P V, 2 * 2 B T^2 D / 2 (a multiply-add counts 2; the softmax itself is not counted).
  static constexpr double score_flops(double B, double T, double D) { return 2 * B * T * T * D; }
  static constexpr bool supports_masks = true;

  template <class S>
  using parameters = EmptyParameters<S>;

  /// Kept for the backward. Reference path: the probabilities of every (sequence, head), B*H
  /// matrices [L, L]. Fast path: the log-sum-exp of every row, [B*H, T] (the output o is the
  /// layer's, passed back to backward).
  template <class S>
  struct saved {
    std::vector<Matrix<S>> probs;
    Matrix<S> lse;
    /// Tiles of the fast path, one set per thread (FlashSoftmax::prepare); reused memory, not state.
    mutable std::vector<typename FlashSoftmax<S>::Workspace> work;
  };

  static void validate(const ScoringShape&) {}

  template <class S>
  static parameters<S> make_parameters(const ScoringShape&, Rng&) {
    return {};
  }

  // q, k, v, o: [B*T, D]; o is written (=).
  template <class S>
  static void forward(const parameters<S>&, const ScoringShape& sh, const Matrix<S>& q,
                      const Matrix<S>& k, const Matrix<S>& v, Matrix<S>& o, saved<S>* keep) {
    const Index T = sh.seq, d = sh.head_dim, BH = sh.batch * sh.heads;
    const S scale = S(1) / std::sqrt(S(d));
    o.resize(q.rows(), q.cols());
    if (sh.padded()) o.setZero();  // the padding rows stay zero
    if (sh.reference) {
      if (keep) keep->probs.assign(BH, Matrix<S>());
      Matrix<S> P;
      for (Index b = 0; b < sh.batch; ++b) {
        const Index r0 = sh.start(b), L = sh.length(b);
        for (Index h = 0; h < sh.heads; ++h) {
          Matrix<S>& p = keep ? keep->probs[b * sh.heads + h] : P;
          MaskedSoftmax<S>::probabilities(q.block(r0, h * d, L, d), k.block(r0, h * d, L, d), scale, p, sh.mask);
          o.block(r0, h * d, L, d).noalias() = p * v.block(r0, h * d, L, d);
        }
      }
      return;
    }
    Matrix<S> local;
    Matrix<S>& lse = keep ? keep->lse : local;
    lse.resize(BH, T);
    std::vector<typename FlashSoftmax<S>::Workspace> local_work;
    auto& work = keep ? keep->work : local_work;
    FlashSoftmax<S>::prepare(work, T, d);
    parallel_for(BH, [&](Index bh) {
      const Index b = bh / sh.heads, h = bh % sh.heads, r0 = sh.start(b), L = sh.length(b);
      FlashSoftmax<S>::forward(q.block(r0, h * d, L, d), k.block(r0, h * d, L, d), v.block(r0, h * d, L, d),
                               scale, o.block(r0, h * d, L, d), lse.row(bh).data(),
                               work[static_cast<std::size_t>(thread_index())], sh.mask);
    });
  }

  // One new query per sequence against its cached keys and values (incremental decoding).
  // q: [1, D] evolved query of the newest token; keys (evolved), values: [n, D], the keys its
  // mask lets it see (the layer passes a window's last w); o: [1, D] (=).
  template <class S>
  static void decode(const parameters<S>&, const ScoringShape& sh, const ConstMatrixRef<S>& q,
                     const ConstBlockRef<S>& keys, const ConstBlockRef<S>& values, MatrixRef<S> o) {
    const Index d = sh.head_dim;
    const S scale = S(1) / std::sqrt(S(d));
    Vector<S> p;
    for (Index h = 0; h < sh.heads; ++h) {
      MaskedSoftmax<S>::last_row(q.block(0, h * d, 1, d), keys.block(0, h * d, keys.rows(), d), scale, p);
      o.block(0, h * d, 1, d).noalias() = p.transpose() * values.block(0, h * d, values.rows(), d);
    }
  }

  // o: the forward's output; d_o: its cotangent. dq, dk, dv are written (=).
  template <class S>
  static void backward(const parameters<S>&, const ScoringShape& sh, const Matrix<S>& q,
                       const Matrix<S>& k, const Matrix<S>& v, const Matrix<S>& o, const saved<S>& keep,
                       const Matrix<S>& d_o, Matrix<S>& dq, Matrix<S>& dk, Matrix<S>& dv,
                       parameters<S>&) {
    const Index T = sh.seq, d = sh.head_dim, BH = sh.batch * sh.heads;
    const S scale = S(1) / std::sqrt(S(d));
    dq.setZero(q.rows(), q.cols());
    dk.setZero(k.rows(), k.cols());
    if (sh.reference) {
      dv.resize(v.rows(), v.cols());
      if (sh.padded()) dv.setZero();
      Matrix<S> dP;
      for (Index b = 0; b < sh.batch; ++b) {
        const Index r0 = sh.start(b), L = sh.length(b);
        for (Index h = 0; h < sh.heads; ++h) {
          const Matrix<S>& P = keep.probs[b * sh.heads + h];
          const auto dob = d_o.block(r0, h * d, L, d);
          dv.block(r0, h * d, L, d).noalias() = P.transpose() * dob;
          dP.noalias() = dob * v.block(r0, h * d, L, d).transpose();
          MaskedSoftmax<S>::backward(P, dP, q.block(r0, h * d, L, d), k.block(r0, h * d, L, d), scale,
                                     dq.block(r0, h * d, L, d), dk.block(r0, h * d, L, d));
        }
      }
      return;
    }
    dv.setZero(v.rows(), v.cols());
    FlashSoftmax<S>::prepare(keep.work, T, d);
    parallel_for(BH, [&](Index bh) {
      const Index b = bh / sh.heads, h = bh % sh.heads, r0 = sh.start(b), L = sh.length(b);
      FlashSoftmax<S>::backward(q.block(r0, h * d, L, d), k.block(r0, h * d, L, d), v.block(r0, h * d, L, d),
                                o.block(r0, h * d, L, d), d_o.block(r0, h * d, L, d), keep.lse.row(bh).data(),
                                scale, dq.block(r0, h * d, L, d), dk.block(r0, h * d, L, d),
                                dv.block(r0, h * d, L, d), keep.work[static_cast<std::size_t>(thread_index())],
                                sh.mask);
    });
  }
};

}  // namespace coupledqk
