// The GPT: whole-model gradients against central differences (double), names and counts, float
// against double, causality, and every configuration error.
#include <doctest/doctest.h>

#include <limits>
#include <tuple>

// make_gpt<float> by name through the compiled table (this test links coupledqk::variants_models)
#include <coupledqk/variants.hpp>

#include "../support/variant.hpp"
#include "helpers.hpp"

using namespace cqk_ad_test;

namespace {

GptConfig tiny(const std::string& attention, int steps = 1) {
  GptConfig c;
  c.vocab = 11;
  c.dim = 8;
  c.layers = 2;
  c.heads = 2;
  c.context = 5;
  c.attention = attention;
  c.steps = steps;
  c.dynamics_init_scale = 0.5;
  return c;
}

using cqk_test::Variant;  // support/variant.hpp
/// The double models these tests use, by type. make_gpt<double> by name would compile every entry
/// of the built-in table at double into this file, the largest compile of the project's build
/// (issue 26; docs/design.md); make_gpt by name is checked at float through the compiled table
/// (variants.hpp) below, the configuration errors included.
using DoubleModels =
    std::tuple<Variant<Identity, Softmax>, Variant<Leapfrog<1>, Softmax>, Variant<Leapfrog<2>, Softmax>,
               Variant<Leapfrog<3>, Softmax>, Variant<Euler<1>, Softmax>, Variant<Uncoupled<3>, Softmax>,
               Variant<Leapfrog<1>, Differential>, Variant<Leapfrog<2>, Differential>,
               Variant<Leapfrog<3>, Differential>, Variant<Euler<1>, Differential>>;

/// The Gpt<double, I, Sc> of DoubleModels that the built-in table names config.attention with
/// config.steps steps (what make_gpt<double>(config, seed) builds).
std::unique_ptr<AnyGpt<double>> make_double_gpt(const GptConfig& config, std::uint64_t seed) {
  std::unique_ptr<AnyGpt<double>> out;
  auto consider = [&](auto policies) {
    using I = typename decltype(policies)::integrator;
    using Sc = typename decltype(policies)::scoring;
    const auto name = builtin_variants.name_of<I, Sc>();
    bool steps_match = true;
    if constexpr (I::has_dynamics) steps_match = I::steps == config.steps;
    if (!out && name && *name == config.attention && steps_match)
      out = std::make_unique<Gpt<double, I, Sc>>(config, seed, config.attention);
  };
  std::apply([&](auto... p) { (consider(p), ...); }, DoubleModels{});
  REQUIRE_MESSAGE(out != nullptr, "'", config.attention, "' with ", config.steps, " steps is not in DoubleModels");
  return out;
}

/// Central differences of evaluate() against loss()'s gradients, every parameter tensor.
void check_model_gradients(const GptConfig& cfg) {
  const Index B = 2, T = cfg.context;
  auto model = make_double_gpt(cfg, 21);
  // move every parameter off its initial value (LayerNorm gains 1, biases 0, ...) so that no
  // gradient is special
  Rng rng(22);
  for (auto& v : model->parameters())
    for (Index i = 0; i < v.size(); ++i) v.data[i] += 0.2 * rng.normal();
  const auto tokens = random_ids(B * T, cfg.vocab, rng), targets = random_ids(B * T, cfg.vocab, rng);
  Tape<double> tape;
  model->zero_grad();
  const double l0 = model->loss(tape, tokens, targets, B);
  CHECK(l0 == model->evaluate(tape, tokens, targets, B));  // the same forward, bit for bit
  const auto params = model->parameters();
  const auto grads = model->gradients();
  REQUIRE(params.size() == grads.size());
  // eps 1e-5: with 1e-6 the round-off of the loss (~2.4 in double) already shows in the smallest
  // gradients (scale ~3e-4, rel. error ~1e-6); with 1e-5 the worst tensor is at ~1e-7.
  const double eps = 1e-5;
  double worst = 0;
  for (std::size_t k = 0; k < params.size(); ++k) {
    Vector<double> numeric(params[k].size());
    for (Index i = 0; i < params[k].size(); ++i) {
      double& w = params[k].data[i];
      const double v = w;
      w = v + eps;
      const double lp = model->evaluate(tape, tokens, targets, B);
      w = v - eps;
      const double lm = model->evaluate(tape, tokens, targets, B);
      w = v;
      numeric[i] = (lp - lm) / (2 * eps);
    }
    const Eigen::Map<const Vector<double>> analytic(grads[k].data, grads[k].size());
    const double err = testing::max_relative_error(analytic, numeric);
    INFO(cfg.attention, " <", cfg.steps, ">, ", params[k].name, ": rel. error ", err, ", scale ",
         numeric.cwiseAbs().maxCoeff());
    CHECK(numeric.cwiseAbs().maxCoeff() > 1e-8);
    CHECK(err <= 1e-6);
    worst = std::max(worst, err);
  }
  MESSAGE(cfg.attention, " <", cfg.steps, ">: worst rel. error ", worst, " over ", params.size(), " tensors");
}

}  // namespace

