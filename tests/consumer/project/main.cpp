// A program that uses coupledqk as any other project would.
#include <coupledqk/coupledqk.hpp>

#include <cstdio>

int main() {
  coupledqk::AttentionConfig cfg;
  cfg.dim = 32;
  cfg.heads = 4;
  coupledqk::Attention<float, coupledqk::Leapfrog<2>, coupledqk::Softmax> layer(cfg, 1);
  coupledqk::Matrix<float> x = coupledqk::Matrix<float>::Ones(2 * 3, 32);
  decltype(layer)::Context ctx;
  const auto y = layer.forward(x, 2, &ctx);
  auto grad = layer.zero_gradients();
  const auto dx = layer.backward(ctx, y, grad);
  std::printf("consumer ok: coupledqk %s, y %ldx%ld, dx %ldx%ld\n", coupledqk::version, (long)y.rows(),
              (long)y.cols(), (long)dx.rows(), (long)dx.cols());
  return (y.allFinite() && dx.allFinite()) ? 0 : 1;
}
