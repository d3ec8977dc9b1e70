// A program that uses coupledqk as any other project would: a layer by type, and its own
// integrator (position Verlet: drift-kick-drift) registered by name in its own variant table, then
// built by name as a layer and as a whole model -- without editing the library.
#include <coupledqk/coupledqk.hpp>
#include <coupledqk/model/gpt.hpp>

#include <array>
#include <cstdio>

struct PositionVerletScheme {
  static constexpr std::array<coupledqk::Stage, 3> stages{
      {{coupledqk::StageKind::drift, 0.5}, {coupledqk::StageKind::kick, 1.0}, {coupledqk::StageKind::drift, 0.5}}};
  static constexpr int order = 2;
  static constexpr const char* name = "position-verlet";
};
template <int Steps>
struct PositionVerlet : coupledqk::SymplecticSplitting<PositionVerletScheme, Steps> {};

inline constexpr coupledqk::VariantTable my_variants{
    coupledqk::variant<PositionVerlet, coupledqk::Softmax>("position-verlet"),
    coupledqk::variant<coupledqk::Identity, coupledqk::Softmax>("standard"),
};

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

  cfg.dynamics_init_scale = 0.1;
  auto mine = coupledqk::make_attention<float>(my_variants, "position-verlet", 3, cfg, 2);
  const auto y2 = mine->forward(x, 2);
  coupledqk::GptConfig g;
  g.vocab = 16;
  g.dim = 32;
  g.layers = 1;
  g.heads = 4;
  g.context = 8;
  g.attention = "position-verlet";
  auto model = coupledqk::make_gpt<float>(g, 3, my_variants);
  const bool named = model->config().attention == "position-verlet" && mine->name() == "position-verlet";
  std::printf("consumer ok: coupledqk %s, y %ldx%ld, dx %ldx%ld; own variant '%s': %ld parameters\n",
              coupledqk::version, (long)y.rows(), (long)y.cols(), (long)dx.rows(), (long)dx.cols(),
              model->config().attention.c_str(), (long)model->parameter_report().total);
  return (y.allFinite() && dx.allFinite() && y2.allFinite() && named) ? 0 : 1;
}