TEST_CASE("whole-model gradients match central differences: standard") { check_model_gradients(tiny("standard")); }
TEST_CASE("whole-model gradients match central differences: leapfrog, non-zero dynamics") {
  check_model_gradients(tiny("leapfrog", 2));
}
TEST_CASE("whole-model gradients match central differences: diff-euler and uncoupled") {
  check_model_gradients(tiny("diff-euler", 1));
  check_model_gradients(tiny("uncoupled", 3));
}

TEST_CASE("gradients accumulate across calls of loss() until zero_grad()") {
  auto model = make_double_gpt(tiny("leapfrog"), 3);
  Rng rng(4);
  const auto tokens = random_ids(10, 11, rng), targets = random_ids(10, 11, rng);
  Tape<double> tape;
  model->zero_grad();
  model->loss(tape, tokens, targets, 2);
  const auto once = snapshot(model->gradients());
  model->loss(tape, tokens, targets, 2);
  const auto twice = snapshot(model->gradients());
  for (std::size_t k = 0; k < once.size(); ++k)
    for (std::size_t i = 0; i < once[k].size(); ++i)
      CHECK(std::abs(twice[k][i] - 2 * once[k][i]) <= 1e-12 * std::abs(once[k][i]) + 1e-300);
  model->zero_grad();
  for (const auto& g : snapshot(model->gradients()))
    for (double v : g) CHECK(v == 0.0);
}

TEST_CASE("parameter names, order and shapes; gradients mirror them") {
  auto model = make_double_gpt(tiny("diff-leapfrog", 3), 1);
  const auto p = model->parameters(), g = model->gradients();
  std::vector<std::string> names;
  for (const auto& v : p) names.push_back(v.name);
  const std::vector<std::string> block = {
      "ln1.g", "ln1.b", "attn.wq", "attn.wk", "attn.wv", "attn.wo", "attn.dyn.W", "attn.dyn.U", "attn.dyn.b",
      "attn.dyn.a", "attn.dyn.e", "attn.dyn.c", "attn.dyn.rho", "attn.lq1", "attn.lk1", "attn.lq2", "attn.lk2",
      "attn.subln", "ln2.g", "ln2.b", "mlp.fc.w", "mlp.fc.b", "mlp.proj.w", "mlp.proj.b"};
  std::vector<std::string> expected{"wte", "wpe"};
  for (int l = 0; l < 2; ++l)
    for (const auto& n : block) expected.push_back("h." + std::to_string(l) + "." + n);
  expected.push_back("ln_f.g");
  expected.push_back("ln_f.b");
  CHECK(names == expected);
  REQUIRE(g.size() == p.size());
  for (std::size_t k = 0; k < p.size(); ++k) {
    CHECK(g[k].name == p[k].name);
    CHECK(g[k].shape == p[k].shape);
  }
  CHECK(p[0].shape == std::vector<Index>{11, 8});
  CHECK(p[1].shape == std::vector<Index>{5, 8});
  CHECK(p[22].name == "h.0.mlp.fc.w");
  CHECK(p[22].shape == std::vector<Index>{8, 32});
  CHECK(p[24].shape == std::vector<Index>{32, 8});
}

