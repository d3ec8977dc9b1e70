// The fourth-order integrator from examples/ -- written by a "user" in one header -- passes the
// library's own checks and plugs into the layer unchanged.
#include <doctest/doctest.h>

#include <coupledqk/testing/gradcheck.hpp>
#include <coupledqk/testing/properties.hpp>

#include "forest_ruth.hpp"
#include "policies.hpp"

using namespace cqk_test;
namespace t = coupledqk::testing;

TEST_CASE_TEMPLATE("forest-ruth: symplectic, reversible, fourth order", I, ForestRuth<1>, ForestRuth<2>,
                   ForestRuth<3>) {
  static_assert(CheckIntegrator<I>::value);
  Rng rng(31);
  const auto p = t::random_hamiltonian<double>(4, 6, rng);
  const Matrix<double> q = random_matrix<double>(1, 4, rng), k = random_matrix<double>(1, 4, rng);
  CHECK(t::symplecticity_defect<I, double>(p, q, k, 0.9) <= 1e-10);
  CHECK(t::reversibility_error<I, double>(p, q, k, 0.9) <= 1e-13);
  const double order = t::energy_convergence_order<I, double>(p, q, k, 2.0, 2, 4);
  INFO("fitted order ", order);
  CHECK(std::abs(order - 4.0) <= 0.3);
}

TEST_CASE("forest-ruth inside the attention layer: gradients match central differences") {
  using V = Variant<ForestRuth<2>, Softmax>;
  auto layer = random_layer<double, V>(8, 2, 6, 41);
  Rng rng(42);
  const Matrix<double> x = random_matrix<double>(2 * 4, 8, rng), dy = random_matrix<double>(2 * 4, 8, rng);
  for (const auto& e : t::check_gradients(layer, x, 2, dy)) {
    INFO(e.name, ": ", e.error);
    CHECK(e.error <= 1e-6);
  }
}
