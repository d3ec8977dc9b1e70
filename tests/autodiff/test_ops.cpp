// Every tape op against central differences in double (max relative error <= 1e-6 per input), the
// attention node against the same, the tied-parameter accumulation, and the tape's mechanics.
#include <doctest/doctest.h>

#include <coupledqk/model/attention_op.hpp>
#include <coupledqk/registry.hpp>

#include "helpers.hpp"

using namespace cqk_ad_test;

namespace {

void check_errors(const std::vector<TensorError>& errors, const char* op) {
  for (const auto& e : errors) {
    INFO(op, ", ", e.name, ": rel. error ", e.error, ", scale ", e.scale);
    CHECK(e.scale > 1e-8);
    CHECK(e.error <= 1e-6);
  }
}

}  // namespace

TEST_CASE("linear and matmul gradients (x, w, b)") {
  Rng rng(1);
  check_errors(check_graph({random_matrix(5, 4, rng), random_matrix(4, 3, rng), random_matrix(1, 3, rng)},
                           [](Tape<double>& t, const std::vector<Var>& v) { return ops::linear(t, v[0], v[1], v[2]); }),
               "linear");
  check_errors(check_graph({random_matrix(5, 4, rng), random_matrix(4, 3, rng)},
                           [](Tape<double>& t, const std::vector<Var>& v) { return ops::matmul(t, v[0], v[1]); }),
               "matmul");
}

TEST_CASE("matmul_transposed gradients (tied logits x w^T)") {
  Rng rng(2);
  check_errors(check_graph({random_matrix(5, 4, rng), random_matrix(6, 4, rng)},
                           [](Tape<double>& t, const std::vector<Var>& v) {
                             return ops::matmul_transposed(t, v[0], v[1]);
                           }),
               "matmul_transposed");
}

TEST_CASE("add gradients, including an operand used twice") {
  Rng rng(3);
  check_errors(check_graph({random_matrix(4, 3, rng), random_matrix(4, 3, rng)},
                           [](Tape<double>& t, const std::vector<Var>& v) { return ops::add(t, v[0], v[1]); }),
               "add");
  // y = (a + a) + b: a's gradient must be 2 dy
  check_errors(check_graph({random_matrix(4, 3, rng), random_matrix(4, 3, rng)},
                           [](Tape<double>& t, const std::vector<Var>& v) {
                             return ops::add(t, ops::add(t, v[0], v[0]), v[1]);
                           }),
               "add twice");
}

TEST_CASE("layer_norm gradients (x, gain, bias)") {
  Rng rng(4);
  Matrix<double> x = random_matrix(5, 6, rng);
  x.col(2).array() += 3.0;  // a non-zero mean per row
  check_errors(check_graph({x, random_matrix(1, 6, rng), random_matrix(1, 6, rng)},
                           [](Tape<double>& t, const std::vector<Var>& v) {
                             return ops::layer_norm(t, v[0], v[1], v[2]);
                           }),
               "layer_norm");
}

TEST_CASE("layer_norm forward: zero mean, unit variance before gain and bias") {
  Rng rng(40);
  const Matrix<double> x = random_matrix(3, 8, rng, 5.0);
  Tape<double> t;
  const Matrix<double> g = Matrix<double>::Ones(1, 8), b = Matrix<double>::Zero(1, 8);
  const Var y = ops::layer_norm(t, t.constant(x), t.constant(g), t.constant(b));
  for (Index r = 0; r < 3; ++r) {
    const auto row = t.value(y).row(r);
    CHECK(std::abs(row.mean()) < 1e-12);
    // variance is var / (var + eps): just below 1
    const double var_x = (x.row(r).array() - x.row(r).mean()).square().mean();
    CHECK(std::abs(row.array().square().mean() - var_x / (var_x + 1e-5)) < 1e-12);
  }
}

TEST_CASE("gelu (tanh form) gradients and values") {
  Rng rng(5);
  check_errors(check_graph({random_matrix(4, 5, rng, 2.0)},
                           [](Tape<double>& t, const std::vector<Var>& v) { return ops::gelu(t, v[0]); }),
               "gelu");
  // values against the formula with independently written constants
  CHECK(kernels::gelu(0.0) == 0.0);
  CHECK(std::abs(kernels::gelu(1.0) - 0.8411919906082768) < 1e-15);
  CHECK(std::abs(kernels::gelu(-2.0) - (-0.04540230591222)) < 1e-13);
}