TEST_CASE("parameter report: total and dynamics share (the spec's 67,648 at D=512, H=8, L=8)") {
  GptConfig c;
  c.vocab = 256;
  c.dim = 512;
  c.layers = 8;
  c.heads = 8;
  c.context = 16;
  c.attention = "leapfrog";
  const auto r = Gpt<float, Leapfrog<1>, Softmax>(c, 0).parameter_report();
  CHECK(r.dynamics == 67648);
  const Index D = 512, L = 8, V = 256, T = 16;
  const Index per_block = 2 * D + 4 * D * D + 2 * D + (D * 4 * D + 4 * D) + (4 * D * D + D);
  CHECK(r.total == V * D + T * D + L * per_block + 67648 + 2 * D);
  CHECK(r.dynamics_percent == rel(100.0 * 67648 / r.total));
  c.attention = "standard";
  const auto s = Gpt<float, Identity, Softmax>(c, 0).parameter_report();
  CHECK(s.dynamics == 0);
  CHECK(s.total == r.total - 67648);
}

TEST_CASE("initialisation: GPT-2 scales, residual projections scaled by 1/sqrt(2L), deterministic per seed") {
  GptConfig c = tiny("standard");
  c.dim = 64;
  c.heads = 4;
  c.layers = 8;
  c.vocab = 500;
  auto a = make_double_gpt(c, 7), b = make_double_gpt(c, 7), other = make_double_gpt(c, 8);
  const auto pa = a->parameters(), pb = b->parameters(), po = other->parameters();
  bool differs = false;
  for (std::size_t k = 0; k < pa.size(); ++k) {
    CHECK(std::equal(pa[k].data, pa[k].data + pa[k].size(), pb[k].data));
    differs = differs || !std::equal(pa[k].data, pa[k].data + pa[k].size(), po[k].data);
  }
  CHECK(differs);
  auto std_of = [&](const std::string& name) {
    for (const auto& v : pa)
      if (v.name == name) {
        const Eigen::Map<const Vector<double>> m(v.data, v.size());
        return std::sqrt(m.array().square().mean());
      }
    FAIL("no tensor ", name);
    return 0.0;
  };
  CHECK(std_of("wte") == rel(0.02, 0.05));
  CHECK(std_of("h.0.mlp.fc.w") == rel(0.02, 0.05));
  CHECK(std_of("h.0.attn.wq") == rel(0.02, 0.05));
  CHECK(std_of("h.3.mlp.proj.w") == rel(0.02 / 4, 0.05));  // sqrt(2 * 8) = 4
  CHECK(std_of("h.3.attn.wo") == rel(0.02 / 4, 0.05));
  CHECK(std_of("h.3.ln2.g") == 1.0);
  CHECK(std_of("h.3.mlp.fc.b") == 0.0);
}

TEST_CASE("loss at initialisation is close to log(vocab); logits are [B*T, V] and causal") {
  GptConfig c = tiny("leapfrog");
  c.vocab = 50;
  c.context = 8;
  auto model = make_double_gpt(c, 2);
  Rng rng(3);
  auto tokens = random_ids(16, 50, rng);
  const auto targets = random_ids(16, 50, rng);
  Tape<double> tape;
  CHECK(model->evaluate(tape, tokens, targets, 2) == rel(std::log(50.0), 0.02));
  const Matrix<double> before = model->logits(tape, tokens, 2);
  CHECK(before.rows() == 16);
  CHECK(before.cols() == 50);
  // change tokens after t = 4 in both sequences: rows (b, t <= 4) stay bitwise equal
  for (int b = 0; b < 2; ++b)
    for (int t = 5; t < 8; ++t) tokens[static_cast<std::size_t>(b * 8 + t)] = (tokens[static_cast<std::size_t>(b * 8 + t)] + 1) % 50;
  const Matrix<double> after = model->logits(tape, tokens, 2);
  for (int b = 0; b < 2; ++b) {
    CHECK((before.middleRows(b * 8, 5) - after.middleRows(b * 8, 5)).cwiseAbs().maxCoeff() == 0.0);
    CHECK((before.middleRows(b * 8 + 5, 3) - after.middleRows(b * 8 + 5, 3)).cwiseAbs().maxCoeff() > 0.0);
  }
  // a shorter sequence (T < context) is accepted
  const std::vector<std::int32_t> short_tokens(tokens.begin(), tokens.begin() + 6);
  CHECK(model->logits(tape, short_tokens, 2).rows() == 6);
}

