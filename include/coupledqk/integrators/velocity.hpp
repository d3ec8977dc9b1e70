// The velocity family (method spec section 3c): the key is the query's velocity (unit mass,
// T(k) = |k|^2 / 2), and only what acts on k is learned. Per step of size h = tau / N:
//
//     drift            q <- q + h k                                            (no force; only tau)
//     newton-euler     q, k <- q + h k, k + h F(q)                             (simultaneous)
//     newton-leapfrog  k <- k + (h/2) F(q);  q <- q + h k;  k <- k + (h/2) F(q)
//     unit-leapfrog    k <- k - (h/2) grad V(q);  q <- q + h k;  k <- k - (h/2) grad V(q)
//
// with the learned force F of dynamics/force.hpp (a policy: NewtonEuler and NewtonLeapfrog take
// another as their second parameter) and V of section 2 (dynamics/hamiltonian.hpp,
// UnitMassHamiltonian). None is a second integrator: the leapfrogs and the drift are
// SymplecticSplitting (integrators/splitting.hpp) with a unit-mass field, newton-euler is
// HamiltonianEuler (integrators/euler.hpp) with the force. Only the name, the traits that differ
// and the FLOP count are declared here. Properties:
//
//   drift            linear, exact for any N (N drifts merge into the one stage q + tau k);
//                    symplectic (the shear (q, k) -> (q + tau k, k): J^T Omega J = Omega) and
//                    reversible. Its q update reads k, its k update nothing: coupled one way.
//   newton-euler     order 1; neither symplectic nor reversible: undoing a step means solving
//                    k_old = k - h F(q - h k_old), implicit for a nonlinear F, so
//                    DynamicsMemory::recompute is refused (store only). det J != 1 in general.
//   newton-leapfrog  order 2, reversible (each stage is a shear, undone by negating h: the
//                    recompute backward walks back exactly), det J = 1 for any F; symplectic only
//                    when F is a gradient field, which a general MLP is not (is_symplectic false).
//   unit-leapfrog    symplectic, reversible, order 2 (energy error ~ h^2).
//
// At F2 = f2 = 0 (a = 0 for unit-leapfrog) every member is q' = q + tau k, k' = k; at tau = 0 the
// identity. The initial tau is AttentionConfig::init_time (1 by default), F2's init scale
// AttentionConfig::dynamics_init_scale.
//
// FLOPs per (token, head) pair (flops_per_pair below): a multiply-add counts 2; matrix-vector
// products and axpys only. One force or grad V evaluation is 4 d m, one kick or drift 2 d.
#pragma once

#include <type_traits>

#include "../dynamics/force.hpp"
#include "../dynamics/hamiltonian.hpp"
#include "euler.hpp"
#include "leapfrog.hpp"
#include "splitting.hpp"

namespace coupledqk {

/// One drift of the whole step: q <- q + h k.
struct DriftScheme {
  static constexpr std::array<Stage, 1> stages{{{StageKind::drift, 1.0}}};
  // A single drift stage is first order as a splitting of a general H; for the free particle it
  // is the exact flow (zero energy error for every h), so 1 is only a lower bound.
  static constexpr int order = 1;
  static constexpr const char* name = "drift";
};

/// Kick-drift-kick as Leapfrog, under the family's names.
struct NewtonLeapfrogScheme : LeapfrogScheme {
  static constexpr const char* name = "newton-leapfrog";
};
struct UnitLeapfrogScheme : LeapfrogScheme {
  static constexpr const char* name = "unit-leapfrog";
};

/// drift: q <- q + tau k (any N gives the same map: its N drifts merge into one stage). Only rho is
/// learned (tensor dyn.rho); it reparametrises Wq as Wq + tau Wk.
template <int Steps>
struct Drift : SymplecticSplitting<DriftScheme, Steps, FreeParticle> {
  // The shear (q, k) -> (q + tau k, k) is symplectic (FreeParticle is conservative, so the
  // splitting declares it); it is coupled one way only (q reads k; k is unchanged).
  static_assert(SymplecticSplitting<DriftScheme, Steps, FreeParticle>::is_symplectic);
  // one axpy q += tau k: 2 d (the N drifts are merged into one stage)
  static constexpr double flops_per_pair(double d, double) { return 2 * d; }
};

/// newton-euler: q, k <- q + h k, k + h F(q). Tensors dyn.F1 dyn.f1 dyn.F2 dyn.f2 (SiluForce), dyn.rho.
template <int Steps, class Force = SiluForce>
struct NewtonEuler : HamiltonianEuler<Steps, NewtonField<Force>> {
  static constexpr const char* name = "newton-euler";
  // order 1, not symplectic, not reversible: HamiltonianEuler's declarations hold (see the top)
  // N (force + 2 axpys): N (4 d m + 4 d) for SiluForce
  static constexpr double flops_per_pair(double d, double m) { return Steps * (Force::flops(d, m) + 4 * d); }
};

/// newton-leapfrog: kick-drift-kick with the force. Tensors as newton-euler.
template <int Steps, class Force = SiluForce>
struct NewtonLeapfrog : SymplecticSplitting<NewtonLeapfrogScheme, Steps, NewtonField<Force>> {
  static_assert(!SymplecticSplitting<NewtonLeapfrogScheme, Steps, NewtonField<Force>>::is_symplectic);
  // (N + 1) forces (merged half kicks) + (2N + 1) axpys: (N+1) 4 d m + (2N+1) 2 d for SiluForce
  static constexpr double flops_per_pair(double d, double m) {
    return (Steps + 1) * Force::flops(d, m) + (2 * Steps + 1) * 2 * d;
  }
};

/// unit-leapfrog: kick-drift-kick on H = V(q) + |k|^2 / 2. Tensors dyn.W dyn.b dyn.a, dyn.rho.
template <int Steps>
struct UnitLeapfrog : SymplecticSplitting<UnitLeapfrogScheme, Steps, UnitMassHamiltonian> {
  // (N + 1) grad V (4 d m each) + (2N + 1) axpys: (N+1) 4 d m + (2N+1) 2 d
  static constexpr double flops_per_pair(double d, double m) { return (Steps + 1) * 4 * d * m + (2 * Steps + 1) * 2 * d; }
};

/// The built-in members with the default force, as templates of the step count alone (what a
/// variant table takes: registry.hpp's `variant<I, Sc>` wants a `template <int> class`).
template <int Steps>
using SiluNewtonEuler = NewtonEuler<Steps>;
template <int Steps>
using SiluNewtonLeapfrog = NewtonLeapfrog<Steps>;

namespace detail {
template <class I, class = void>
struct moves_with_velocity : std::false_type {};
template <class I>
struct moves_with_velocity<I, std::void_t<typename I::hamiltonian>>
    : std::bool_constant<std::is_base_of_v<UnitMassKinetic, typename I::hamiltonian>> {};
}  // namespace detail

/// Whether policy I is of the velocity family (its field has a unit mass, grad T(k) = k): at
/// F2 = f2 = 0 (a = 0) it is the drift q + tau k, not the identity, so it does not start as
/// standard attention.
template <class I>
inline constexpr bool is_velocity_family = detail::moves_with_velocity<I>::value;

}  // namespace coupledqk
