// Symplectic splitting methods for the separable Hamiltonian H(q, k) = V(q) + T(k).
//
// A method is a sequence of stages applied in order within one step of size h:
//
//     kick  (coef c):  k <- k - c h grad V(q)      (exact flow of V for time c h)
//     drift (coef c):  q <- q + c h grad T(k)      (exact flow of T for time c h)
//
// Each stage is the exact flow of one part of H, hence symplectic, and so is any composition of
// them. Each stage is also trivially invertible (negate c), so the whole method can be run
// backwards: DynamicsMemory::recompute rebuilds the states from (q', k') instead of storing them.
//
// A scheme provides
//     static constexpr std::array<Stage, K> stages;   // one step
//     static constexpr int order;
//     static constexpr const char* name;
// and SymplecticSplitting<Scheme, N> does the rest: forward, backward, reversible backward.
// Adjacent stages of the same kind are merged across step boundaries, so N leapfrog steps cost
// N + 1 evaluations of grad V and N of grad T, not 3N.
#pragma once

#include <array>
#include <cstddef>

#include "policy.hpp"

namespace coupledqk {

enum class StageKind { kick, drift };

struct Stage {
  StageKind kind;
  double coef;
};

/// The stages of N steps of a scheme, adjacent stages of one kind merged. Coefficients are in
/// units of the sub-step h = tau / N.
template <std::size_t K, int N>
struct SplittingPlan {
  std::array<Stage, K * N> stage{};
  int size = 0;
};

template <int N, std::size_t K>
constexpr SplittingPlan<K, N> make_splitting_plan(const std::array<Stage, K>& one_step) {
  SplittingPlan<K, N> plan{};
  for (int s = 0; s < N; ++s)
    for (std::size_t i = 0; i < K; ++i) {
      if (plan.size > 0 && plan.stage[plan.size - 1].kind == one_step[i].kind)
        plan.stage[plan.size - 1].coef += one_step[i].coef;
      else
        plan.stage[plan.size++] = one_step[i];
    }
  return plan;
}

namespace detail {

/// One stage, forward: the argument of its gradient is `arg` (q for a kick, k for a drift) and it
/// moves `moved` (k for a kick, q for a drift).
template <class S>
void splitting_stage(const HamiltonianParameters<S>& p, const Stage& st, const Vector<S>& h,
                     const ConstMatrixRef<S>& arg, MatrixRef<S> moved, S direction,
                     Matrix<S>& act, Matrix<S>& g, TanhScratch<S>& ws) {
  if (st.kind == StageKind::kick) {
    Hamiltonian<S>::grad_potential(p, arg, act, g, ws);
    moved.array() -= (direction * S(st.coef)) * (g.array().colwise() * h.array());
  } else {
    Hamiltonian<S>::grad_kinetic(p, arg, act, g, ws);
    moved.array() += (direction * S(st.coef)) * (g.array().colwise() * h.array());
  }
}

/// One stage, backward. `g`, `act` are grad V(arg) or grad T(arg) and its activations; dmoved is the
/// cotangent of the moved state (unchanged by the stage), darg accumulates. gbar: scratch.
template <class S>
void splitting_stage_vjp(const HamiltonianParameters<S>& p, const Stage& st, const Vector<S>& h,
                         S inv_steps, const ConstMatrixRef<S>& arg, const Matrix<S>& act,
                         const Matrix<S>& g, const ConstMatrixRef<S>& dmoved, MatrixRef<S> darg,
                         HamiltonianParameters<S>& grad, Vector<S>& dtau, Matrix<S>& gbar,
                         TanhScratch<S>& ws) {
  // kick: moved = k - c h g  -> sign -1 ; drift: moved = q + c h g -> sign +1
  const S sign = st.kind == StageKind::kick ? S(-1) : S(1);
  const S c = sign * S(st.coef);
  dtau.noalias() += (c * inv_steps) * row_dot<S>(dmoved, g);
  gbar = c * (dmoved.array().colwise() * h.array()).matrix();
  if (st.kind == StageKind::kick)
    Hamiltonian<S>::grad_potential_vjp(p, arg, act, gbar, darg, grad, ws);
  else
    Hamiltonian<S>::grad_kinetic_vjp(p, arg, act, gbar, darg, grad, ws);
}

}  // namespace detail

template <class Scheme, int Steps>
struct SymplecticSplitting {
  static_assert(Steps >= 1, "SymplecticSplitting: the step count must be at least 1");