TEST_CASE("logits equal a plain reference forward written from the architecture (no tape)") {
  GptConfig c = tiny("leapfrog", 2);
  c.context = 8;  // longer than the T = 6 used: positions must restart at 0 in every sequence
  c.dim = 12;
  c.heads = 3;
  Gpt<double, Leapfrog<2>, Softmax> model(c, 9);
  Rng rng(10);
  for (auto& v : model.parameters())
    for (Index i = 0; i < v.size(); ++i) v.data[i] += 0.1 * rng.normal();
  const Index B = 2, T = 6, N = B * T, D = c.dim;
  const auto tokens = random_ids(N, c.vocab, rng);

  // the reference: GPT-2 as written in the spec, one plain Eigen expression at a time
  auto layer_norm = [&](const Matrix<double>& x, const Vector<double>& g, const Vector<double>& b) {
    Matrix<double> y(x.rows(), x.cols());
    for (Index r = 0; r < x.rows(); ++r) {
      const double mean = x.row(r).mean();
      const double var = (x.row(r).array() - mean).square().mean();
      y.row(r) = ((x.row(r).array() - mean) / std::sqrt(var + 1e-5) * g.transpose().array() + b.transpose().array()).matrix();
    }
    return y;
  };
  auto gelu = [](double v) { return 0.5 * v * (1 + std::tanh(std::sqrt(2 / 3.14159265358979323846) * (v + 0.044715 * v * v * v))); };
  const GptTensors<double>& p = model.tensors();
  Matrix<double> x(N, D);
  for (Index b = 0; b < B; ++b)
    for (Index t = 0; t < T; ++t) x.row(b * T + t) = p.wte.row(tokens[static_cast<std::size_t>(b * T + t)]) + p.wpe.row(t);
  for (Index l = 0; l < c.layers; ++l) {
    const GptBlock<double>& blk = p.h[static_cast<std::size_t>(l)];
    x += model.layer(l).forward(layer_norm(x, blk.ln1_g, blk.ln1_b), B);
    Matrix<double> h = layer_norm(x, blk.ln2_g, blk.ln2_b) * blk.fc_w;
    h.rowwise() += blk.fc_b.transpose();
    h = h.unaryExpr(gelu);
    Matrix<double> out = h * blk.proj_w;
    out.rowwise() += blk.proj_b.transpose();
    x += out;
  }
  const Matrix<double> expected = layer_norm(x, p.lnf_g, p.lnf_b) * p.wte.transpose();

  Tape<double> tape;
  const Matrix<double> logits = model.logits(tape, tokens, B);
  CHECK((logits - expected).cwiseAbs().maxCoeff() <= 1e-12 * expected.cwiseAbs().maxCoeff());
  // every sequence of a batch is independent of the others
  const std::vector<std::int32_t> second(tokens.begin() + T, tokens.end());
  CHECK((model.logits(tape, second, 1) - logits.bottomRows(T)).cwiseAbs().maxCoeff() <= 1e-12 * expected.cwiseAbs().maxCoeff());
}

TEST_CASE("float model agrees with the double model built from the same seed") {
  GptConfig c = tiny("diff-leapfrog", 2);
  c.vocab = 40;
  c.dim = 16;
  c.heads = 4;
  c.context = 12;
  auto md = make_double_gpt(c, 5);
  auto mf = make_gpt<float>(c, 5);
  Rng rng(6);
  const auto tokens = random_ids(24, 40, rng), targets = random_ids(24, 40, rng);
  Tape<double> td;
  Tape<float> tf;
  const Matrix<double> ld = md->logits(td, tokens, 2);
  const Matrix<double> lf = mf->logits(tf, tokens, 2).cast<double>();
  CHECK((ld - lf).cwiseAbs().maxCoeff() <= 200 * 1.2e-7 * ld.cwiseAbs().maxCoeff());
  md->zero_grad();
  mf->zero_grad();
  const double lossd = md->loss(td, tokens, targets, 2);
  const double lossf = mf->loss(tf, tokens, targets, 2);
  CHECK(std::abs(lossd - lossf) <= 1e-5 * lossd);
  const auto gd = md->gradients();
  const auto gf = mf->gradients();
  for (std::size_t k = 0; k < gd.size(); ++k) {
    const Eigen::Map<const Vector<double>> a(gd[k].data, gd[k].size());
    const Eigen::Map<const Vector<float>> b(gf[k].data, gf[k].size());
    INFO(gd[k].name);
    CHECK((a - b.cast<double>()).cwiseAbs().maxCoeff() <= 1e-3 * a.cwiseAbs().maxCoeff());
  }
}

