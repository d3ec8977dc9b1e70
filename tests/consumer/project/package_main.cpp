// The consumer of an unpacked package (tests/consumer/run_consumer.cmake, MODE=package): one layer
// by type, forward and backward, built through find_package and through pkg-config alone.
#include <coupledqk/coupledqk.hpp>

#include <cstdio>
#include <cstring>

int main() {
  coupledqk::AttentionConfig cfg;
  cfg.dim = 16;
  cfg.heads = 4;
  cfg.dynamics_init_scale = 0.1;
  coupledqk::Attention<double, coupledqk::Leapfrog<2>, coupledqk::Softmax> layer(cfg, 1);
  const coupledqk::Matrix<double> x = coupledqk::Matrix<double>::Random(2 * 5, 16);
  decltype(layer)::Context ctx;
  const auto y = layer.forward(x, 2, &ctx);
  auto grad = layer.zero_gradients();
  const auto dx = layer.backward(ctx, y, grad);
  const bool version_ok = std::strcmp(coupledqk::version, COUPLEDQK_EXPECTED_VERSION) == 0;
  std::printf("package consumer ok: coupledqk %s, y %ldx%ld, |dx| %.3g\n", coupledqk::version, (long)y.rows(),
              (long)y.cols(), dx.norm());
  return (y.allFinite() && dx.allFinite() && dx.norm() > 0 && version_ok) ? 0 : 1;
}