TEST_CASE("embedding gradient scatter-adds repeated ids") {
  Rng rng(6);
  const std::vector<std::int32_t> ids{3, 0, 3, 6, 3, 1};
  check_errors(check_graph({random_matrix(7, 4, rng)},
                           [&](Tape<double>& t, const std::vector<Var>& v) {
                             return ops::embedding(t, v[0], ids.data(), static_cast<Index>(ids.size()));
                           }),
               "embedding");
  // rows never looked up get exactly zero; row 3 gets the sum of three upstream rows
  Matrix<double> table = random_matrix(7, 4, rng), grad = Matrix<double>::Zero(7, 4);
  Tape<double> t;
  const Var y = ops::embedding(t, t.parameter(table, &grad), ids.data(), 6);
  const Matrix<double> dy = random_matrix(6, 4, rng);
  t.backward(y, dy);
  CHECK(grad.row(2).isZero(0));
  CHECK(grad.row(5).isZero(0));
  CHECK((grad.row(3) - (dy.row(0) + dy.row(2) + dy.row(4))).cwiseAbs().maxCoeff() < 1e-15);
}

TEST_CASE("cross_entropy: gradients, value, stability") {
  Rng rng(7);
  const std::vector<std::int32_t> targets{0, 4, 2, 2, 1, 3};
  check_errors(check_graph({random_matrix(6, 5, rng, 3.0)},
                           [&](Tape<double>& t, const std::vector<Var>& v) {
                             return ops::cross_entropy(t, v[0], targets.data(), 6);
                           }),
               "cross_entropy");
  // value: uniform logits give log(V); huge logits stay finite
  Tape<double> t;
  Matrix<double> z = Matrix<double>::Constant(6, 5, 0.25);
  CHECK(std::abs(t.scalar(ops::cross_entropy(t, t.constant(z), targets.data(), 6)) - std::log(5.0)) < 1e-14);
  z.setConstant(1e4);
  z(0, 0) = 1e4 + 1;
  const double l = t.scalar(ops::cross_entropy(t, t.constant(z), targets.data(), 6));
  CHECK(std::isfinite(l));
  // row 0 (target 0, the larger logit): log(1 + 4 e^-1); rows 1..5: log(5) (all equal)
  CHECK(std::abs(l - (std::log(1 + 4 * std::exp(-1.0)) + 5 * std::log(5.0)) / 6) < 1e-12);
}

// loss() and evaluate() must agree bit for bit (tests/autodiff/test_gpt.cpp checks the whole
// model). The loss of a row goes through Eigen's vectorised exp and sum, which split a row into
// scalar and packet parts by the alignment of the memory they work on; a cross-entropy that summed
// differently without gradients disagreed in the last bit in AVX-512 builds. Every vocabulary size
// from 1 to 40 (every head/tail split of 4-, 8- and 16-wide packets), both scalar types.
namespace {

template <class S>
void check_cross_entropy_bits() {
  Rng rng(8);
  for (Index V = 1; V <= 40; ++V) {
    const Index N = 7;
    Matrix<S> z = random_matrix(N, V, rng, 3.0).template cast<S>();
    Matrix<S> dz = Matrix<S>::Zero(N, V);
    const auto targets = random_ids(N, V, rng);
    Tape<S> a, b;
    const S with_grad = a.scalar(ops::cross_entropy(a, a.parameter(z, &dz), targets.data(), N));
    const S without = b.scalar(ops::cross_entropy(b, b.constant(z), targets.data(), N));
    INFO("V = ", V, ": ", with_grad, " with gradients, ", without, " without");
    CHECK(with_grad == without);
  }
}

}  // namespace

TEST_CASE("cross_entropy: the same bits with and without gradients, every vocabulary size") {
  check_cross_entropy_bits<float>();
  check_cross_entropy_bits<double>();
}

TEST_CASE("a composite graph (LayerNorm, MLP, residual, tied logits, loss) against central differences") {
  Rng rng(8);
  const std::vector<std::int32_t> ids{1, 4, 4, 0, 2, 3}, targets{4, 4, 0, 2, 3, 1};
  // wte [5, 4], g, b [1, 4], w1 [4, 8], b1 [1, 8], w2 [8, 4], b2 [1, 4]
  check_errors(check_graph({random_matrix(5, 4, rng), random_matrix(1, 4, rng), random_matrix(1, 4, rng),
                            random_matrix(4, 8, rng), random_matrix(1, 8, rng), random_matrix(8, 4, rng),
                            random_matrix(1, 4, rng)},
                           [&](Tape<double>& t, const std::vector<Var>& v) {
                             const Var x = ops::embedding(t, v[0], ids.data(), 6);
                             Var h = ops::layer_norm(t, x, v[1], v[2]);
                             h = ops::linear(t, ops::gelu(t, ops::linear(t, h, v[3], v[4])), v[5], v[6]);
                             const Var logits = ops::matmul_transposed(t, ops::add(t, x, h), v[0]);
                             return ops::cross_entropy(t, logits, targets.data(), 6);
                           }),
               "composite");
}