TEST_CASE("make_gpt builds every registered variant; visit_gpt reaches the compiled model") {
  // at float, the scalar of the compiled table (variants.hpp): every entry by name, as the trainer
  // builds them; the double models above are the same template
  for (const auto& name : attention_names()) {
    GptConfig c = tiny(name, 2);
    auto m = make_gpt<float>(c, 1);
    CHECK(m->config().attention == name);
    CHECK((m->parameter_report().dynamics > 0) == builtin_variants.info(name).has_dynamics);
    const Index layers = visit_gpt(*m, [](auto& g) {
      CHECK(g.layer(0).config().layer_index == 0);
      CHECK(g.layer(1).config().layer_index == 1);
      return g.layers();
    });
    CHECK(layers == 2);
  }
  // make_double_gpt builds what make_gpt names
  for (const GptConfig& c : {tiny("standard"), tiny("leapfrog", 3), tiny("diff-euler"), tiny("uncoupled", 3)}) {
    const auto d = make_double_gpt(c, 1);
    const auto f = make_gpt<float>(c, 1);
    CHECK(d->config().attention == f->config().attention);
    CHECK(d->config().steps == f->config().steps);
    CHECK(d->parameter_report().total == f->parameter_report().total);
  }
  // a Gpt built directly names its variant from its policies
  Gpt<double, Euler<4>, Differential> direct(tiny("standard", 1), 0);
  CHECK(direct.config().attention == "diff-euler");
  CHECK(direct.config().steps == 4);
}

TEST_CASE("bad configurations and inputs are rejected with the value seen and what is accepted") {
  using doctest::Contains;
  auto bad = [](auto edit) {
    GptConfig c = tiny("leapfrog");
    edit(c);
    return c;
  };
  CHECK_THROWS_WITH_AS(make_gpt<float>(bad([](GptConfig& c) { c.dim = 10; c.heads = 3; })),
                       Contains("divisible by heads (H); got D = 10, H = 3"), coupledqk::invalid_argument);
  CHECK_THROWS_WITH_AS(make_gpt<float>(bad([](GptConfig& c) { c.vocab = 0; })), Contains("vocab (V) must be positive; got 0"),
                       coupledqk::invalid_argument);
  CHECK_THROWS_WITH_AS(make_gpt<float>(bad([](GptConfig& c) { c.dim = 0; })), Contains("dim (D) must be positive; got 0"),
                       coupledqk::invalid_argument);
  CHECK_THROWS_WITH_AS(make_gpt<float>(bad([](GptConfig& c) { c.layers = 0; })), Contains("layers (L) must be positive"),
                       coupledqk::invalid_argument);
  CHECK_THROWS_WITH_AS(make_gpt<float>(bad([](GptConfig& c) { c.heads = 0; })), Contains("heads (H) must be positive"),
                       coupledqk::invalid_argument);
  CHECK_THROWS_WITH_AS(make_gpt<float>(bad([](GptConfig& c) { c.context = -1; })), Contains("context"),
                       coupledqk::invalid_argument);
  CHECK_THROWS_WITH_AS(make_gpt<float>(bad([](GptConfig& c) { c.attention = "leap"; })),
                       Contains("unknown attention variant 'leap'; accepted: standard, leapfrog"), coupledqk::invalid_argument);
  CHECK_THROWS_WITH_AS(make_gpt<float>(bad([](GptConfig& c) { c.steps = 8; })), Contains("steps must be in 1..7; got 8"),
                       coupledqk::invalid_argument);
  CHECK_THROWS_WITH_AS(make_gpt<float>(bad([](GptConfig& c) { c.attention = "diff"; c.dim = 9; c.heads = 3; })),
                       Contains("head count must be even; got heads = 3"), coupledqk::invalid_argument);

  auto model = make_double_gpt(tiny("leapfrog"), 0);
  Tape<double> tape;
  const std::vector<std::int32_t> ok(10, 1), long_seq(12, 1), odd(9, 1);
  std::vector<std::int32_t> big = ok, negative = ok;
  big[7] = 11;
  negative[3] = -2;
  CHECK_THROWS_WITH_AS(model->loss(tape, long_seq, long_seq, 2), Contains("T = 6 (12 tokens / B = 2) exceeds the context of 5"),
                       coupledqk::invalid_argument);
  CHECK_THROWS_WITH_AS(model->loss(tape, big, ok, 2), Contains("tokens id 11 at position 7 is outside the vocabulary [0, 11)"),
                       coupledqk::invalid_argument);
  CHECK_THROWS_WITH_AS(model->loss(tape, ok, negative, 2), Contains("targets id -2 at position 3"),
                       coupledqk::invalid_argument);
  CHECK_THROWS_WITH_AS(model->loss(tape, ok, odd, 2), Contains("9 targets for 10 tokens"), coupledqk::invalid_argument);
  CHECK_THROWS_WITH_AS(model->loss(tape, odd, odd, 2), Contains("9 tokens is not a multiple of batch B = 2"),
                       coupledqk::invalid_argument);
  CHECK_THROWS_WITH_AS(model->logits(tape, ok, 0), Contains("batch (B) must be positive; got 0"), coupledqk::invalid_argument);
  CHECK_THROWS_WITH_AS(model->logits(tape, std::vector<std::int32_t>{}, 1), Contains("no tokens"), coupledqk::invalid_argument);
  // after an error the tape and the model still work
  CHECK(std::isfinite(model->loss(tape, ok, ok, 2)));
  // a non-finite parameter is reported by name
  model->parameters()[5].data[2] = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH_AS(model->check_parameters(), Contains("parameter 'h.0.attn.wk' holds a non-finite value"),
                       coupledqk::invalid_argument);
}

