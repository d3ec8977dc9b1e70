// Masked softmax attention of one head, the plain reference path shared by both scoring policies.
//
//     P = softmax(scale * q k^T + mask)      q, k: [L, d] (one sequence)   P: [L, L], zero where masked
//
// Row i reads only the scores of the keys its mask allows (scoring/mask.hpp: one range
// [begin(i), end(i, L))), so an output never depends on a masked key (bitwise). With the default
// causal mask this is the causal softmax, operation for operation.
#pragma once

#include <cmath>

#include "../core/types.hpp"
#include "mask.hpp"

namespace coupledqk {

template <class S>
struct MaskedSoftmax {
  /// P (written) from one sequence's q, k of one head.
  static void probabilities(const ConstBlockRef<S>& q, const ConstBlockRef<S>& k, S scale, Matrix<S>& P,
                            const Mask& mask = {}) {
    const Index T = q.rows();
    P.noalias() = q * k.transpose();
    for (Index i = 0; i < T; ++i) {
      const Index lo = mask.begin(i), hi = mask.end(i, T);
      S mx = P(i, lo);
      for (Index j = lo + 1; j < hi; ++j) mx = std::max(mx, P(i, j));
      S sum = 0;
      for (Index j = lo; j < hi; ++j) {
        const S e = std::exp(scale * (P(i, j) - mx));
        P(i, j) = e;
        sum += e;
      }
      const S inv = S(1) / sum;
      for (Index j = lo; j < hi; ++j) P(i, j) *= inv;
      for (Index j = 0; j < lo; ++j) P(i, j) = S(0);
      for (Index j = hi; j < T; ++j) P(i, j) = S(0);
    }
  }

  /// The last row of P for one new query q [1, d] against every key it sees [n, d] (decoding; the
  /// caller passes only the keys of its window). Same operations in the same order as the last
  /// row of probabilities(), so the result matches it.
  static void last_row(const ConstBlockRef<S>& q, const ConstBlockRef<S>& k, S scale, Vector<S>& p) {
    p.noalias() = k * q.transpose();
    const S mx = p.maxCoeff();
    S sum = 0;
    for (Index j = 0; j < p.size(); ++j) {
      p[j] = std::exp(scale * (p[j] - mx));
      sum += p[j];
    }
    p *= S(1) / sum;
  }

  /// Given P and the cotangent dP of P, accumulates (+=) the cotangents of q and k.
  /// dS = P * (dP - rowsum(P * dP)) is formed in place of dP (zero where P is masked).
  static void backward(const Matrix<S>& P, Matrix<S>& dP, const ConstBlockRef<S>& q,
                       const ConstBlockRef<S>& k, S scale, BlockRef<S> dq, BlockRef<S> dk) {
    const Vector<S> rows = (P.array() * dP.array()).rowwise().sum().matrix();
    dP.array() = P.array() * (dP.array().colwise() - rows.array());
    dP *= scale;
    dq.noalias() += dP * k;
    dk.noalias() += dP.transpose() * q;
  }
};

}  // namespace coupledqk