TEST_CASE("a tied parameter receives the sum of both uses, added to what its buffer held") {
  Rng rng(9);
  const std::vector<std::int32_t> ids{2, 0, 2, 1}, targets{1, 2, 0, 0};
  const Matrix<double> table = random_matrix(3, 4, rng);
  auto run = [&](Tape<double>& t, Var lookup_table, Var logits_table) {
    const Var x = ops::embedding(t, lookup_table, ids.data(), 4);
    const Var y = ops::gelu(t, x);
    t.backward(ops::cross_entropy(t, ops::matmul_transposed(t, y, logits_table), targets.data(), 4));
  };
  // untied: two leaves over two copies
  Matrix<double> g_lookup = Matrix<double>::Zero(3, 4), g_logits = Matrix<double>::Zero(3, 4);
  Tape<double> t;
  run(t, t.parameter(table, &g_lookup), t.parameter(table, &g_logits));
  CHECK(g_lookup.cwiseAbs().maxCoeff() > 1e-3);
  CHECK(g_logits.cwiseAbs().maxCoeff() > 1e-3);
  // tied: one leaf, and a buffer that already holds something
  const Matrix<double> before = random_matrix(3, 4, rng);
  Matrix<double> g_tied = before;
  t.clear();
  const Var w = t.parameter(table, &g_tied);
  run(t, w, w);
  CHECK((g_tied - (before + g_lookup + g_logits)).cwiseAbs().maxCoeff() < 1e-14);
}

TEST_CASE("the attention node: gradients of x and of every layer parameter match central differences") {
  const Index B = 2, T = 4, D = 8, H = 2;
  AttentionConfig cfg;
  cfg.dim = D;
  cfg.heads = H;
  cfg.dynamics_init_scale = 0.5;
  cfg.init_std = 0.3;
  cfg.layer_index = 1;
  auto check_layer = [&](auto layer, const char* what) {
    using Layer = decltype(layer);
    Rng rng(10);
    const Matrix<double> x = random_matrix(B * T, D, rng);
    const Matrix<double> dy = random_matrix(B * T, D, rng);
    // analytic through the tape: x is a leaf, y = attention(x), seeded with dy
    Tape<double> t;
    Matrix<double> dx = Matrix<double>::Zero(B * T, D);
    auto grad = layer.zero_gradients();
    const Var y = ops::attention(t, layer, t.parameter(x, &dx), B, &grad);
    // the node's value is the layer's forward, bit for bit
    CHECK((Matrix<double>(t.value(y)) - layer.forward(x, B)).cwiseAbs().maxCoeff() == 0.0);
    t.backward(y, dy);
    // numeric, through the tape without gradients (no context kept)
    auto objective = [&](const Layer& l, const Matrix<double>& in) {
      Tape<double> tn;
      return (tn.value(ops::attention(tn, l, tn.constant(in), B, nullptr)).array() * dy.array()).sum();
    };
    const double eps = 1e-6;
    {
      Matrix<double> xp = x, numeric(B * T, D);
      for (Index i = 0; i < x.size(); ++i) {
        const double v = xp.data()[i];
        xp.data()[i] = v + eps;
        const double lp = objective(layer, xp);
        xp.data()[i] = v - eps;
        const double lm = objective(layer, xp);
        xp.data()[i] = v;
        numeric.data()[i] = (lp - lm) / (2 * eps);
      }
      INFO(what, ", x");
      CHECK(testing::max_relative_error(dx, numeric) <= 1e-6);
    }
    std::vector<TensorView<double>> params, grads;
    append_views<double>(layer.params, "", params);
    append_views<double>(grad, "", grads);
    for (std::size_t k = 0; k < params.size(); ++k) {
      Vector<double> numeric(params[k].size());
      for (Index i = 0; i < params[k].size(); ++i) {
        double& w = params[k].data[i];
        const double v = w;
        w = v + eps;
        const double lp = objective(layer, x);
        w = v - eps;
        const double lm = objective(layer, x);
        w = v;
        numeric[i] = (lp - lm) / (2 * eps);
      }
      const Eigen::Map<Vector<double>> analytic(grads[k].data, params[k].size());
      INFO(what, ", ", params[k].name, ": scale ", numeric.cwiseAbs().maxCoeff());
      CHECK(numeric.cwiseAbs().maxCoeff() > 1e-8);
      CHECK(testing::max_relative_error(analytic, numeric) <= 1e-6);
    }
  };
  check_layer(Attention<double, Leapfrog<2>, Softmax>(cfg, 3), "leapfrog<2> softmax");
  check_layer(Attention<double, Euler<1>, Differential>(cfg, 4), "euler<1> differential");
  check_layer(Attention<double, Identity, Softmax>(cfg, 5), "standard");
}