// ---- positions and windows (docs/masks-and-positions.md) ------------------------------------------

namespace {

GptConfig with_positions(GptConfig c, GptPositions p, RopeOrder order = RopeOrder::dynamics_then_rotate,
                         Index window = 0) {
  c.positions = p;
  c.rope_order = order;
  c.rope_base = 50.0;  // a small base: the slow frequencies still turn visibly over 5 positions
  c.window = window;
  return c;
}

std::vector<std::string> names_of(AnyGpt<double>& m) {
  std::vector<std::string> out;
  for (const auto& v : m.parameters()) out.push_back(v.name);
  return out;
}

}  // namespace

TEST_CASE("rope and none GPTs have no wpe; learned is the default and keeps it") {
  auto learned = make_double_gpt(tiny("leapfrog"), 3);
  auto rope = make_double_gpt(with_positions(tiny("leapfrog"), GptPositions::rope), 3);
  auto none = make_double_gpt(with_positions(tiny("leapfrog"), GptPositions::none), 3);
  CHECK(GptConfig{}.positions == GptPositions::learned);
  const auto ln = names_of(*learned), rn = names_of(*rope);
  CHECK(std::find(ln.begin(), ln.end(), "wpe") != ln.end());
  CHECK(std::find(rn.begin(), rn.end(), "wpe") == rn.end());
  CHECK(rn.size() + 1 == ln.size());
  CHECK(names_of(*none) == rn);
  CHECK(rope->tensors().wpe.size() == 0);
  CHECK(learned->parameter_report().total - rope->parameter_report().total == 5 * 8);  // context x D
  // every layer rotates (rope) or not (none, learned), with the model's base and order
  auto& g = dynamic_cast<Gpt<double, Leapfrog<1>, Softmax>&>(*rope);
  CHECK(g.layer(1).config().positions == Positions::rope);
  CHECK(g.layer(1).config().rope_base == 50.0);
  CHECK(dynamic_cast<Gpt<double, Leapfrog<1>, Softmax>&>(*none).layer(0).config().positions == Positions::none);
}

TEST_CASE("whole-model gradients match central differences: rope (both orders), none, windows") {
  check_model_gradients(with_positions(tiny("standard"), GptPositions::rope));
  check_model_gradients(with_positions(tiny("leapfrog", 2), GptPositions::rope, RopeOrder::rotate_then_dynamics));
  check_model_gradients(with_positions(tiny("diff-euler"), GptPositions::rope, RopeOrder::dynamics_then_rotate, 2));
  check_model_gradients(with_positions(tiny("euler"), GptPositions::none, RopeOrder::dynamics_then_rotate, 3));
  check_model_gradients(with_positions(tiny("leapfrog"), GptPositions::learned, RopeOrder::dynamics_then_rotate, 2));
}

