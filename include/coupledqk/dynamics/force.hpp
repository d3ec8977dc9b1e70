// The learned force of the velocity family (method spec section 3c), and the field that puts a
// force where the splitting methods and Euler expect a Hamiltonian.
//
//     F(q) = F2 silu(F1 q + f1) + f2        F1: [m, d], f1: [m], F2: [d, m], f2: [d]
//
// shared by every head of a layer. With a unit mass the equations of motion are dq/dt = k,
// dk/dt = F(q): the key is the query's velocity. A general F is not the gradient of a potential,
// so its flow (and a splitting of it) preserves volume but not the symplectic form.
//
// A force is a policy: a struct with
//
//   template <class S> using parameters = ...;       // named tensors (names become dyn.<name>)
//   template <class S> struct workspace;             // what evaluate keeps for vjp, and buffers
//   template <class S> static parameters<S> make_parameters(const DynamicsShape&, Rng&);
//   evaluate(p, q, out, ws)                          out = F(q) [P, d], written (=)
//   vjp(p, q, ws, fbar, qbar, grad)                  given the ws of evaluate(p, q, ...) and the
//                                                    cotangent fbar [P, d] of F(q): qbar [P, d] and
//                                                    grad accumulate (+=)
//   static constexpr double flops(double d, double m);   forward FLOPs of one evaluation per row
//
// SiluForce below is the default; examples/linear_force.hpp swaps in another in one header.
#pragma once

#include <cmath>

#include "../core/small_gemm.hpp"
#include "../core/parameters.hpp"
#include "../core/random.hpp"
#include "hamiltonian.hpp"

namespace coupledqk {

template <class S>
struct SiluForceParameters : NamedTensors<SiluForceParameters<S>> {
  Matrix<S> F1;  // [m, d]
  Vector<S> f1;  // [m]
  Matrix<S> F2;  // [d, m]
  Vector<S> f2;  // [d]

  SiluForceParameters() = default;

  /// Spec initialisation: F1 ~ N(0, 1/d), f1 = 0, F2 ~ N(0, init_scale^2) (0 by default: no force
  /// at step 0, the map is then q + tau k), f2 = 0.
  SiluForceParameters(const DynamicsShape& shape, Rng& rng)
      : F1(shape.hidden, shape.head_dim), f1(Vector<S>::Zero(shape.hidden)),
        F2(shape.head_dim, shape.hidden), f2(Vector<S>::Zero(shape.head_dim)) {
    rng.fill_normal(F1, 1.0 / std::sqrt(static_cast<double>(shape.head_dim)));
    rng.fill_normal(F2, shape.init_scale);
  }

  template <class Self, class F>
  static void fields(Self& s, F& f) {
    f("F1", s.F1);
    f("f1", s.f1);
    f("F2", s.F2);
    f("f2", s.f2);
  }
};

/// F(q) = F2 silu(F1 q + f1) + f2, silu(z) = z sigmoid(z), batched over [P, d] rows.
struct SiluForce {
  template <class S>
  using parameters = SiluForceParameters<S>;

  /// z = q F1^T + f1 and sig = sigmoid(z) of the last evaluation [P, m] (what vjp needs), and the
  /// vjp's buffers.
  template <class S>
  struct workspace {
    Matrix<S> z, sig, act;  // [P, m]: pre-activation, sigmoid(z), silu(z)
    Matrix<S> zbar;         // [P, m]
  };

  template <class S>
  static parameters<S> make_parameters(const DynamicsShape& shape, Rng& rng) {
    return parameters<S>(shape, rng);
  }

  /// Two products of [P, d] x [d, m] size: 4 d m per row (the bias adds and silu are not counted).
  static constexpr double flops(double d, double m) { return 4 * d * m; }

  template <class S>
  static void evaluate(const parameters<S>& p, const ConstMatrixRef<S>& q, Matrix<S>& out, workspace<S>& ws) {
    ws.z.resize(q.rows(), p.F1.rows());
    small_gemm<S>(q, false, p.F1, true, ws.z);  // q F1^T
    ws.z.rowwise() += p.f1.transpose();
    ws.sig = (S(1) / (S(1) + (-ws.z.array()).exp())).matrix();
    ws.act = (ws.z.array() * ws.sig.array()).matrix();
    out.resize(q.rows(), p.F2.rows());
    small_gemm<S>(ws.act, false, p.F2, true, out);  // silu(z) F2^T
    out.rowwise() += p.f2.transpose();
  }

  /// silu'(z) = sig (1 + z (1 - sig)).
  template <class S>
  static void vjp(const parameters<S>& p, const ConstMatrixRef<S>& q, workspace<S>& ws,
                  const ConstMatrixRef<S>& fbar, MatrixRef<S> qbar, parameters<S>& grad) {
    small_gemm<S>(fbar, true, ws.act, false, grad.F2, S(1), true);  // dF2 += fbar^T silu(z)   [d, m]
    grad.f2.noalias() += fbar.colwise().sum().transpose();
    ws.zbar.resize(fbar.rows(), p.F2.cols());
    small_gemm<S>(fbar, false, p.F2, false, ws.zbar);  // d silu = fbar F2   [P, m]
    ws.zbar.array() *= ws.sig.array() * (S(1) + ws.z.array() * (S(1) - ws.sig.array()));
    grad.f1.noalias() += ws.zbar.colwise().sum().transpose();
    small_gemm<S>(ws.zbar, true, q, false, grad.F1, S(1), true);  // dF1 += zbar^T q   [m, d]
    small_gemm<S>(ws.zbar, false, p.F1, false, qbar, S(1), true);  // qbar += zbar F1
  }
};

/// A force in the place of a Hamiltonian (the interface of dynamics/hamiltonian.hpp), so that the
/// splitting methods and Euler integrate Newton's equations with unit mass:
///
///     "grad V"(q) = -F(q)      (a kick k <- k - c h grad V(q) is k <- k + c h F(q))
///     grad T(k)   = k
///
/// Not conservative (is_conservative = false): F need not be a gradient, so there is no energy,
/// and SymplecticSplitting of it is reversible and volume-preserving (det J = 1: each kick and
/// drift is a shear) but not symplectic.
template <class Force = SiluForce>
struct NewtonField : UnitMassKinetic {
  using force = Force;
  static constexpr bool is_conservative = false;

  template <class S>
  using parameters = typename Force::template parameters<S>;

  template <class S>
  struct workspace {
    typename Force::template workspace<S> force;
    Matrix<S> fbar;  // [P, d] cotangent of F = -(cotangent of grad V)
  };

  template <class S>
  static parameters<S> make_parameters(const DynamicsShape& shape, Rng& rng) {
    return Force::template make_parameters<S>(shape, rng);
  }

  template <class S>
  static void grad_potential(const parameters<S>& p, const ConstMatrixRef<S>& q, Matrix<S>& out, workspace<S>& ws) {
    Force::template evaluate<S>(p, q, out, ws.force);
    out = -out;
  }
  template <class S>
  static void grad_potential_vjp(const parameters<S>& p, const ConstMatrixRef<S>& q, workspace<S>& ws,
                                 const ConstMatrixRef<S>& gbar, MatrixRef<S> qbar, parameters<S>& grad) {
    ws.fbar = -gbar;
    Force::template vjp<S>(p, q, ws.force, ws.fbar, qbar, grad);
  }
};

}  // namespace coupledqk
