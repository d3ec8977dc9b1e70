// Symplectic splitting methods for a separable Hamiltonian H(q, k) = V(q) + T(k) (by default the
// learned tanh Hamiltonian, dynamics/hamiltonian.hpp; any struct with its members works).
//
// A method is a sequence of stages applied in order within one step of size h:
//
//     kick  (coef c):  k <- k - c h grad V(q)      (exact flow of V for time c h)
//     drift (coef c):  q <- q + c h grad T(k)      (exact flow of T for time c h)
//
// Each stage is the exact flow of one part of H, hence symplectic, and so is any composition of
// them. Each stage is also trivially invertible (negate c), so the whole method can be run
// backwards: DynamicsMemory::recompute rebuilds the states from (q', k') instead of storing them.
// The same stages with a field that is not a gradient (a learned force, dynamics/force.hpp's
// NewtonField, declared is_conservative = false) are still shears: invertible and volume-preserving
// (det J = 1), but not symplectic; is_symplectic follows from the field.
//
// A scheme provides
//     static constexpr std::array<Stage, K> stages;   // one step
//     static constexpr int order;
//     static constexpr const char* name;
// and SymplecticSplitting<Scheme, N, Hamiltonian> does the rest: forward, backward, reversible
// backward.
// Adjacent stages of the same kind are merged across step boundaries, so N leapfrog steps cost
// N + 1 evaluations of grad V and N of grad T, not 3N.
#pragma once

#include <array>
#include <cstddef>
#include <vector>

#include "../dynamics/hamiltonian.hpp"
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

/// The buffers of a splitting method: sub-step sizes, the current field and its cotangent, the
/// states while walking backwards (recompute mode) and the Hamiltonian's workspace. In store mode
/// it also keeps, per stage, what the forward's gradient evaluation produced: the gradient itself
/// (stage_g, [P, d]) and the Hamiltonian's workspace of that call (stage_ham: for the tanh
/// Hamiltonian the activations tanh(W q + b) [P, m]), so that the backward does not evaluate the
/// field again (about a quarter of the dynamics' backward work for leapfrog).
template <class S, class Ham>
struct SplittingScratch {
  Vector<S> h;     // [P] sub-step sizes
  Matrix<S> g;     // [P, d] grad V or grad T of the current stage
  Matrix<S> bar;   // [P, d] its cotangent
  Matrix<S> q, k;  // [P, d] states (recompute mode)
  typename Ham::template workspace<S> ham;
  std::vector<Matrix<S>> stage_g;                             // store mode: per stage
  std::vector<typename Ham::template workspace<S>> stage_ham;  // store mode: per stage
};

namespace detail {

/// One stage, forward: the argument of its gradient is `arg` (q for a kick, k for a drift) and it
/// moves `moved` (k for a kick, q for a drift). g receives the gradient, ham the Hamiltonian's
/// workspace of that evaluation (what its vjp needs).
template <class Ham, class S, class P>
void splitting_stage(const P& p, const Stage& st, const ConstMatrixRef<S>& arg, MatrixRef<S> moved, S direction,
                     const Vector<S>& h, Matrix<S>& g, typename Ham::template workspace<S>& ham) {
  if (st.kind == StageKind::kick) {
    Ham::template grad_potential<S>(p, arg, g, ham);
    moved.array() -= (direction * S(st.coef)) * (g.array().colwise() * h.array());
  } else {
    Ham::template grad_kinetic<S>(p, arg, g, ham);
    moved.array() += (direction * S(st.coef)) * (g.array().colwise() * h.array());
  }
}

/// One stage, backward. g and ham hold grad V(arg) or grad T(arg) and its workspace; dmoved is the
/// cotangent of the moved state (unchanged by the stage), darg accumulates.
template <class Ham, class S, class P>
void splitting_stage_vjp(const P& p, const Stage& st, S inv_steps, const ConstMatrixRef<S>& arg,
                         const ConstMatrixRef<S>& dmoved, MatrixRef<S> darg, P& grad, Vector<S>& dtau,
                         const Matrix<S>& g, typename Ham::template workspace<S>& ham,
                         SplittingScratch<S, Ham>& ws) {
  // kick: moved = k - c h g  -> sign -1 ; drift: moved = q + c h g -> sign +1
  const S sign = st.kind == StageKind::kick ? S(-1) : S(1);
  const S c = sign * S(st.coef);
  dtau.noalias() += (c * inv_steps) * row_dot<S>(dmoved, g);
  ws.bar = c * (dmoved.array().colwise() * ws.h.array()).matrix();
  if (st.kind == StageKind::kick)
    Ham::template grad_potential_vjp<S>(p, arg, ham, ws.bar, darg, grad);
  else
    Ham::template grad_kinetic_vjp<S>(p, arg, ham, ws.bar, darg, grad);
}

}  // namespace detail

template <class Scheme, int Steps, class Ham = TanhHamiltonian>
struct SymplecticSplitting {
  static_assert(Steps >= 1, "SymplecticSplitting: the step count must be at least 1");

