// Explicit Euler on the same learned Hamiltonian: coupled, first order, NOT symplectic.
// Per step, simultaneously:   q, k <- q + h grad T(k),  k - h grad V(q)
#pragma once

#include "policy.hpp"

namespace coupledqk {

template <int Steps>
struct Euler {
  static_assert(Steps >= 1, "Euler: the step count must be at least 1");

  static constexpr int steps = Steps;
  static constexpr int order = 1;
  static constexpr bool is_symplectic = false;
  static constexpr bool is_coupled = true;
  static constexpr bool is_reversible = false;  // its inverse is implicit
  static constexpr bool has_dynamics = true;
  static constexpr const char* name = "euler";

  template <class S>
  using parameters = HamiltonianParameters<S>;

  template <class S>
  static parameters<S> make_parameters(const DynamicsShape& shape, Rng& rng) {
    return parameters<S>(shape, rng);
  }

  // keep->states: q_0, k_0, q_1, k_1, ..., q_{N-1}, k_{N-1} (the input of every step).
  template <class S>
  static void forward(const parameters<S>& p, const Vector<S>& tau, MatrixRef<S> q, MatrixRef<S> k,
                      StateTrace<S>* keep, DynamicsMemory memory) {
    require(memory == DynamicsMemory::store,
            "Euler: DynamicsMemory::recompute needs a reversible integrator; Euler is not "
            "(use DynamicsMemory::store, or Leapfrog)");
    DynamicsScratch<S> local;
    DynamicsScratch<S>& ws = keep ? keep->scratch : local;
    ws.h = tau / S(Steps);
    if (keep) keep->states.resize(2 * Steps);
    for (int s = 0; s < Steps; ++s) {
      if (keep) {
        keep->states[2 * s] = q;  // same size step after step: no allocation
        keep->states[2 * s + 1] = k;
      }
      Hamiltonian<S>::grad_kinetic(p, k, ws.act, ws.g2, ws.tanh);
      Hamiltonian<S>::grad_potential(p, q, ws.act, ws.g, ws.tanh);
      q.array() += ws.g2.array().colwise() * ws.h.array();
      k.array() -= ws.g.array().colwise() * ws.h.array();
    }
  }

  template <class S>
  static void backward(const parameters<S>& p, const Vector<S>& tau, const StateTrace<S>& keep,
                       const ConstMatrixRef<S>&, const ConstMatrixRef<S>&, MatrixRef<S> dq,
                       MatrixRef<S> dk, parameters<S>& grad, Vector<S>& dtau, DynamicsMemory) {
    require(static_cast<int>(keep.states.size()) == 2 * Steps, "Euler::backward: the forward kept ",
            keep.states.size(), " states, expected ", 2 * Steps);
    DynamicsScratch<S>& ws = keep.scratch;
    ws.h = tau / S(Steps);
    const S inv_steps = S(1) / S(Steps);
    Matrix<S>&act_v = ws.act, &act_t = ws.act2, &gv = ws.g, &gt = ws.g2;
    for (int s = Steps - 1; s >= 0; --s) {
      const Matrix<S>& q_in = keep.states[2 * s];
      const Matrix<S>& k_in = keep.states[2 * s + 1];
      Hamiltonian<S>::grad_kinetic(p, k_in, act_t, gt, ws.tanh);
      Hamiltonian<S>::grad_potential(p, q_in, act_v, gv, ws.tanh);
      // q_out = q_in + h gt(k_in); k_out = k_in - h gv(q_in)
      dtau.noalias() += inv_steps * (row_dot<S>(dq, gt) - row_dot<S>(dk, gv));
      ws.bar = (dq.array().colwise() * ws.h.array()).matrix();    // gbar_t
      ws.bar2 = -(dk.array().colwise() * ws.h.array()).matrix();  // gbar_v
      Hamiltonian<S>::grad_kinetic_vjp(p, k_in, act_t, ws.bar, dk, grad, ws.tanh);
      Hamiltonian<S>::grad_potential_vjp(p, q_in, act_v, ws.bar2, dq, grad, ws.tanh);
    }
  }
};

}  // namespace coupledqk