TEST_CASE("the KV-cache decoder equals the full forward with rope and with a window") {
  for (const GptConfig& c :
       {with_positions(tiny("leapfrog", 2), GptPositions::rope), with_positions(tiny("euler"), GptPositions::rope, RopeOrder::rotate_then_dynamics),
        with_positions(tiny("diff-leapfrog"), GptPositions::rope, RopeOrder::dynamics_then_rotate, 2),
        with_positions(tiny("leapfrog"), GptPositions::learned, RopeOrder::dynamics_then_rotate, 2),
        with_positions(tiny("standard"), GptPositions::none)}) {
    CAPTURE(c.attention);
    CAPTURE(to_string(c.positions));
    CAPTURE(c.window);
    auto model = make_double_gpt(c, 8);
    Rng rng(9);
    const auto ids = random_ids(c.context, c.vocab, rng);
    Tape<double> tape;
    const Matrix<double> full = model->logits(tape, ids, 1);
    const Matrix<double> inc = incremental_logits(*model, ids);
    CHECK((inc - full).cwiseAbs().maxCoeff() <= 1e-12 * full.cwiseAbs().maxCoeff());
  }
}

TEST_CASE("rotary positions: the model sees order; a window bounds what a token reads") {
  // one block: a rope model's logits at the last position change when two earlier tokens swap
  // places; without positions they do not (the last row attends to the set of all tokens)
  const std::vector<std::int32_t> a{1, 2, 3, 4, 5}, swapped{2, 1, 3, 4, 5};
  Tape<double> tape;
  GptConfig one = tiny("leapfrog");
  one.layers = 1;
  auto rope = make_double_gpt(with_positions(one, GptPositions::rope), 4);
  auto none = make_double_gpt(with_positions(one, GptPositions::none), 4);
  auto last = [&](AnyGpt<double>& m, const std::vector<std::int32_t>& ids) {
    return Matrix<double>(m.logits(tape, ids, 1).bottomRows(1));
  };
  // (at initialisation the scores are small, so the effect is about 1e-6 of logits of order 1: far
  // above double round-off, which is what the order-blind model shows)
  CHECK((last(*rope, a) - last(*rope, swapped)).cwiseAbs().maxCoeff() > 1e-9);
  CHECK((last(*none, a) - last(*none, swapped)).cwiseAbs().maxCoeff() <= 1e-12);
  // two layers with a window of 2: position 4 reads positions 3..4, which read 2..4; tokens 0 and 1
  // change nothing there, token 2 does
  auto windowed = make_double_gpt(with_positions(tiny("leapfrog"), GptPositions::rope, RopeOrder::dynamics_then_rotate, 2), 4);
  const std::vector<std::int32_t> far{7, 8, 3, 4, 5}, near{1, 2, 9, 4, 5};
  CHECK((last(*windowed, a) - last(*windowed, far)).cwiseAbs().maxCoeff() == 0.0);
  CHECK((last(*windowed, a) - last(*windowed, near)).cwiseAbs().maxCoeff() > 1e-9);
}

TEST_CASE("positions: names and bad settings are refused with the value seen and what is accepted") {
  CHECK(parse_gpt_positions("rope") == GptPositions::rope);
  CHECK(parse_gpt_positions("learned") == GptPositions::learned);
  CHECK(parse_gpt_positions("none") == GptPositions::none);
  CHECK(std::string(to_string(GptPositions::rope)) == "rope");
  CHECK_THROWS_WITH_AS(parse_gpt_positions("Rope", "--positions"),
                       doctest::Contains("--positions is \"Rope\"; expected learned, rope or none"),
                       coupledqk::invalid_argument);
  CHECK(parse_rope_order("rotate-then-dynamics") == RopeOrder::rotate_then_dynamics);
  CHECK_THROWS_WITH_AS(parse_rope_order("rotate"), doctest::Contains("expected dynamics-then-rotate or rotate-then-dynamics"),
                       coupledqk::invalid_argument);
  GptConfig c = with_positions(tiny("leapfrog"), GptPositions::rope);
  c.window = -1;
  CHECK_THROWS_WITH_AS(make_gpt<float>(c), doctest::Contains("window must be >= 0"), coupledqk::invalid_argument);
  c.window = 0;
  c.rope_base = 1.0;
  CHECK_THROWS_WITH_AS(make_gpt<float>(c), doctest::Contains("rope_base must be finite and > 1; got 1"),
                       coupledqk::invalid_argument);
  c.rope_base = 10000;
  c.dim = 6;  // D/H = 3
  CHECK_THROWS_WITH_AS(make_gpt<float>(c), doctest::Contains("needs an even head width D/H; got D/H = 3"),
                       coupledqk::invalid_argument);
}
