// coupledqk quickstart: build a coupled attention layer, run forward and backward, and print the
// method's property checks (the same ones the test suite asserts).
//
//     coupledqk-quickstart [variant] [steps]      e.g.  coupledqk-quickstart diff-leapfrog 3
#include <coupledqk/coupledqk.hpp>
#include <coupledqk/testing/gradcheck.hpp>
#include <coupledqk/testing/properties.hpp>
#include <coupledqk/variants.hpp>  // the table compiled once (coupledqk::variants_layers): 35 s to build, not 180 s

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace cqk = coupledqk;

int main(int argc, char** argv) try {
  // default: the variant table's first coupled entry (leapfrog)
  const std::string variant = argc > 1 ? argv[1] : cqk::builtin_variants.first_with_dynamics();
  const int steps = argc > 2 ? std::atoi(argv[2]) : 1;

  // 1. A layer chosen at run time, the way an experiment script would.
  cqk::AttentionConfig cfg;
  cfg.dim = 256;
  cfg.heads = 4;                 // d = m = 64
  cfg.dynamics_init_scale = 0.5;  // non-zero, so the dynamics do something visible
  auto layer = cqk::make_attention<float>(variant, steps, cfg, /*seed=*/1);
  const cqk::Index B = 4, T = 128;
  cqk::Rng rng(2);
  cqk::Matrix<float> x(B * T, cfg.dim), dy(B * T, cfg.dim);
  rng.fill_normal(x, 1.0);
  rng.fill_normal(dy, 1.0);
  const auto t0 = std::chrono::steady_clock::now();
  const cqk::Matrix<float> y = layer->forward(x, B);
  const cqk::Matrix<float> dx = layer->backward(dy);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("layer '%s', %d step(s): B=%ld T=%ld D=%ld H=%ld\n", variant.c_str(), steps, (long)B, (long)T,
              (long)cfg.dim, (long)cfg.heads);
  std::printf("  parameters %ld, of which dynamics %ld (%.3f%%)\n", (long)layer->parameter_count(),
              (long)layer->dynamics_parameter_count(),
              100.0 * layer->dynamics_parameter_count() / layer->parameter_count());
  std::printf("  forward + backward: %.1f ms;  |y| = %.4f  |dx| = %.4f\n", ms, y.norm(), dx.norm());

  // 2. Property checks, compile-time policies, double precision.
  std::printf("\nproperty checks (double precision):\n");
  using Layer = cqk::Attention<double, cqk::Leapfrog<1>, cqk::Softmax>;
  cqk::AttentionConfig small;
  small.dim = 8;
  small.heads = 2;
  small.hidden = 6;
  small.init_std = 0.4;
  small.dynamics_init_scale = 0.5;
  Layer tiny(small, 3);
  cqk::Matrix<double> xs(2 * 5, 8), dys(2 * 5, 8);
  rng.fill_normal(xs, 1.0);
  rng.fill_normal(dys, 1.0);
  double worst = 0;
  for (const auto& e : cqk::testing::check_gradients(tiny, xs, 2, dys)) worst = std::max(worst, e.error);
  std::printf("  gradients vs central differences (leapfrog, all tensors): max rel. error %.2e  %s\n", worst,
              worst <= 1e-6 ? "ok" : "FAIL");

  auto p = cqk::testing::random_hamiltonian<double>(4, 6, rng);
  cqk::Matrix<double> q(1, 4), k(1, 4);
  rng.fill_normal(q, 1.0);
  rng.fill_normal(k, 1.0);
  namespace t = cqk::testing;
  const double s_lf = t::symplecticity_defect<cqk::Leapfrog<1>, double>(p, q, k, 0.7);
  const double s_eu = t::symplecticity_defect<cqk::Euler<1>, double>(p, q, k, 0.7);
  std::printf("  symplecticity ||J^T Omega J - Omega||: leapfrog %.2e (round-off)  euler %.2e (not symplectic)\n",
              s_lf, s_eu);
  std::printf("  reversibility (leapfrog, +tau then -tau): %.2e\n",
              t::reversibility_error<cqk::Leapfrog<1>, double>(p, q, k, 0.7));
  std::printf("  energy drift order: leapfrog %.2f (expect 2)  euler %.2f (expect 1)\n",
              t::energy_convergence_order<cqk::Leapfrog<1>, double>(p, q, k, 2.0),
              t::energy_convergence_order<cqk::Euler<1>, double>(p, q, k, 2.0));
  auto up = cqk::Uncoupled<1>::make_parameters<double>(cqk::DynamicsShape{4, 6, 1.0}, rng);
  std::printf("  uncoupled Jacobian off-diagonal blocks: %.1e (exactly block-diagonal)\n",
              t::coupling_strength<cqk::Uncoupled<1>, double>(up, q, k, 0.7));
  return (worst <= 1e-6 && s_lf <= 1e-10) ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "coupledqk-quickstart: error: %s\n", e.what());
  return 1;
}
