// Analytic backward vs central differences in double, for the input and every parameter, for every
// integrator x scoring x step count in tests/policies.hpp.
#include <doctest/doctest.h>

#include <coupledqk/testing/gradcheck.hpp>

#include "policies.hpp"

using namespace cqk_test;

TEST_CASE_TEMPLATE_DEFINE("layer gradients match central differences (double, rel. err <= 1e-6)", V,
                          gradients_id) {
  const Index B = 2, T = 5, D = 12, H = 4, m = 6;
  auto layer = random_layer<double, V>(D, H, m, 7);
  Rng rng(11);
  const Matrix<double> x = random_matrix<double>(B * T, D, rng);
  const Matrix<double> dy = random_matrix<double>(B * T, D, rng);
  const auto errors = testing::check_gradients(layer, x, B, dy);
  // x, wq, wk, wv, wo, then the dynamics (and rho), then the scoring's parameters
  std::size_t dynamics_tensors = 0;  // the integrator's own tensors, then dyn.rho
  typename V::integrator::template parameters<double>{}.visit([&](const char*, const auto&) { ++dynamics_tensors; });
  CHECK(errors.size() == 5 + (V::integrator::has_dynamics ? dynamics_tensors + 1 : 0) +
                             (std::is_same_v<typename V::scoring, Differential> ? 5 : 0));
  for (const auto& e : errors) {
    INFO("integrator ", V::integrator::name, "<", V::integrator::steps, ">, scoring ", V::scoring::name,
         ", memory ", to_string(V::memory), ", tensor ", e.name, ": rel. error ", e.error, ", scale ", e.scale);
    // One newton-euler step adds h f2 to every key of a head and nothing reads k' but the scoring,
    // which ignores a common shift of a head's keys: d loss / d f2 is exactly zero (spec 3c).
    if (std::is_same_v<typename V::integrator, NewtonEuler<1>> && e.name == "dyn.f2") {
      CHECK(e.scale <= 1e-8);  // both gradients are zero, to the differences' round-off
      continue;
    }
    CHECK(e.scale > 1e-8);  // a zero gradient would pass trivially
    CHECK(e.error <= 1e-6);
  }
}
TEST_CASE_TEMPLATE_APPLY(gradients_id, Variants);

// More pairs than one dynamics chunk (Attention::dynamics_chunk = 256): 2 * 40 * 4 = 320 pairs.
using MultiChunk = std::tuple<Variant<Leapfrog<3>, Softmax>, Variant<Euler<2>, Differential>,
                              Variant<Uncoupled<1>, Softmax>,
                              Variant<Leapfrog<2>, Differential, DynamicsMemory::recompute>,
                              Variant<Affine<2>, Differential, DynamicsMemory::recompute>>;
TEST_CASE_TEMPLATE_DEFINE("layer gradients across several dynamics chunks", V, chunks_id) {
  const Index B = 2, T = 40, D = 12, H = 4, m = 6;
  static_assert(B * T * H > Attention<double, Identity, Softmax>::dynamics_chunk);
  auto layer = random_layer<double, V>(D, H, m, 8);
  Rng rng(12);
  const Matrix<double> x = random_matrix<double>(B * T, D, rng), dy = random_matrix<double>(B * T, D, rng);
  for (const auto& e : testing::check_gradients(layer, x, B, dy)) {
    INFO(V::integrator::name, ", tensor ", e.name, ": rel. error ", e.error);
    CHECK(e.error <= 1e-6);
  }
}
TEST_CASE_TEMPLATE_APPLY(chunks_id, MultiChunk);
