// A force written the way a user of coupledqk would write one: one header, no change to the
// library. NewtonLeapfrog and NewtonEuler take it in place of the SiLU MLP (dynamics/force.hpp
// documents the members a force needs):
//
//     F(q) = L q + l          L: [d, d], l: [d]   (tensors dyn.L, dyn.l)
//
// A linear force: the flow is linear in (q, k). It is the gradient of the potential
// V(q) = -(q^T L q / 2 + l . q) exactly when L is symmetric, and only then is newton-leapfrog with
// it symplectic (tests/test_velocity.cpp checks both cases).
//
//     template <int N>
//     using LinearNewtonLeapfrog = coupledqk::NewtonLeapfrog<N, LinearForce>;
#pragma once

#include <coupledqk/integrators/velocity.hpp>
#include <coupledqk/registry.hpp>

template <class S>
struct LinearForceParameters : coupledqk::NamedTensors<LinearForceParameters<S>> {
  coupledqk::Matrix<S> L;  // [d, d]
  coupledqk::Vector<S> l;  // [d]

  LinearForceParameters() = default;
  /// L ~ N(0, init_scale^2) (0 by default: no force at step 0), l = 0.
  LinearForceParameters(const coupledqk::DynamicsShape& shape, coupledqk::Rng& rng)
      : L(shape.head_dim, shape.head_dim), l(coupledqk::Vector<S>::Zero(shape.head_dim)) {
    rng.fill_normal(L, shape.init_scale);
  }

  template <class Self, class F>
  static void fields(Self& s, F& f) {
    f("L", s.L);
    f("l", s.l);
  }
};

struct LinearForce {
  template <class S>
  using parameters = LinearForceParameters<S>;
  template <class S>
  struct workspace {};  // linear: its vjp needs nothing from the evaluation

  template <class S>
  static parameters<S> make_parameters(const coupledqk::DynamicsShape& shape, coupledqk::Rng& rng) {
    return parameters<S>(shape, rng);
  }
  /// One [d, d] product: 2 d^2 per row.
  static constexpr double flops(double d, double) { return 2 * d * d; }

  // rows: out = q L^T + l
  template <class S>
  static void evaluate(const parameters<S>& p, const coupledqk::ConstMatrixRef<S>& q, coupledqk::Matrix<S>& out,
                       workspace<S>&) {
    out.noalias() = q * p.L.transpose();
    out.rowwise() += p.l.transpose();
  }
  template <class S>
  static void vjp(const parameters<S>& p, const coupledqk::ConstMatrixRef<S>& q, workspace<S>&,
                  const coupledqk::ConstMatrixRef<S>& fbar, coupledqk::MatrixRef<S> qbar, parameters<S>& grad) {
    grad.L.noalias() += fbar.transpose() * q;
    grad.l += fbar.colwise().sum().transpose();
    qbar.noalias() += fbar * p.L;
  }
};

template <int Steps>
using LinearNewtonLeapfrog = coupledqk::NewtonLeapfrog<Steps, LinearForce>;
template <int Steps>
using LinearNewtonEuler = coupledqk::NewtonEuler<Steps, LinearForce>;

/// The user's variant table for the swapped-in force.
inline constexpr coupledqk::VariantTable linear_force_variants{
    coupledqk::variant<LinearNewtonLeapfrog, coupledqk::Softmax>("linear-newton-leapfrog"),
    coupledqk::variant<LinearNewtonEuler, coupledqk::Softmax>("linear-newton-euler"),
};