  static constexpr int steps = Steps;
  static constexpr int order = Scheme::order;
  static constexpr bool is_symplectic = is_conservative_field<Ham>::value;  // see the opening comment
  static constexpr bool is_coupled = true;
  static constexpr bool is_reversible = true;
  static constexpr bool has_dynamics = true;
  static constexpr const char* name = Scheme::name;
  static constexpr auto plan = make_splitting_plan<Steps>(Scheme::stages);
  using hamiltonian = Ham;

  /// Forward FLOPs per (q, k) pair: one field evaluation per stage of the merged plan (leapfrog:
  /// N + 1 kicks and N drifts), each at the Hamiltonian's cost. Only where the Hamiltonian gives
  /// grad_potential_flops and grad_kinetic_flops.
  template <class H = Ham>
  static constexpr auto flops_per_pair(double d, double m) -> decltype(H::grad_potential_flops(d, m) + H::grad_kinetic_flops(d, m)) {
    double f = 0;
    for (int i = 0; i < plan.size; ++i)
      f += plan.stage[i].kind == StageKind::kick ? H::grad_potential_flops(d, m) : H::grad_kinetic_flops(d, m);
    return f;
  }

  template <class S>
  using parameters = typename Ham::template parameters<S>;
  template <class S>
  using scratch = SplittingScratch<S, Ham>;

  template <class S>
  static parameters<S> make_parameters(const DynamicsShape& shape, Rng& rng) {
    return Ham::template make_parameters<S>(shape, rng);
  }

  // Scratch: keep->scratch when a trace is given (reused call after call), else a local one.
  template <class S>
  static void forward(const parameters<S>& p, const Vector<S>& tau, MatrixRef<S> q, MatrixRef<S> k,
                      StateTrace<S, scratch<S>>* keep, DynamicsMemory memory) {
    scratch<S> local;
    scratch<S>& ws = keep ? keep->scratch : local;
    ws.h = tau / S(Steps);
    const bool store = keep != nullptr && memory == DynamicsMemory::store;
    const auto stages = static_cast<std::size_t>(store ? plan.size : 0);
    if (keep) {
      keep->states.resize(stages);
      ws.stage_g.resize(stages);  // kept from call to call: no allocation once sized
      ws.stage_ham.resize(stages);
    }
    for (int i = 0; i < plan.size; ++i) {
      const Stage& st = plan.stage[i];
      const bool kick = st.kind == StageKind::kick;
      const auto si = static_cast<std::size_t>(i);
      if (store) keep->states[si] = kick ? q : k;  // same size: no allocation
      Matrix<S>& g = store ? ws.stage_g[si] : ws.g;
      auto& ham = store ? ws.stage_ham[si] : ws.ham;
      if (kick)
        detail::splitting_stage<Ham, S>(p, st, q, k, S(1), ws.h, g, ham);
      else
        detail::splitting_stage<Ham, S>(p, st, k, q, S(1), ws.h, g, ham);
    }
  }

  template <class S>
  static void backward(const parameters<S>& p, const Vector<S>& tau, const StateTrace<S, scratch<S>>& keep,
                       const ConstMatrixRef<S>& q_out, const ConstMatrixRef<S>& k_out,
                       MatrixRef<S> dq, MatrixRef<S> dk, parameters<S>& grad, Vector<S>& dtau,
                       DynamicsMemory memory) {
    scratch<S>& ws = keep.scratch;
    ws.h = tau / S(Steps);
    const S inv_steps = S(1) / S(Steps);
    const bool recompute = memory == DynamicsMemory::recompute;
    require(recompute || (static_cast<int>(keep.states.size()) == plan.size &&
                          static_cast<int>(ws.stage_g.size()) == plan.size),
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
      const auto si = static_cast<std::size_t>(i);
      if (recompute) {
        // Undo the stage: its argument is unchanged by it, so g is also what the vjp needs.
        if (kick)
          detail::splitting_stage<Ham, S>(p, st, q, k, S(-1), ws.h, ws.g, ws.ham);
        else
          detail::splitting_stage<Ham, S>(p, st, k, q, S(-1), ws.h, ws.g, ws.ham);
      }
      // Store mode: the argument, its gradient and the Hamiltonian's workspace as the forward left them.
      const ConstMatrixRef<S> arg = recompute ? (kick ? ConstMatrixRef<S>(q) : ConstMatrixRef<S>(k))
                                              : ConstMatrixRef<S>(keep.states[si]);
      const Matrix<S>& g = recompute ? ws.g : ws.stage_g[si];
      auto& ham = recompute ? ws.ham : ws.stage_ham[si];
      if (kick)
        detail::splitting_stage_vjp<Ham, S>(p, st, inv_steps, arg, dk, dq, grad, dtau, g, ham, ws);
      else
        detail::splitting_stage_vjp<Ham, S>(p, st, inv_steps, arg, dq, dk, grad, dtau, g, ham, ws);
    }
  }
};

}  // namespace coupledqk
