// The fourth-order integrator from examples/ -- written by a "user" in one header -- passes the
// library's own checks and plugs into the layer unchanged.
#include <doctest/doctest.h>

#include <coupledqk/testing/gradcheck.hpp>
#include <coupledqk/model/gpt.hpp>
#include <coupledqk/testing/properties.hpp>

#include <optional>
#include <string>

#include "forest_ruth.hpp"
#include "policies.hpp"
#include "quadratic_hamiltonian.hpp"

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

TEST_CASE_TEMPLATE("a user Hamiltonian (quadratic) under leapfrog: symplectic, reversible, second order", I,
                   QuadraticLeapfrog<1>, QuadraticLeapfrog<3>) {
  static_assert(CheckIntegrator<I>::value);
  Rng rng(17);
  const auto p = t::random_hamiltonian<double>(4, 6, rng, 0.5);
  const Matrix<double> q = random_matrix<double>(1, 4, rng), k = random_matrix<double>(1, 4, rng);
  CHECK(t::symplecticity_defect<I, double>(p, q, k, 0.7) <= 1e-10);
  CHECK(t::reversibility_error<I, double>(p, q, k, 0.7) <= 1e-12);
  const double order = t::energy_convergence_order<I, double>(p, q, k, 2.0, 4, 4);
  INFO("fitted order ", order);
  CHECK(std::abs(order - 2.0) <= 0.3);
}

TEST_CASE("a user Hamiltonian inside the attention layer: gradients match central differences (store, recompute)") {
  for (DynamicsMemory memory : {DynamicsMemory::store, DynamicsMemory::recompute}) {
    auto layer = random_layer<double, Variant<QuadraticLeapfrog<2>, Softmax>>(8, 2, 6, 43);
    AttentionConfig cfg = layer.config();
    cfg.memory = memory;
    Attention<double, QuadraticLeapfrog<2>, Softmax> same(cfg, 0);
    same.params = layer.params;
    Rng rng(44);
    const Matrix<double> x = random_matrix<double>(2 * 4, 8, rng), dy = random_matrix<double>(2 * 4, 8, rng);
    for (const auto& e : t::check_gradients(same, x, 2, dy)) {
      INFO(to_string(memory), " ", e.name, ": ", e.error);
      CHECK(e.error <= 1e-6);
    }
  }
}

TEST_CASE("a consumer's own variant table: layers and models by name, without editing the library") {
  AttentionConfig cfg;
  cfg.dim = 8;
  cfg.heads = 2;
  cfg.dynamics_init_scale = 0.3;
  auto layer = make_attention<double>(forest_ruth_variants, "forest-ruth", 2, cfg, 5);
  CHECK(layer->name() == "forest-ruth");
  CHECK(layer->dynamics_parameter_count() > 0);
  Rng rng(6);
  const Matrix<double> x = random_matrix<double>(2 * 3, 8, rng);
  // the same policies compiled directly give the same numbers
  Attention<double, ForestRuth<2>, Softmax> direct(cfg, 5);
  CHECK((layer->forward(x, 2) - direct.forward(x, 2)).cwiseAbs().maxCoeff() == 0.0);

  GptConfig g;
  g.vocab = 11;
  g.dim = 8;
  g.layers = 1;
  g.heads = 2;
  g.context = 4;
  g.attention = "diff-forest-ruth";
  g.steps = 3;
  auto model = make_gpt<double>(g, 1, forest_ruth_variants);
  CHECK(model->config().attention == "diff-forest-ruth");
  CHECK(model->config().steps == 3);
  const int steps = visit_gpt(*model, [](auto& m) { return std::decay_t<decltype(m)>::Layer::integrator::steps; },
                              forest_ruth_variants);
  CHECK(steps == 3);
  // names outside the table are refused with the table's own list
  g.attention = "leapfrog";
  CHECK_THROWS_WITH_AS(make_gpt<double>(g, 1, forest_ruth_variants),
                       doctest::Contains("unknown attention variant 'leapfrog'; accepted: forest-ruth, diff-forest-ruth"),
                       coupledqk::invalid_argument);
  // a name given twice is refused
  constexpr VariantTable twice{variant<ForestRuth, Softmax>("x"), variant<Leapfrog, Softmax>("x")};
  CHECK_THROWS_WITH_AS(make_attention<double>(twice, "x", 1, cfg), doctest::Contains("'x' appears twice"),
                       coupledqk::invalid_argument);
  // the built-in table extended with the consumer's entries keeps every built-in name
  constexpr auto extended = builtin_variants.with(variant<ForestRuth, Softmax>("forest-ruth"));
  CHECK(extended.names().size() == attention_names().size() + 1);
  CHECK(extended.contains("leapfrog"));
  CHECK(extended.name_of<ForestRuth<4>, Softmax>() == std::optional<std::string>("forest-ruth"));
  CHECK(builtin_variants.name_of<ForestRuth<4>, Softmax>() == std::nullopt);
}
