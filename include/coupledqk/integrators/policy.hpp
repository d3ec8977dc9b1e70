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
//   static constexpr const char* name;     // the integrator's name in messages, e.g. "leapfrog"
//
//   template <class S> using parameters = ...;     // named tensors, see core/parameters.hpp
//   template <class S> static parameters<S> make_parameters(const DynamicsShape&, Rng&);
//
//   // Optional: the policy's own reusable buffers (default NoScratch). They live in the trace, so
//   // a trace kept from step to step (as Attention's Context keeps one per chunk of pairs) makes
//   // the dynamics allocate nothing after the first call.
//   template <class S> using scratch = ...;
//
//   // q, k: [P, d], evolved in place. tau: [P]. `keep` (may be null when no backward follows)
//   // receives what backward needs under `memory`. Trace<S> is StateTrace<S, scratch<S>>
//   // (trace_of<Policy, S> below).
//   template <class S> static void forward(const parameters<S>&, const Vector<S>& tau,
//       MatrixRef<S> q, MatrixRef<S> k, Trace<S>* keep, DynamicsMemory memory);
//
//   // q_out, k_out: the forward's results. dq, dk: cotangents of q_out, k_out on entry, of the
//   // inputs on exit (=). grad (+=): parameter gradients. dtau (+=): [P] gradient of tau.
//   template <class S> static void backward(const parameters<S>&, const Vector<S>& tau,
//       const Trace<S>& keep, const ConstMatrixRef<S>& q_out, const ConstMatrixRef<S>& k_out,
//       MatrixRef<S> dq, MatrixRef<S> dk, parameters<S>& grad, Vector<S>& dtau,
//       DynamicsMemory memory);
//
// A symplectic splitting method (kicks and drifts of a separable Hamiltonian, integrators/
// splitting.hpp) needs only its coefficients, see examples/forest_ruth.hpp; a new Hamiltonian
// (potential/kinetic pair) is one struct, see dynamics/hamiltonian.hpp. CheckIntegrator<I> below
// turns a missing member into a readable compile error. Policies reach run-time names through a
// variant table (registry.hpp).
#pragma once

#include <type_traits>
#include <vector>

#include "../core/parameters.hpp"
#include "../core/random.hpp"
#include "../core/types.hpp"
#include "../dynamics/shape.hpp"

namespace coupledqk {

/// The default scratch of a policy that declares none.
struct NoScratch {};

/// What an integrator's forward keeps for its backward: one [P, d] state per entry, and the
/// policy's scratch (reused memory, not state: mutable, so that backward can use it too).
template <class S, class Scratch = NoScratch>
struct StateTrace {
  std::vector<Matrix<S>> states;
  mutable Scratch scratch;
};

namespace detail {
template <class I, class S, class = void>
struct scratch_of {
  using type = NoScratch;
};
template <class I, class S>
struct scratch_of<I, S, std::void_t<typename I::template scratch<S>>> {
  using type = typename I::template scratch<S>;
};
}  // namespace detail

/// The trace type of policy I at scalar S.
template <class I, class S>
using trace_of = StateTrace<S, typename detail::scratch_of<I, S>::type>;

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

// The calls of the interface above, at S = double, as the layer makes them.
template <class I, class = void>
struct has_make_parameters : std::false_type {};
template <class I>
struct has_make_parameters<
    I, std::enable_if_t<std::is_same_v<decltype(I::template make_parameters<double>(std::declval<const DynamicsShape&>(),
                                                                                      std::declval<Rng&>())),
                                       typename I::template parameters<double>>>> : std::true_type {};
template <class I, class = void>
struct has_forward : std::false_type {};
template <class I>
struct has_forward<I, std::void_t<decltype(I::template forward<double>(
                          std::declval<const typename I::template parameters<double>&>(),
                          std::declval<const Vector<double>&>(), std::declval<MatrixRef<double>>(),
                          std::declval<MatrixRef<double>>(), std::declval<trace_of<I, double>*>(),
                          DynamicsMemory::store))>> : std::true_type {};
template <class I, class = void>
struct has_backward : std::false_type {};
template <class I>
struct has_backward<I, std::void_t<decltype(I::template backward<double>(
                           std::declval<const typename I::template parameters<double>&>(),
                           std::declval<const Vector<double>&>(), std::declval<const trace_of<I, double>&>(),
                           std::declval<const ConstMatrixRef<double>&>(), std::declval<const ConstMatrixRef<double>&>(),
                           std::declval<MatrixRef<double>>(), std::declval<MatrixRef<double>>(),
                           std::declval<typename I::template parameters<double>&>(), std::declval<Vector<double>&>(),
                           DynamicsMemory::store))>> : std::true_type {};
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
  static_assert(detail::has_make_parameters<I>::value,
                "integrator policy: needs `template <class S> static parameters<S> make_parameters(const "
                "DynamicsShape&, Rng&)`");
  static_assert(detail::has_forward<I>::value,
                "integrator policy: needs `template <class S> static void forward(const parameters<S>&, const "
                "Vector<S>& tau, MatrixRef<S> q, MatrixRef<S> k, Trace<S>* keep, DynamicsMemory)` (Trace<S> = "
                "trace_of<Policy, S>; see the interface at the top of integrators/policy.hpp)");
  static_assert(detail::has_backward<I>::value,
                "integrator policy: needs `template <class S> static void backward(const parameters<S>&, const "
                "Vector<S>& tau, const Trace<S>&, const ConstMatrixRef<S>& q_out, const ConstMatrixRef<S>& k_out, "
                "MatrixRef<S> dq, MatrixRef<S> dk, parameters<S>& grad, Vector<S>& dtau, DynamicsMemory)`");
  static constexpr bool value = true;
};

}  // namespace coupledqk
