// Plain forward/backward kernels of the GPT's non-attention layers, without a tape.
//
// ops.hpp wraps them as tape nodes; code that runs the model step by step without gradients (text
// generation with a KV cache) can call them directly. Rows are tokens. Under OpenMP the rows are
// shared among threads, each row computed by one thread in a fixed order, and every reduction
// across rows runs in row order (LayerNorm's gain and bias gradients: fixed blocks of columns on
// the threads, each summing its rows in order; the loss: serially): the results do not depend on
// the thread count. Rows are Eigen array expressions, vectorised for the instruction set the
// program is compiled for (AVX2 and AVX-512 builds may differ in the last bits: different packet
// widths in the row reductions and in exp/tanh).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "../core/error.hpp"
#include "../core/parallel.hpp"
#include "../core/types.hpp"

namespace coupledqk::kernels {

/// LayerNorm epsilon (GPT-2, PyTorch default).
inline constexpr double layer_norm_eps = 1e-5;

// ---- LayerNorm, per row ---------------------------------------------------------------------
//
//   mu = mean(x_r), var = mean((x_r - mu)^2), rstd = 1 / sqrt(var + eps)
//   y_r = (x_r - mu) * rstd * g + b
//
// x, y: [N, D]; g, b: [1, D]. stats (optional, for the backward): [N, 2] = (mu, rstd), written (=).
template <class S>
void layer_norm_forward(const ConstMatrixRef<S>& x, const ConstMatrixRef<S>& g, const ConstMatrixRef<S>& b,
                        MatrixRef<S> y, Matrix<S>* stats, S eps = S(layer_norm_eps)) {
  const Index N = x.rows(), D = x.cols();
  if (stats) stats->resize(N, 2);
  parallel_rows(N, (N * D) > 32768, [&](Index r) {
    const auto xr = x.row(r);
    const S mu = xr.sum() / S(D);
    const S var = (xr.array() - mu).square().sum() / S(D);
    const S rstd = S(1) / std::sqrt(var + eps);
    y.row(r) = ((xr.array() - mu) * rstd * g.row(0).array() + b.row(0).array()).matrix();
    if (stats) {
      (*stats)(r, 0) = mu;
      (*stats)(r, 1) = rstd;
    }
  });
}

// Backward of the above, with xhat = (x - mu) * rstd and dxhat = dy * g:
//   dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))     written (=)
//   dg += sum_rows(dy * xhat),  db += sum_rows(dy)                    accumulated (+=), may be null
template <class S>
void layer_norm_backward(const ConstMatrixRef<S>& x, const ConstMatrixRef<S>& g, const Matrix<S>& stats,
                         const ConstMatrixRef<S>& dy, Matrix<S>& dx, S* dg, S* db) {
  const Index N = x.rows(), D = x.cols();
  dx.resize(N, D);
  parallel_rows(N, (N * D) > 32768, [&](Index r) {
    const S mu = stats(r, 0), rstd = stats(r, 1);
    // expressions, evaluated where used (no per-row temporaries)
    const auto xhat = (x.row(r).array() - mu) * rstd;
    const auto dxhat = dy.row(r).array() * g.row(0).array();
    const S mean_dxhat = dxhat.sum() / S(D);
    const S mean_dxhat_xhat = (dxhat * xhat).sum() / S(D);
    dx.row(r) = (rstd * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat)).matrix();
  });
  // sums over rows: each entry of dg, db adds its rows in row order; the columns are cut into fixed
  // blocks that the threads share (the same sums, in the same order, on any thread count)
  if (!dg && !db) return;
  using Row = Eigen::Map<Eigen::Array<S, 1, Eigen::Dynamic>>;
  constexpr Index block = 64;
  const Index blocks = (D + block - 1) / block;
  parallel_rows(blocks, (N * D) > 32768, [&](Index j) {
    const Index c0 = j * block, w = std::min(block, D - c0);
    for (Index r = 0; r < N; ++r) {
      const S mu = stats(r, 0), rstd = stats(r, 1);
      const auto dyr = dy.row(r).segment(c0, w).array();
      if (dg) Row(dg + c0, w) += dyr * ((x.row(r).segment(c0, w).array() - mu) * rstd);
      if (db) Row(db + c0, w) += dyr;
    }
  });
}

