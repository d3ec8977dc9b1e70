// Causal softmax attention of one head, the plain reference path shared by both scoring policies.
//
//     P = softmax(scale * q k^T + causal mask)      q, k: [T, d]   P: [T, T], zero above the diagonal
//
// Row i only ever reads scores j <= i, so an output never depends on later tokens (bitwise).
#pragma once

#include <cmath>

#include "../core/types.hpp"

namespace coupledqk {

template <class S>
struct CausalSoftmax {
  /// P (written) from one head's q, k.
  static void probabilities(const ConstBlockRef<S>& q, const ConstBlockRef<S>& k, S scale, Matrix<S>& P) {
    const Index T = q.rows();
    P.noalias() = q * k.transpose();
    for (Index i = 0; i < T; ++i) {
      S mx = P(i, 0);
      for (Index j = 1; j <= i; ++j) mx = std::max(mx, P(i, j));
      S sum = 0;
      for (Index j = 0; j <= i; ++j) {
        const S e = std::exp(scale * (P(i, j) - mx));
        P(i, j) = e;
        sum += e;
      }
      const S inv = S(1) / sum;
      for (Index j = 0; j <= i; ++j) P(i, j) *= inv;
      for (Index j = i + 1; j < T; ++j) P(i, j) = S(0);
    }
  }

  /// The last row of P for one new query q [1, d] against all keys so far [t+1, d] (decoding).
  /// Same operations in the same order as row t of probabilities(), so the result matches it.
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
  /// dS = P * (dP - rowsum(P * dP)) is formed in place of dP.
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
