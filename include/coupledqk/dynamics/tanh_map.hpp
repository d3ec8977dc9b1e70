// The one nonlinearity every integrator is built from, batched over rows:
//
//     y = (scale * tanh(x A^T + bias)) B          x: [P, d]  A, B: [r, d]  bias, scale: [r]  y: [P, d]
//
// With A = B = W and scale = a it is the Hamiltonian's grad V(q) = W^T (a * tanh(W q + b)), row by row;
// with scale = 1 and B = P2^T it is the uncoupled MLP P2 tanh(P1 x + p). Both the forward and its
// vector-Jacobian product live here, so the integrators only arrange sub-steps.
#pragma once

#include <cmath>

#include "../core/small_gemm.hpp"
#include "../core/types.hpp"

namespace coupledqk {

/// Intermediates of TanhMap::apply and vjp; passing the same one call after call makes them
/// allocate nothing once the sizes are settled.
template <class S>
struct TanhScratch {
  Matrix<S> scaled_B;  // diag(scale) B [r, d]: the scale folded into the small matrix, not into act
  Matrix<S> act_ybar;  // act^T ybar [r, d]
  Matrix<S> ubar;      // [P, r]
};

template <class S>
struct TanhMap {
  /// Forward. `act` receives tanh(x A^T + bias) [P, r] (needed by vjp); `y` is written (=).
  /// `scale` may be null (all ones). y = act (diag(scale) B): the scale multiplies the [r, d] matrix,
  /// so no [P, r] pass is spent on it.
  static void apply(const ConstMatrixRef<S>& x, const Matrix<S>& A, const Vector<S>& bias,
                    const Vector<S>* scale, const Matrix<S>& B, Matrix<S>& act, Matrix<S>& y,
                    TanhScratch<S>& ws) {
    act.resize(x.rows(), A.rows());
    small_gemm<S>(x, false, A, true, act);  // x A^T (core/small_gemm.hpp: no packing, no allocation)
    // Two passes over whole matrices, both vectorised: Eigen does not vectorise the one-pass form
    // with a replicated bias (its tanh then runs scalar, 9x slower).
    act.rowwise() += bias.transpose();
    act = act.array().tanh();
    y.resize(x.rows(), B.cols());
    if (scale) {
      ws.scaled_B.noalias() = scale->asDiagonal() * B;
      small_gemm<S>(act, false, ws.scaled_B, false, y);
    } else {
      small_gemm<S>(act, false, B, false, y);
    }
  }

  /// Vector-Jacobian product for the cotangent `ybar` [P, d] of y, given x and the `act` that apply
  /// returned. Accumulates (+=) into xbar [P, d], dA [r, d], dbias [r], dscale [r] (when scale is
  /// not null) and dB [r, d]. Pass the same matrix for dA and dB when A and B are tied.
  ///
  /// With G = act^T ybar [r, d]: dB += diag(scale) G, dscale_j += sum_i B_ji G_ji (both [r, d] work
  /// instead of [P, r] passes), and the cotangent of the pre-activation is
  /// ubar = (ybar B^T) * scale * (1 - act^2).
  static void vjp(const ConstMatrixRef<S>& x, const Matrix<S>& act, const Matrix<S>& A,
                  const Vector<S>* scale, const Matrix<S>& B, const ConstMatrixRef<S>& ybar,
                  MatrixRef<S> xbar, Matrix<S>& dA, Vector<S>& dbias, Vector<S>* dscale,
                  Matrix<S>& dB, TanhScratch<S>& ws) {
    // ubar = d loss / d (scale * act) = ybar B^T  [P, r]
    Matrix<S>& ubar = ws.ubar;
    ubar.resize(ybar.rows(), B.rows());
    small_gemm<S>(ybar, false, B, true, ubar);
    // through tanh: d/dz tanh(z) = 1 - tanh(z)^2
    if (scale) {
      ws.act_ybar.resize(act.cols(), ybar.cols());
      small_gemm<S>(act, true, ybar, false, ws.act_ybar);  // G = act^T ybar
      dB.noalias() += scale->asDiagonal() * ws.act_ybar;
      dscale->noalias() += (B.array() * ws.act_ybar.array()).rowwise().sum().matrix();
      ubar.array().rowwise() *= scale->transpose().array();
    } else {
      small_gemm<S>(act, true, ybar, false, dB, S(1), true);
    }
    ubar.array() *= (S(1) - act.array().square());
    dbias.noalias() += ubar.colwise().sum().transpose();
    small_gemm<S>(ubar, true, x, false, dA, S(1), true);  // dA += ubar^T x
    small_gemm<S>(ubar, false, A, false, xbar, S(1), true);  // xbar += ubar A
  }
};

/// log cosh(z), stable for large |z|: |z| + log1p(exp(-2|z|)) - log 2.
template <class S>
S log_cosh(S z) {
  const S a = std::abs(z);
  return a + std::log1p(std::exp(S(-2) * a)) - S(0.69314718055994530941723212145818);
}

}  // namespace coupledqk
