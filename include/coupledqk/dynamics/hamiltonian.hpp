// The learned separable Hamiltonian shared by the coupled integrators (method spec section 2):
//
//     H(q, k) = V(q) + T(k)
//     V(q) = sum_j a_j log cosh(w_j . q + b_j)      grad V(q) = W^T (a * tanh(W q + b))
//     T(k) = sum_j c_j log cosh(u_j . k + e_j)      grad T(k) = U^T (c * tanh(U k + e))
//
// q is the position, k the momentum. W, U: [m, d]; a, b, c, e: [m].
//
// The velocity family (method spec section 3c) adds two with a unit mass, T(k) = |k|^2 / 2, so
// that grad T(k) = k and q moves with velocity k: UnitMassHamiltonian (V as above, tensors W, b, a)
// and FreeParticle (V = 0, no tensors). A non-conservative force in place of -grad V is
// dynamics/force.hpp's NewtonField.
#pragma once

#include <type_traits>

#include "../core/parameters.hpp"
#include "../core/random.hpp"
#include "shape.hpp"
#include "tanh_map.hpp"

namespace coupledqk {

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

/// The learned tanh Hamiltonian, batched over [P, d] rows of positions q or momenta k. It is the
/// default Hamiltonian of the splitting methods (integrators/splitting.hpp) and of Euler. Another
/// separable Hamiltonian is a struct with the same members:
///
///   template <class S> using parameters = ...;       // named tensors
///   template <class S> struct workspace;             // what a gradient keeps for its vjp + buffers
///   template <class S> static parameters<S> make_parameters(const DynamicsShape&, Rng&);
///   grad_potential(p, q, out, ws), grad_kinetic(p, k, out, ws)      out [P, d] written (=)
///   grad_potential_vjp(p, q, ws, gbar, qbar, grad), grad_kinetic_vjp(p, k, ws, gbar, kbar, grad)
///       given the ws of the matching gradient call: qbar/kbar [P, d] and grad accumulate (+=)
///   energy(p, q, k)                                   H per row, [P] (for the physics checks)
///   static constexpr bool is_conservative;            optional, default true: false when the
///       "potential gradient" is a general force field (not a gradient), so that a splitting of it
///       is reversible and volume-preserving but not symplectic (is_conservative_field below)
struct TanhHamiltonian {
  template <class S>
  using parameters = HamiltonianParameters<S>;

  /// act = tanh(q W^T + b) (or of k with U, e) of the last gradient call, for its vjp.
  template <class S>
  struct workspace {
    Matrix<S> act;
    TanhScratch<S> tanh;
  };

  template <class S>
  static parameters<S> make_parameters(const DynamicsShape& shape, Rng& rng) {
    return parameters<S>(shape, rng);
  }

  /// Forward FLOPs of one evaluation of grad V (or grad T) for one row: two [d x m] products,
  /// 4 d m (a multiply-add counts 2; the tanh and the scaling by a are not counted).
  static constexpr double grad_potential_flops(double d, double m) { return 4 * d * m; }
  static constexpr double grad_kinetic_flops(double d, double m) { return 4 * d * m; }

  /// grad V(q) = W^T (a * tanh(W q + b)) per row.
  template <class S>
  static void grad_potential(const parameters<S>& p, const ConstMatrixRef<S>& q, Matrix<S>& out, workspace<S>& ws) {
    TanhMap<S>::apply(q, p.W, p.b, &p.a, p.W, ws.act, out, ws.tanh);
  }
  /// grad T(k) = U^T (c * tanh(U k + e)) per row.
  template <class S>
  static void grad_kinetic(const parameters<S>& p, const ConstMatrixRef<S>& k, Matrix<S>& out, workspace<S>& ws) {
    TanhMap<S>::apply(k, p.U, p.e, &p.c, p.U, ws.act, out, ws.tanh);
  }
  /// Cotangent of grad V(q): accumulates into qbar and the gradients of W, b, a.
  template <class S>
  static void grad_potential_vjp(const parameters<S>& p, const ConstMatrixRef<S>& q, workspace<S>& ws,
                                 const ConstMatrixRef<S>& gbar, MatrixRef<S> qbar, parameters<S>& grad) {
    TanhMap<S>::vjp(q, ws.act, p.W, &p.a, p.W, gbar, qbar, grad.W, grad.b, &grad.a, grad.W, ws.tanh);
  }
  /// Cotangent of grad T(k): accumulates into kbar and the gradients of U, e, c.
  template <class S>
  static void grad_kinetic_vjp(const parameters<S>& p, const ConstMatrixRef<S>& k, workspace<S>& ws,
                               const ConstMatrixRef<S>& gbar, MatrixRef<S> kbar, parameters<S>& grad) {
    TanhMap<S>::vjp(k, ws.act, p.U, &p.c, p.U, gbar, kbar, grad.U, grad.e, &grad.c, grad.U, ws.tanh);
  }

