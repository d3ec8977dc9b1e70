// A user-defined fourth-order integrator (forest_ruth.hpp) plugged into the attention layer, and
// compared with leapfrog on the library's own checks.
#include <coupledqk/coupledqk.hpp>
#include <coupledqk/testing/properties.hpp>

#include <cstdio>

#include "forest_ruth.hpp"

namespace cqk = coupledqk;
namespace t = coupledqk::testing;

int main() {
  cqk::Rng rng(1);
  const auto p = t::random_hamiltonian<double>(8, 8, rng);
  cqk::Matrix<double> q(1, 8), k(1, 8);
  rng.fill_normal(q, 1.0);
  rng.fill_normal(k, 1.0);
  std::printf("%-12s %10s %14s %14s %12s\n", "integrator", "order", "symplectic", "reversible", "fitted order");
  std::printf("%-12s %10d %14.2e %14.2e %12.2f\n", cqk::Leapfrog<1>::name, cqk::Leapfrog<1>::order,
              t::symplecticity_defect<cqk::Leapfrog<1>, double>(p, q, k, 1.0),
              t::reversibility_error<cqk::Leapfrog<1>, double>(p, q, k, 1.0),
              t::energy_convergence_order<cqk::Leapfrog<1>, double>(p, q, k, 2.0, 2, 4));
  std::printf("%-12s %10d %14.2e %14.2e %12.2f\n", "forest-ruth", 4,
              t::symplecticity_defect<ForestRuth<1>, double>(p, q, k, 1.0),
              t::reversibility_error<ForestRuth<1>, double>(p, q, k, 1.0),
              t::energy_convergence_order<ForestRuth<1>, double>(p, q, k, 2.0, 2, 4));

  // The same integrator inside a layer: nothing in the layer changes.
  cqk::AttentionConfig cfg;
  cfg.dim = 64;
  cfg.heads = 4;
  cfg.dynamics_init_scale = 0.3;
  cfg.memory = cqk::DynamicsMemory::recompute;  // reversible, so nothing is stored
  cqk::Attention<float, ForestRuth<2>, cqk::Softmax> layer(cfg, 7);
  cqk::Matrix<float> x(2 * 32, 64);
  rng.fill_normal(x, 1.0);
  decltype(layer)::Context ctx;
  const cqk::Matrix<float> y = layer.forward(x, 2, &ctx);
  auto grad = layer.zero_gradients();
  const cqk::Matrix<float> dx = layer.backward(ctx, y, grad);
  std::size_t kept = 0;
  for (const auto& trace : ctx.dynamics) kept += trace.states.size();
  std::printf("\nforest-ruth<2> attention layer: %ld parameters, |y| = %.4f, |dx| = %.4f, states kept: %zu\n",
              (long)layer.parameter_count(), y.norm(), dx.norm(), kept);
  return 0;
}
