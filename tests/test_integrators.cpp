// Physics of the integrator policies (method spec section 5), driven by each policy's declared
// traits: symplectic ones must be symplectic to round-off, coupled non-symplectic ones measurably
// not (defect O(h^2)), uncoupled ones block-diagonal, reversible ones reversible, and the energy
// error must converge at the declared order.
#include <doctest/doctest.h>

#include <coupledqk/testing/properties.hpp>

#include "policies.hpp"

using namespace cqk_test;
namespace t = coupledqk::testing;

namespace {

constexpr Index kD = 4, kM = 6;

template <class I>
typename I::template parameters<double> physics_parameters(std::uint64_t seed) {
  Rng rng(seed);
  auto p = I::template make_parameters<double>(DynamicsShape{kD, kM, 1.0}, rng);
  perturb(p, rng, 0.1);  // non-zero biases too
  return p;
}

template <class I>
constexpr bool has_hamiltonian =
    std::is_same_v<typename I::template parameters<double>, HamiltonianParameters<double>>;

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("integrator: symplecticity, coupling and reversibility", I, physics_id) {
  CheckIntegrator<I>{};
  const auto p = physics_parameters<I>(3);
  Rng rng(5);
  const Matrix<double> q = random_matrix<double>(1, kD, rng), k = random_matrix<double>(1, kD, rng);
  const double tau = 0.7;
  INFO("integrator ", I::name, "<", I::steps, ">");

  const double defect = t::symplecticity_defect<I, double>(p, q, k, tau);
  INFO("||J^T Omega J - Omega||_F = ", defect);
  if constexpr (I::is_symplectic) {
    CHECK(defect <= 1e-10);
  } else if constexpr (I::is_coupled && !has_hamiltonian<I>) {
    // Affine coupling: a non-zero log-scale changes volume (det J != 1), so J cannot be symplectic.
    CHECK(defect > 1e-4);
  } else if constexpr (I::is_coupled) {
    // Explicit Euler: J = I + h A with A Hamiltonian, so the defect is h^2 ||A^T Omega A||: it must
    // be clearly non-zero and fall by ~4x when the step is halved.
    CHECK(defect > 1e-4);
    const double half = t::symplecticity_defect<I, double>(p, q, k, tau / 2);
    INFO("defect at tau/2 = ", half, ", ratio ", defect / half);
    CHECK(defect / half == doctest::Approx(4.0).epsilon(0.25));
  }

  const double coupling = t::coupling_strength<I, double>(p, q, k, tau);
  INFO("largest off-diagonal Jacobian entry = ", coupling);
  if constexpr (I::is_coupled)
    CHECK(coupling > 1e-3);
  else
    CHECK(coupling == 0.0);  // exactly block-diagonal

  if constexpr (I::is_reversible) {
    const double back = t::reversibility_error<I, double>(p, q, k, tau);
    INFO("reversibility error = ", back);
    CHECK(back <= 1e-13);
    // The recompute backward gives the same Jacobian as the stored one.
    const Matrix<double> Js = t::jacobian<I, double>(p, q, k, tau, DynamicsMemory::store);
    const Matrix<double> Jr = t::jacobian<I, double>(p, q, k, tau, DynamicsMemory::recompute);
    CHECK((Js - Jr).cwiseAbs().maxCoeff() <= 1e-12);
  }
}
TEST_CASE_TEMPLATE_APPLY(physics_id, Integrators);

TEST_CASE_TEMPLATE_DEFINE("integrator: energy drift converges at the declared order", I, order_id) {
  if constexpr (has_hamiltonian<I> && I::order > 0) {
    const auto p = physics_parameters<I>(8);
    Rng rng(9);
    const Matrix<double> q = random_matrix<double>(1, kD, rng), k = random_matrix<double>(1, kD, rng);
    const double order = t::energy_convergence_order<I, double>(p, q, k, 2.0, 4, 4);
    INFO("integrator ", I::name, "<", I::steps, ">: fitted order ", order, ", declared ", I::order);
    CHECK(std::abs(order - I::order) <= 0.3);
  }
}
TEST_CASE_TEMPLATE_APPLY(order_id, Integrators);

TEST_CASE("leapfrog: N steps cost N+1 potential and N kinetic gradient evaluations") {
  // Adjacent kicks are merged across step boundaries.
  auto count = [](const auto& plan) {
    int kicks = 0, drifts = 0;
    for (int i = 0; i < plan.size; ++i) (plan.stage[i].kind == StageKind::kick ? kicks : drifts)++;
    return std::pair<int, int>(kicks, drifts);
  };
  CHECK(count(Leapfrog<1>::plan) == std::pair<int, int>(2, 1));
  CHECK(count(Leapfrog<3>::plan) == std::pair<int, int>(4, 3));
  CHECK(count(Leapfrog<7>::plan) == std::pair<int, int>(8, 7));
  CHECK(Leapfrog<3>::plan.stage[2].coef == 1.0);  // two half kicks merged
}

TEST_CASE("leapfrog with more steps is closer to the exact flow") {
  // The end point of N steps converges to the exact flow at order 2: halving h quarters the error.
  const auto p = physics_parameters<Leapfrog<1>>(21);
  Rng rng(22);
  const Matrix<double> q0 = random_matrix<double>(1, kD, rng), k0 = random_matrix<double>(1, kD, rng);
  auto end = [&](int repeats, Matrix<double>& q, Matrix<double>& k) {
    q = q0;
    k = k0;
    for (int r = 0; r < repeats; ++r) t::flow<Leapfrog<1>, double>(p, 1.0 / repeats, q, k);
  };
  Matrix<double> qr, kr, q1, k1, q2, k2;
  end(4096, qr, kr);  // reference
  end(16, q1, k1);
  end(32, q2, k2);
  const double e1 = std::max((q1 - qr).norm(), (k1 - kr).norm());
  const double e2 = std::max((q2 - qr).norm(), (k2 - kr).norm());
  INFO("errors ", e1, " ", e2);
  CHECK(e1 / e2 == doctest::Approx(4.0).epsilon(0.1));
}