  static constexpr int steps = Steps;
  static constexpr int order = Scheme::order;
  static constexpr bool is_symplectic = true;
  static constexpr bool is_coupled = true;
  static constexpr bool is_reversible = true;
  static constexpr bool has_dynamics = true;
  static constexpr const char* name = Scheme::name;
  static constexpr auto plan = make_splitting_plan<Steps>(Scheme::stages);

  template <class S>
  using parameters = HamiltonianParameters<S>;

  template <class S>
  static parameters<S> make_parameters(const DynamicsShape& shape, Rng& rng) {
    return parameters<S>(shape, rng);
  }

  // Scratch: keep->scratch when a trace is given (reused call after call), else a local one.
  template <class S>
  static void forward(const parameters<S>& p, const Vector<S>& tau, MatrixRef<S> q, MatrixRef<S> k,
                      StateTrace<S>* keep, DynamicsMemory memory) {
    DynamicsScratch<S> local;
    DynamicsScratch<S>& ws = keep ? keep->scratch : local;
    ws.h = tau / S(Steps);
    const bool store = keep != nullptr && memory == DynamicsMemory::store;
    if (keep) keep->states.resize(store ? static_cast<std::size_t>(plan.size) : 0);
    for (int i = 0; i < plan.size; ++i) {
      const Stage& st = plan.stage[i];
      const bool kick = st.kind == StageKind::kick;
      if (store) keep->states[static_cast<std::size_t>(i)] = kick ? q : k;  // same size: no allocation
      if (kick)
        detail::splitting_stage<S>(p, st, ws.h, q, k, S(1), ws.act, ws.g, ws.tanh);
      else
        detail::splitting_stage<S>(p, st, ws.h, k, q, S(1), ws.act, ws.g, ws.tanh);
    }
  }

  template <class S>
  static void backward(const parameters<S>& p, const Vector<S>& tau, const StateTrace<S>& keep,
                       const ConstMatrixRef<S>& q_out, const ConstMatrixRef<S>& k_out,
                       MatrixRef<S> dq, MatrixRef<S> dk, parameters<S>& grad, Vector<S>& dtau,
                       DynamicsMemory memory) {
    DynamicsScratch<S>& ws = keep.scratch;
    ws.h = tau / S(Steps);
    const S inv_steps = S(1) / S(Steps);
    const bool recompute = memory == DynamicsMemory::recompute;
    require(recompute || static_cast<int>(keep.states.size()) == plan.size,
            "SymplecticSplitting::backward: the forward kept ", keep.states.size(),
            " states, expected ", plan.size, " (was forward run with a trace in store mode?)");
    Matrix<S>&q = ws.q, &k = ws.k;  // current states while walking backwards (recompute mode only)
    if (recompute) {
      q = q_out;
      k = k_out;
    }
    for (int i = plan.size - 1; i >= 0; --i) {
      const Stage& st = plan.stage[i];
      const bool kick = st.kind == StageKind::kick;
      if (recompute) {
        // Undo the stage: its argument is unchanged by it, so g is also what the vjp needs.
        if (kick)
          detail::splitting_stage<S>(p, st, ws.h, q, k, S(-1), ws.act, ws.g, ws.tanh);
        else
          detail::splitting_stage<S>(p, st, ws.h, k, q, S(-1), ws.act, ws.g, ws.tanh);
      } else {
        const Matrix<S>& arg = keep.states[static_cast<std::size_t>(i)];
        if (kick)
          Hamiltonian<S>::grad_potential(p, arg, ws.act, ws.g, ws.tanh);
        else
          Hamiltonian<S>::grad_kinetic(p, arg, ws.act, ws.g, ws.tanh);
      }
      const ConstMatrixRef<S> arg = recompute ? (kick ? ConstMatrixRef<S>(q) : ConstMatrixRef<S>(k))
                                              : ConstMatrixRef<S>(keep.states[static_cast<std::size_t>(i)]);
      if (kick)
        detail::splitting_stage_vjp<S>(p, st, ws.h, inv_steps, arg, ws.act, ws.g, dk, dq, grad, dtau, ws.bar,
                                       ws.tanh);
      else
        detail::splitting_stage_vjp<S>(p, st, ws.h, inv_steps, arg, ws.act, ws.g, dq, dk, grad, dtau, ws.bar,
                                       ws.tanh);
    }
  }
};

}  // namespace coupledqk
