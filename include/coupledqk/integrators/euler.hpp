// Explicit Euler on a separable Hamiltonian (by default the learned tanh Hamiltonian): coupled,
// first order, NOT symplectic. Per step, simultaneously:
//
//     q, k <- q + h grad T(k),  k - h grad V(q)
#pragma once

#include "../dynamics/hamiltonian.hpp"
#include "policy.hpp"

namespace coupledqk {

/// The buffers of explicit Euler: sub-step sizes, both fields and their cotangents, and one
/// Hamiltonian workspace per field (the backward needs both activations at once).
template <class S, class Ham>
struct EulerScratch {
  Vector<S> h;               // [P] sub-step sizes
  Matrix<S> gv, gt;          // [P, d] grad V(q), grad T(k)
  Matrix<S> bar_v, bar_t;    // [P, d] their cotangents
  typename Ham::template workspace<S> potential, kinetic;
};

template <int Steps, class Ham = TanhHamiltonian>
struct HamiltonianEuler {
  static_assert(Steps >= 1, "Euler: the step count must be at least 1");

  static constexpr int steps = Steps;
  static constexpr int order = 1;
  static constexpr bool is_symplectic = false;
  static constexpr bool is_coupled = true;
  static constexpr bool is_reversible = false;  // its inverse is implicit
  static constexpr bool has_dynamics = true;
  static constexpr const char* name = "euler";
  using hamiltonian = Ham;

  /// Forward FLOPs per (q, k) pair: both fields once per step, N (grad V + grad T).
  template <class H = Ham>
  static constexpr auto flops_per_pair(double d, double m) -> decltype(H::grad_potential_flops(d, m) + H::grad_kinetic_flops(d, m)) {
    return Steps * (H::grad_potential_flops(d, m) + H::grad_kinetic_flops(d, m));
  }

  template <class S>
  using parameters = typename Ham::template parameters<S>;
  template <class S>
  using scratch = EulerScratch<S, Ham>;

  template <class S>
  static parameters<S> make_parameters(const DynamicsShape& shape, Rng& rng) {
    return Ham::template make_parameters<S>(shape, rng);
  }

  // keep->states: q_0, k_0, q_1, k_1, ..., q_{N-1}, k_{N-1} (the input of every step).
  template <class S>
  static void forward(const parameters<S>& p, const Vector<S>& tau, MatrixRef<S> q, MatrixRef<S> k,
                      StateTrace<S, scratch<S>>* keep, DynamicsMemory memory) {
    require(memory == DynamicsMemory::store,
            "Euler: DynamicsMemory::recompute needs a reversible integrator; Euler is not "
            "(use DynamicsMemory::store, or Leapfrog)");
    scratch<S> local;
    scratch<S>& ws = keep ? keep->scratch : local;
    ws.h = tau / S(Steps);
    if (keep) keep->states.resize(2 * Steps);
    for (int s = 0; s < Steps; ++s) {
      if (keep) {
        keep->states[2 * s] = q;  // same size step after step: no allocation
        keep->states[2 * s + 1] = k;
      }
      Ham::template grad_kinetic<S>(p, k, ws.gt, ws.kinetic);
      Ham::template grad_potential<S>(p, q, ws.gv, ws.potential);
      q.array() += ws.gt.array().colwise() * ws.h.array();
      k.array() -= ws.gv.array().colwise() * ws.h.array();
    }
  }

  template <class S>
  static void backward(const parameters<S>& p, const Vector<S>& tau, const StateTrace<S, scratch<S>>& keep,
                       const ConstMatrixRef<S>&, const ConstMatrixRef<S>&, MatrixRef<S> dq,
                       MatrixRef<S> dk, parameters<S>& grad, Vector<S>& dtau, DynamicsMemory) {
    require(static_cast<int>(keep.states.size()) == 2 * Steps, "Euler::backward: the forward kept ",
            keep.states.size(), " states, expected ", 2 * Steps);
    scratch<S>& ws = keep.scratch;
    ws.h = tau / S(Steps);
    const S inv_steps = S(1) / S(Steps);
    for (int s = Steps - 1; s >= 0; --s) {
      const Matrix<S>& q_in = keep.states[2 * s];
      const Matrix<S>& k_in = keep.states[2 * s + 1];
      Ham::template grad_kinetic<S>(p, k_in, ws.gt, ws.kinetic);
      Ham::template grad_potential<S>(p, q_in, ws.gv, ws.potential);
      // q_out = q_in + h gt(k_in); k_out = k_in - h gv(q_in)
      dtau.noalias() += inv_steps * (row_dot<S>(dq, ws.gt) - row_dot<S>(dk, ws.gv));
      ws.bar_t = (dq.array().colwise() * ws.h.array()).matrix();
      ws.bar_v = -(dk.array().colwise() * ws.h.array()).matrix();
      Ham::template grad_kinetic_vjp<S>(p, k_in, ws.kinetic, ws.bar_t, dk, grad);
      Ham::template grad_potential_vjp<S>(p, q_in, ws.potential, ws.bar_v, dq, grad);
    }
  }
};

/// Euler on the learned tanh Hamiltonian (the paper's non-symplectic integrator).
template <int Steps>
struct Euler : HamiltonianEuler<Steps, TanhHamiltonian> {};

}  // namespace coupledqk
