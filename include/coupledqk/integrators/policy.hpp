// The integrator policy interface.
//
// An integrator evolves every (query, key) pair of a layer -- one pair per row of two [P, d]
// matrices q and k -- over the integration time tau (one value per row: the row's head's tau_h),
// in `steps` sub-steps of size h = tau / steps. A policy is a struct with:
//
//   static constexpr int  steps;           // N >= 1, fixed at compile time
//   static constexpr int  order;           // convergence order of the energy error (0: not a flow)
//   static constexpr bool is_symplectic;   // J^T Omega J = Omega to round-off
//   static constexpr bool is_coupled;      // the q update reads k and the k update reads q
//   static constexpr bool is_reversible;   // supports DynamicsMemory::recompute
//   static constexpr bool has_dynamics;    // false only for Identity: no parameters, no tau
//   static constexpr const char* name;     // run-time name, e.g. "leapfrog"
//
//   template <class S> using parameters = ...;     // named tensors, see core/parameters.hpp
//   template <class S> static parameters<S> make_parameters(const DynamicsShape&, Rng&);
//
//   // q, k: [P, d], evolved in place. tau: [P]. `keep` (may be null when no backward follows)
//   // receives what backward needs under `memory`; its `scratch` (DynamicsScratch) is memory the
//   // integrator may reuse in forward and backward, so that a trace kept from step to step makes
//   // the dynamics allocate nothing (optional for a user-written policy).
//   template <class S> static void forward(const parameters<S>&, const Vector<S>& tau,
//       MatrixRef<S> q, MatrixRef<S> k, StateTrace<S>* keep, DynamicsMemory memory);
//
//   // q_out, k_out: the forward's results. dq, dk: cotangents of q_out, k_out on entry, of the
//   // inputs on exit (=). grad (+=): parameter gradients. dtau (+=): [P] gradient of tau.
//   template <class S> static void backward(const parameters<S>&, const Vector<S>& tau,
//       const StateTrace<S>& keep, const ConstMatrixRef<S>& q_out, const ConstMatrixRef<S>& k_out,
//       MatrixRef<S> dq, MatrixRef<S> dk, parameters<S>& grad, Vector<S>& dtau,
//       DynamicsMemory memory);
//
// A symplectic splitting method (kicks and drifts of the Hamiltonian in integrators/splitting.hpp)
// needs only its coefficients; see examples/forest_ruth.hpp. CheckIntegrator<I> below turns a
// missing member into a readable compile error.
#pragma once

#include <type_traits>
#include <vector>

#include "../core/parameters.hpp"
#include "../core/random.hpp"
#include "../core/types.hpp"
#include "../dynamics/hamiltonian.hpp"

namespace coupledqk {

/// Buffers an integrator may use freely inside forward and backward. They live in the StateTrace,
/// so a trace kept from one step to the next (as Attention's Context keeps one per chunk of pairs)
/// makes the dynamics allocate nothing after the first step.
template <class S>
struct DynamicsScratch {
  Vector<S> h;                            // [P] sub-step sizes
  Matrix<S> act, act2, g, g2, bar, bar2;  // [P, m] activations, [P, d] fields and cotangents
  Matrix<S> q, k;                         // [P, d] states (recompute mode)
  Matrix<S> w1, w2, dw1, dw2;             // weight-shaped temporaries
  TanhScratch<S> tanh;
};

/// What an integrator's forward keeps for its backward: one [P, d] state per entry. `scratch` is
/// not part of what is kept: it is reused memory (mutable, so that backward can use it too).
template <class S>
struct StateTrace {
  std::vector<Matrix<S>> states;
  mutable DynamicsScratch<S> scratch;
};

/// Scales row r of m by s[r].
template <class S>
auto row_scaled(const Matrix<S>& m, const Vector<S>& s) {
  return (m.array().colwise() * s.array()).matrix();
}

/// Per-row dot products: out[r] = a.row(r) . b.row(r). An expression (nothing is allocated), to be
/// used while a and b are alive.
template <class S, class A, class B>
auto row_dot(const A& a, const B& b) {
  return (a.array() * b.array()).rowwise().sum().matrix();
}

namespace detail {
template <class I, class = void>
struct has_parameters : std::false_type {};
template <class I>
struct has_parameters<I, std::void_t<typename I::template parameters<double>>> : std::true_type {};
}  // namespace detail

/// Compile-time check of the interface above; instantiate as `CheckIntegrator<MyPolicy>{}`
/// or use `static_assert(CheckIntegrator<MyPolicy>::value)`.
template <class I>
struct CheckIntegrator {
  static_assert(std::is_integral_v<decltype(I::steps)>,
                "integrator policy: needs `static constexpr int steps` (the sub-step count N)");
  static_assert(I::steps >= 1, "integrator policy: steps must be at least 1");
  static_assert(std::is_integral_v<decltype(I::order)>,
                "integrator policy: needs `static constexpr int order`");
  static_assert(std::is_same_v<std::remove_cv_t<decltype(I::is_symplectic)>, bool>,
                "integrator policy: needs `static constexpr bool is_symplectic`");
  static_assert(std::is_same_v<std::remove_cv_t<decltype(I::is_coupled)>, bool>,
                "integrator policy: needs `static constexpr bool is_coupled`");
  static_assert(std::is_same_v<std::remove_cv_t<decltype(I::is_reversible)>, bool>,
                "integrator policy: needs `static constexpr bool is_reversible`");
  static_assert(std::is_same_v<std::remove_cv_t<decltype(I::has_dynamics)>, bool>,
                "integrator policy: needs `static constexpr bool has_dynamics`");
  static_assert(std::is_convertible_v<decltype(I::name), const char*>,
                "integrator policy: needs `static constexpr const char* name`");
  static_assert(detail::has_parameters<I>::value,
                "integrator policy: needs `template <class S> using parameters = ...`");
  static constexpr bool value = true;
};

}  // namespace coupledqk