TEST_CASE("tape: a branch the root does not depend on gets no gradient; constants get none") {
  Rng rng(11);
  Matrix<double> a = random_matrix(2, 3, rng), b = random_matrix(2, 3, rng);
  Matrix<double> ga = Matrix<double>::Zero(2, 3), gb = Matrix<double>::Zero(2, 3);
  Tape<double> t;
  const Var va = t.parameter(a, &ga), vb = t.parameter(b, &gb);
  const Var unused = ops::gelu(t, vb);
  const Var c = t.constant(b);
  CHECK(!t.requires_grad(c));
  const Var y = ops::add(t, ops::gelu(t, va), c);
  CHECK(t.requires_grad(y));
  t.backward(y, Matrix<double>::Ones(2, 3));
  CHECK(ga.cwiseAbs().maxCoeff() > 0.1);
  CHECK(gb.isZero(0));
  CHECK_THROWS_AS(t.grad(c), coupledqk::invalid_argument);
  (void)unused;
}

TEST_CASE("tape: clear() invalidates handles, backward runs once, roots must be scalar") {
  Tape<double> t;
  Matrix<double> w = Matrix<double>::Ones(2, 2), g = Matrix<double>::Zero(2, 2);
  const Var v = t.parameter(w, &g);
  const Var y = ops::gelu(t, v);
  CHECK_THROWS_WITH_AS(t.backward(y), doctest::Contains("needs a scalar [1, 1]"), coupledqk::invalid_argument);
  t.backward(y, Matrix<double>::Ones(2, 2));
  CHECK_THROWS_WITH_AS(t.backward(y, Matrix<double>::Ones(2, 2)), doctest::Contains("already run"),
                       coupledqk::invalid_argument);
  t.clear();
  CHECK(t.size() == 0);
  CHECK_THROWS_WITH_AS(t.value(y), doctest::Contains("before the last clear()"), coupledqk::invalid_argument);
  CHECK_THROWS_AS(t.value(Var{}), coupledqk::invalid_argument);
  // a graph with no gradient anywhere records no backward and refuses to run one
  const Var c = ops::gelu(t, t.parameter(w, nullptr));
  CHECK_THROWS_WITH_AS(t.backward(c, Matrix<double>::Ones(2, 2)), doctest::Contains("requires a gradient"),
                       coupledqk::invalid_argument);
}

TEST_CASE("tape: shape and id errors name the values seen") {
  Tape<double> t;
  Matrix<double> x = Matrix<double>::Ones(3, 4), w = Matrix<double>::Ones(5, 2);
  CHECK_THROWS_WITH_AS(ops::linear(t, t.constant(x), t.constant(w)),
                       doctest::Contains("weight w is [5, 2]; expected [4, 2]"), coupledqk::invalid_argument);
  const std::vector<std::int32_t> bad{0, 7};
  CHECK_THROWS_WITH_AS(ops::embedding(t, t.constant(w), bad.data(), 2), doctest::Contains("id 7 at position 1"),
                       coupledqk::invalid_argument);
  const std::vector<std::int32_t> neg{0, -1, 1};
  CHECK_THROWS_WITH_AS(ops::cross_entropy(t, t.constant(x), neg.data(), 3),
                       doctest::Contains("target -1 at position 1"), coupledqk::invalid_argument);
  CHECK_THROWS_WITH_AS(ops::cross_entropy(t, t.constant(x), neg.data(), 2),
                       doctest::Contains("2 targets for 3 rows"), coupledqk::invalid_argument);
}

TEST_CASE("tape: the same graph step after step reuses its buffers") {
  Rng rng(12);
  Matrix<double> w = random_matrix(16, 16, rng), g = Matrix<double>::Zero(16, 16);
  const Matrix<double> x = random_matrix(32, 16, rng);
  const std::vector<std::int32_t> targets(32, 3);
  Tape<double> t;
  std::size_t capacity[4];
  for (auto& c : capacity) {
    t.clear();
    const Var h = ops::gelu(t, ops::linear(t, t.constant(x), t.parameter(w, &g)));
    t.backward(ops::cross_entropy(t, ops::matmul_transposed(t, h, t.parameter(w, &g)), targets.data(), 32));
    c = t.capacity_bytes();
  }
  // the first step allocates; from the second on, buffers circulate (the loss hands its
  // probabilities to the logits' gradient and takes the previous one back)
  CHECK(capacity[0] > 32 * 16 * sizeof(double));
  CHECK(capacity[2] == capacity[1]);
  CHECK(capacity[3] == capacity[1]);
  t.release();
  CHECK(t.capacity_bytes() == 0);
}