// ---- GELU, tanh form (GPT-2) ----------------------------------------------------------------
//
//   gelu(x)  = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//   gelu'(x) = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
//
// tanh is Eigen's (numext::tanh; for float a fast rational approximation, vectorised on whole rows
// below), so the scalar functions give the same values as the row kernels.
template <class S>
S gelu(S x) {
  const S c = S(0.7978845608028654), k = S(0.044715);
  return S(0.5) * x * (S(1) + Eigen::numext::tanh(c * (x + k * x * x * x)));
}
template <class S>
S gelu_grad(S x) {
  const S c = S(0.7978845608028654), k = S(0.044715);
  const S t = Eigen::numext::tanh(c * (x + k * x * x * x));
  return S(0.5) * (S(1) + t) + S(0.5) * x * (S(1) - t * t) * c * (S(1) + S(3) * k * x * x);
}

/// y = gelu(x), x and y: [N, C] (y written, =). Whole rows as Eigen array expressions (vectorised
/// tanh).
template <class S>
void gelu_forward(const ConstMatrixRef<S>& x, MatrixRef<S> y) {
  const Index N = x.rows(), C = x.cols();
  const S c = S(0.7978845608028654), k = S(0.044715);
  parallel_rows(N, (8 * N * C) > 32768, [&](Index r) {
    const auto xr = x.row(r).array();
    y.row(r).array() = S(0.5) * xr * (S(1) + (c * (xr + k * xr * xr * xr)).tanh());
  });
}

/// dx = dy * gelu'(x), written (=). tanh(u) goes through dx first, so it is computed once.
template <class S>
void gelu_backward(const ConstMatrixRef<S>& x, const ConstMatrixRef<S>& dy, Matrix<S>& dx) {
  const Index N = x.rows(), C = x.cols();
  const S c = S(0.7978845608028654), k = S(0.044715);
  dx.resize(N, C);
  parallel_rows(N, (8 * N * C) > 32768, [&](Index r) {
    const auto xr = x.row(r).array();
    auto t = dx.row(r).array();
    t = (c * (xr + k * xr * xr * xr)).tanh();
    t = dy.row(r).array() *
        (S(0.5) * (S(1) + t) + S(0.5) * xr * (S(1) - t * t) * c * (S(1) + S(3) * k * xr * xr));
  });
}

// ---- softmax cross-entropy over a row of logits, mean over rows -----------------------------
//
//   loss = (1/N) sum_r [ logsumexp(z_r) - z_r[t_r] ]     computed with the row maximum subtracted
//
// logits: [N, V]; targets: N ids in [0, V) (checked by the caller). probs: [N, V] = softmax(z_r),
// written (=); the backward uses it. It is not optional: the row sums are taken over the stored
// exponentials, and Eigen splits a row into scalar and packet parts by the alignment of the memory it
// works on, so a variant that summed the unstored expression instead would differ in the last bits
// (seen with AVX-512: loss() and evaluate() disagreed by 1 ulp). Every caller (with or without
// gradients) therefore gets the same bits for the same logits. The exponentials are Eigen's
// vectorised exp on whole rows. The sum over rows is taken in double, in order, of the per-row losses
// (float values for S = float), which go through `work` ([N, 1]) when given, else through a local
// buffer.
template <class S>
S cross_entropy_forward(const ConstMatrixRef<S>& logits, const std::int32_t* targets, Matrix<S>& probs,
                        Matrix<S>* work = nullptr) {
  const Index N = logits.rows(), V = logits.cols();
  probs.resize(N, V);
  Matrix<S> local;
  Matrix<S>& row_loss = work ? *work : local;
  row_loss.resize(N, 1);
  parallel_rows(N, (4 * N * V) > 32768, [&](Index r) {
    const auto z = logits.row(r);
    const S mx = z.maxCoeff();
    auto p = probs.row(r);
    p.array() = (z.array() - mx).exp();
    const S sum = p.sum();
    p *= S(1) / sum;
    row_loss(r, 0) = mx + std::log(sum) - z[targets[r]];
  });
  double total = 0;
  for (Index r = 0; r < N; ++r) total += static_cast<double>(row_loss(r, 0));  // in row order
  return static_cast<S>(total / static_cast<double>(N));
}

// Backward: dz_r = dloss / N * (softmax(z_r) - onehot(t_r)), written (=) in place of probs.
template <class S>
void cross_entropy_backward(Matrix<S>& probs, const std::int32_t* targets, S dloss) {
  const Index N = probs.rows();
  const S scale = dloss / S(N);
  parallel_rows(N, (N * probs.cols()) > 32768, [&](Index r) {
    probs(r, targets[r]) -= S(1);
    probs.row(r) *= scale;
  });
}

}  // namespace coupledqk::kernels
