// A separable Hamiltonian written the way a user of coupledqk would write one: one header, no
// change to the library. Every splitting method and Euler take it in place of the learned tanh
// Hamiltonian (dynamics/hamiltonian.hpp documents the members a Hamiltonian needs):
//
//     V(q) = 1/2 sum_j a_j (w_j . q + b_j)^2       grad V(q) = W^T (a * (W q + b))
//     T(k) = 1/2 sum_j c_j (u_j . k + e_j)^2       grad T(k) = U^T (c * (U k + e))
//
// A learned quadratic form: the flow is linear in (q, k). Its tensors have the tanh Hamiltonian's
// names and shapes, so it reuses HamiltonianParameters (and its initialisation).
//
//     template <int N>
//     struct QuadraticLeapfrog : coupledqk::SymplecticSplitting<coupledqk::LeapfrogScheme, N, QuadraticHamiltonian> {};
#pragma once

#include <coupledqk/dynamics/hamiltonian.hpp>
#include <coupledqk/integrators/leapfrog.hpp>

struct QuadraticHamiltonian {
  template <class S>
  using parameters = coupledqk::HamiltonianParameters<S>;

  /// z = W q + b (or U k + e) of the last gradient call, for its vjp.
  template <class S>
  struct workspace {
    coupledqk::Matrix<S> z, s, sbar;  // [P, m]
  };

  template <class S>
  static parameters<S> make_parameters(const coupledqk::DynamicsShape& shape, coupledqk::Rng& rng) {
    return parameters<S>(shape, rng);
  }

  template <class S>
  static void grad_potential(const parameters<S>& p, const coupledqk::ConstMatrixRef<S>& q, coupledqk::Matrix<S>& out,
                             workspace<S>& ws) {
    field(p.W, p.b, p.a, q, out, ws);
  }
  template <class S>
  static void grad_kinetic(const parameters<S>& p, const coupledqk::ConstMatrixRef<S>& k, coupledqk::Matrix<S>& out,
                           workspace<S>& ws) {
    field(p.U, p.e, p.c, k, out, ws);
  }
  template <class S>
  static void grad_potential_vjp(const parameters<S>& p, const coupledqk::ConstMatrixRef<S>& q, workspace<S>& ws,
                                 const coupledqk::ConstMatrixRef<S>& gbar, coupledqk::MatrixRef<S> qbar,
                                 parameters<S>& grad) {
    field_vjp(p.W, p.a, q, ws, gbar, qbar, grad.W, grad.b, grad.a);
  }
  template <class S>
  static void grad_kinetic_vjp(const parameters<S>& p, const coupledqk::ConstMatrixRef<S>& k, workspace<S>& ws,
                               const coupledqk::ConstMatrixRef<S>& gbar, coupledqk::MatrixRef<S> kbar,
                               parameters<S>& grad) {
    field_vjp(p.U, p.c, k, ws, gbar, kbar, grad.U, grad.e, grad.c);
  }

  template <class S>
  static coupledqk::Vector<S> energy(const parameters<S>& p, const coupledqk::ConstMatrixRef<S>& q,
                                     const coupledqk::ConstMatrixRef<S>& k) {
    coupledqk::Matrix<S> zq = q * p.W.transpose(), zk = k * p.U.transpose();
    zq.rowwise() += p.b.transpose();
    zk.rowwise() += p.e.transpose();
    return (S(0.5) * ((zq.array().square().rowwise() * p.a.transpose().array()).rowwise().sum() +
                      (zk.array().square().rowwise() * p.c.transpose().array()).rowwise().sum()))
        .matrix();
  }

 private:
  // out = (scale * (x A^T + bias)) A
  template <class S>
  static void field(const coupledqk::Matrix<S>& A, const coupledqk::Vector<S>& bias, const coupledqk::Vector<S>& scale,
                    const coupledqk::ConstMatrixRef<S>& x, coupledqk::Matrix<S>& out, workspace<S>& ws) {
    ws.z.noalias() = x * A.transpose();
    ws.z.rowwise() += bias.transpose();
    ws.s = (ws.z.array().rowwise() * scale.transpose().array()).matrix();
    out.noalias() = ws.s * A;
  }
  // Given the cotangent gbar of out: accumulates xbar, dA (both uses of A), dbias, dscale.
  template <class S>
  static void field_vjp(const coupledqk::Matrix<S>& A, const coupledqk::Vector<S>& scale,
                        const coupledqk::ConstMatrixRef<S>& x, workspace<S>& ws, const coupledqk::ConstMatrixRef<S>& gbar,
                        coupledqk::MatrixRef<S> xbar, coupledqk::Matrix<S>& dA, coupledqk::Vector<S>& dbias,
                        coupledqk::Vector<S>& dscale) {
    dA.noalias() += ws.s.transpose() * gbar;           // out = s A
    ws.sbar.noalias() = gbar * A.transpose();          // [P, m]
    dscale += (ws.sbar.array() * ws.z.array()).colwise().sum().matrix().transpose();
    ws.sbar.array().rowwise() *= scale.transpose().array();  // zbar
    dbias += ws.sbar.colwise().sum().transpose();
    dA.noalias() += ws.sbar.transpose() * x;
    xbar.noalias() += ws.sbar * A;
  }
};

/// Leapfrog on the quadratic Hamiltonian: symplectic, reversible, second order.
template <int Steps>
struct QuadraticLeapfrog : coupledqk::SymplecticSplitting<coupledqk::LeapfrogScheme, Steps, QuadraticHamiltonian> {};