  /// H(q, k) for each row: [P].
  template <class S>
  static Vector<S> energy(const parameters<S>& p, const ConstMatrixRef<S>& q, const ConstMatrixRef<S>& k) {
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

/// Ham::is_conservative, or true when Ham does not declare it: whether its two fields are the
/// gradients of a potential and a kinetic energy. Only then is a splitting of it symplectic.
template <class Ham, class = void>
struct is_conservative_field : std::true_type {};
template <class Ham>
struct is_conservative_field<Ham, std::void_t<decltype(Ham::is_conservative)>>
    : std::bool_constant<Ham::is_conservative> {};

/// The kinetic half of a unit mass: T(k) = |k|^2 / 2, grad T(k) = k, no parameters. Shared by every
/// member of the velocity family (method spec section 3c): q moves with velocity k.
struct UnitMassKinetic {
  /// grad T(k) = k.
  template <class S, class P, class W>
  static void grad_kinetic(const P&, const ConstMatrixRef<S>& k, Matrix<S>& out, W&) {
    out = k;
  }
  /// Cotangent of grad T(k) = k: kbar += gbar (no parameters).
  template <class S, class P, class W>
  static void grad_kinetic_vjp(const P&, const ConstMatrixRef<S>&, W&, const ConstMatrixRef<S>& gbar,
                               MatrixRef<S> kbar, P&) {
    kbar += gbar;
  }
  /// |k|^2 / 2 per row, [P].
  template <class S>
  static Vector<S> kinetic_energy(const ConstMatrixRef<S>& k) {
    return (S(0.5) * k.rowwise().squaredNorm()).eval();
  }
};

/// The potential of section 2 alone: V(q) = sum_j a_j log cosh(w_j . q + b_j). W: [m, d]; b, a: [m].
template <class S>
struct PotentialParameters : NamedTensors<PotentialParameters<S>> {
  Matrix<S> W;   // [m, d]
  Vector<S> b, a;  // [m]

  PotentialParameters() = default;

  /// Spec initialisation (as section 3): W ~ N(0, 1/d); b = 0; a ~ N(0, init_scale^2) (0 by default).
  PotentialParameters(const DynamicsShape& shape, Rng& rng)
      : W(shape.hidden, shape.head_dim), b(Vector<S>::Zero(shape.hidden)), a(shape.hidden) {
    rng.fill_normal(W, 1.0 / std::sqrt(static_cast<double>(shape.head_dim)));
    rng.fill_normal(a, shape.init_scale);
  }

  template <class Self, class F>
  static void fields(Self& s, F& f) {
    f("W", s.W);
    f("b", s.b);
    f("a", s.a);
  }
};

/// H(q, k) = V(q) + |k|^2 / 2 with the learned V of section 2 (tensors W, b, a): the Hamiltonian of
/// `unit-leapfrog` (method spec section 3c).
struct UnitMassHamiltonian : UnitMassKinetic {
  template <class S>
  using parameters = PotentialParameters<S>;

  template <class S>
  struct workspace {
    Matrix<S> act;  // tanh(q W^T + b) of the last potential gradient [P, m]
    TanhScratch<S> tanh;
  };

  template <class S>
  static parameters<S> make_parameters(const DynamicsShape& shape, Rng& rng) {
    return parameters<S>(shape, rng);
  }

  /// grad V(q) = W^T (a * tanh(W q + b)) per row.
  template <class S>
  static void grad_potential(const parameters<S>& p, const ConstMatrixRef<S>& q, Matrix<S>& out, workspace<S>& ws) {
    TanhMap<S>::apply(q, p.W, p.b, &p.a, p.W, ws.act, out, ws.tanh);
  }
  template <class S>
  static void grad_potential_vjp(const parameters<S>& p, const ConstMatrixRef<S>& q, workspace<S>& ws,
                                 const ConstMatrixRef<S>& gbar, MatrixRef<S> qbar, parameters<S>& grad) {
    TanhMap<S>::vjp(q, ws.act, p.W, &p.a, p.W, gbar, qbar, grad.W, grad.b, &grad.a, grad.W, ws.tanh);
  }

  /// H(q, k) for each row: [P].
  template <class S>
  static Vector<S> energy(const parameters<S>& p, const ConstMatrixRef<S>& q, const ConstMatrixRef<S>& k) {
    Vector<S> h = kinetic_energy<S>(k);
    Matrix<S> z = q * p.W.transpose();
    z.rowwise() += p.b.transpose();
    for (Index r = 0; r < q.rows(); ++r)
      for (Index j = 0; j < z.cols(); ++j) h[r] += p.a[j] * log_cosh(z(r, j));
    return h;
  }
};

/// H(q, k) = |k|^2 / 2: a free particle, no parameters. Its one flow is the drift q <- q + t k,
/// exact for any step (the Hamiltonian of `drift`, method spec section 3c).
struct FreeParticle : UnitMassKinetic {
  template <class S>
  using parameters = EmptyParameters<S>;
  template <class S>
  struct workspace {};

  template <class S>
  static parameters<S> make_parameters(const DynamicsShape&, Rng&) {
    return {};
  }
  /// grad V = 0 (a scheme made of drifts never asks for it).
  template <class S>
  static void grad_potential(const parameters<S>&, const ConstMatrixRef<S>& q, Matrix<S>& out, workspace<S>&) {
    out.setZero(q.rows(), q.cols());
  }
  template <class S>
  static void grad_potential_vjp(const parameters<S>&, const ConstMatrixRef<S>&, workspace<S>&,
                                 const ConstMatrixRef<S>&, MatrixRef<S>, parameters<S>&) {}
  template <class S>
  static Vector<S> energy(const parameters<S>&, const ConstMatrixRef<S>&, const ConstMatrixRef<S>& k) {
    return kinetic_energy<S>(k);
  }
};

}  // namespace coupledqk
