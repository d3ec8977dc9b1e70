// The learned separable Hamiltonian shared by the coupled integrators (method spec section 2):
//
//     H(q, k) = V(q) + T(k)
//     V(q) = sum_j a_j log cosh(w_j . q + b_j)      grad V(q) = W^T (a * tanh(W q + b))
//     T(k) = sum_j c_j log cosh(u_j . k + e_j)      grad T(k) = U^T (c * tanh(U k + e))
//
// q is the position, k the momentum. W, U: [m, d]; a, b, c, e: [m].
#pragma once

#include "../core/parameters.hpp"
#include "../core/random.hpp"
#include "tanh_map.hpp"

namespace coupledqk {

/// Sizes and initial scales for the dynamics of one layer.
struct DynamicsShape {
  Index head_dim = 0;            ///< d
  Index hidden = 0;              ///< m
  double init_scale = 0.0;       ///< std of a, c (and P2 for Uncoupled) at init; 0 = exact standard attention
};

template <class S>
struct HamiltonianParameters : NamedTensors<HamiltonianParameters<S>> {
  Matrix<S> W, U;      // [m, d]
  Vector<S> b, a;      // [m]  potential V(q)
  Vector<S> e, c;      // [m]  kinetic T(k)

  HamiltonianParameters() = default;

  /// Spec initialisation: W, U ~ N(0, 1/d); b = e = 0; a, c ~ N(0, init_scale^2) (0 by default).
  HamiltonianParameters(const DynamicsShape& shape, Rng& rng)
      : W(shape.hidden, shape.head_dim), U(shape.hidden, shape.head_dim),
        b(Vector<S>::Zero(shape.hidden)), a(shape.hidden),
        e(Vector<S>::Zero(shape.hidden)), c(shape.hidden) {
    const double w_std = 1.0 / std::sqrt(static_cast<double>(shape.head_dim));
    rng.fill_normal(W, w_std);
    rng.fill_normal(U, w_std);
    rng.fill_normal(a, shape.init_scale);
    rng.fill_normal(c, shape.init_scale);
  }

  template <class Self, class F>
  static void fields(Self& s, F& f) {
    f("W", s.W);
    f("U", s.U);
    f("b", s.b);
    f("a", s.a);
    f("e", s.e);
    f("c", s.c);
  }
};

/// Batched Hamiltonian pieces over [P, d] rows of positions q or momenta k.
template <class S>
struct Hamiltonian {
  using Params = HamiltonianParameters<S>;

  /// grad V(q) per row; `act` keeps tanh(q W^T + b) for potential_vjp. The overloads with a
  /// TanhScratch reuse its buffers (no allocation call after call).
  static void grad_potential(const Params& p, const ConstMatrixRef<S>& q, Matrix<S>& act, Matrix<S>& out) {
    TanhScratch<S> ws;
    grad_potential(p, q, act, out, ws);
  }
  static void grad_potential(const Params& p, const ConstMatrixRef<S>& q, Matrix<S>& act, Matrix<S>& out,
                             TanhScratch<S>& ws) {
    TanhMap<S>::apply(q, p.W, p.b, &p.a, p.W, act, out, ws);
  }
  /// grad T(k) per row.
  static void grad_kinetic(const Params& p, const ConstMatrixRef<S>& k, Matrix<S>& act, Matrix<S>& out) {
    TanhScratch<S> ws;
    grad_kinetic(p, k, act, out, ws);
  }
  static void grad_kinetic(const Params& p, const ConstMatrixRef<S>& k, Matrix<S>& act, Matrix<S>& out,
                           TanhScratch<S>& ws) {
    TanhMap<S>::apply(k, p.U, p.e, &p.c, p.U, act, out, ws);
  }
  /// Cotangent of grad V(q): accumulates into qbar and the gradients of W, b, a.
  static void grad_potential_vjp(const Params& p, const ConstMatrixRef<S>& q, const Matrix<S>& act,
                                 const ConstMatrixRef<S>& gbar, MatrixRef<S> qbar, Params& grad) {
    TanhScratch<S> ws;
    grad_potential_vjp(p, q, act, gbar, qbar, grad, ws);
  }
  static void grad_potential_vjp(const Params& p, const ConstMatrixRef<S>& q, const Matrix<S>& act,
                                 const ConstMatrixRef<S>& gbar, MatrixRef<S> qbar, Params& grad,
                                 TanhScratch<S>& ws) {
    TanhMap<S>::vjp(q, act, p.W, &p.a, p.W, gbar, qbar, grad.W, grad.b, &grad.a, grad.W, ws);
  }
  /// Cotangent of grad T(k): accumulates into kbar and the gradients of U, e, c.
  static void grad_kinetic_vjp(const Params& p, const ConstMatrixRef<S>& k, const Matrix<S>& act,
                               const ConstMatrixRef<S>& gbar, MatrixRef<S> kbar, Params& grad) {
    TanhScratch<S> ws;
    grad_kinetic_vjp(p, k, act, gbar, kbar, grad, ws);
  }
  static void grad_kinetic_vjp(const Params& p, const ConstMatrixRef<S>& k, const Matrix<S>& act,
                               const ConstMatrixRef<S>& gbar, MatrixRef<S> kbar, Params& grad,
                               TanhScratch<S>& ws) {
    TanhMap<S>::vjp(k, act, p.U, &p.c, p.U, gbar, kbar, grad.U, grad.e, &grad.c, grad.U, ws);
  }

  /// H(q, k) for each row: [P].
  static Vector<S> energy(const Params& p, const ConstMatrixRef<S>& q, const ConstMatrixRef<S>& k) {
    Vector<S> h = Vector<S>::Zero(q.rows());
    Matrix<S> zq = q * p.W.transpose();
    zq.rowwise() += p.b.transpose();
    Matrix<S> zk = k * p.U.transpose();
    zk.rowwise() += p.e.transpose();
    for (Index r = 0; r < q.rows(); ++r)
      for (Index j = 0; j < zq.cols(); ++j)
        h[r] += p.a[j] * log_cosh(zq(r, j)) + p.c[j] * log_cosh(zk(r, j));
    return h;
  }
};

}  // namespace coupledqk
