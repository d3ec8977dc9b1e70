// Rotary positions in the attention layer (AttentionConfig::positions = rope, issue 22 item 2): the
// analytic backward against central differences in double for both orders and both memory modes,
// decoding with the KV cache against the full forward, standard attention with rope against a
// reference written here from the definition, and what is refused.
#include <doctest/doctest.h>

#include <coupledqk/coupledqk.hpp>
#include <coupledqk/testing/gradcheck.hpp>

#include <cmath>
#include <string>
#include <vector>

using namespace coupledqk;

namespace {

AttentionConfig rope_config(Index dim, Index heads, RopeOrder order, DynamicsMemory memory = DynamicsMemory::store) {
  AttentionConfig c;
  c.dim = dim;
  c.heads = heads;
  c.init_std = 0.4;              // scores of order 1: a rotation visibly changes them
  c.dynamics_init_scale = 0.5;   // the dynamics move q and k, so the order matters
  c.positions = Positions::rope;
  c.rope_base = 100.0;
  c.rope_order = order;
  c.memory = memory;
  return c;
}

Matrix<double> random_rows(Index rows, Index cols, std::uint64_t seed) {
  Rng rng(seed);
  Matrix<double> x(rows, cols);
  rng.fill_normal(x, 1.0);
  return x;
}

template <class Layer>
void check_layer(const AttentionConfig& cfg, const char* what) {
  INFO(what << ", order " << to_string(cfg.rope_order) << ", memory " << to_string(cfg.memory));
  const Layer layer(cfg, 11);
  const Index B = 2, T = 5;
  const Matrix<double> x = random_rows(B * T, cfg.dim, 12), dy = random_rows(B * T, cfg.dim, 13);
  for (const auto& e : testing::check_gradients(layer, x, B, dy)) {
    INFO("tensor " << e.name << ": error " << e.error << ", scale " << e.scale);
    CHECK(e.error < 1e-6);
  }
  // decoding token by token at absolute positions matches the full forward
  const Matrix<double> y = layer.forward(x, B);
  auto cache = layer.make_cache(B, T);
  for (Index t = 0; t < T; ++t) {
    Matrix<double> row(B, cfg.dim);
    for (Index b = 0; b < B; ++b) row.row(b) = x.row(b * T + t);
    const Matrix<double> out = layer.decode(row, cache);
    for (Index b = 0; b < B; ++b) CHECK((out.row(b) - y.row(b * T + t)).cwiseAbs().maxCoeff() < 1e-12);
  }
}

}  // namespace

TEST_CASE("rope in the layer: gradients and decoding, both orders, both memory modes") {
  for (RopeOrder order : {RopeOrder::dynamics_then_rotate, RopeOrder::rotate_then_dynamics}) {
    check_layer<Attention<double, Identity, Softmax>>(rope_config(8, 2, order), "standard");
    check_layer<Attention<double, Leapfrog<2>, Softmax>>(rope_config(8, 2, order), "leapfrog, 2 steps");
    check_layer<Attention<double, Leapfrog<2>, Softmax>>(rope_config(8, 2, order, DynamicsMemory::recompute),
                                                         "leapfrog, 2 steps");
    check_layer<Attention<double, Euler<1>, Differential>>(rope_config(8, 2, order), "diff-euler");
    check_layer<Attention<double, Affine<1>, Softmax>>(rope_config(8, 2, order, DynamicsMemory::recompute), "affine");
    check_layer<Attention<double, SiluNewtonLeapfrog<1>, Softmax>>(rope_config(8, 2, order), "newton-leapfrog");
  }
}

TEST_CASE("rope in the layer: standard attention equals a reference written from the definition") {
  // y = softmax_causal((R q)(R k)^T / sqrt(d)) v Wo per head, q = x Wq, k = x Wk, v = x Wv, R the
  // rotate-half rotation at each token's position -- loops here, the library's tiled kernels there.
  const AttentionConfig cfg = rope_config(12, 3, RopeOrder::dynamics_then_rotate);
  const Attention<double, Identity, Softmax> layer(cfg, 5);
  const Index T = 7, D = cfg.dim, H = cfg.heads, d = D / H;
  const Matrix<double> x = random_rows(T, D, 6);
  Matrix<double> q = x * layer.params.wq, k = x * layer.params.wk;
  const Matrix<double> v = x * layer.params.wv;
  auto rotate = [&](Matrix<double>& m) {
    for (Index t = 0; t < T; ++t)
      for (Index h = 0; h < H; ++h)
        for (Index i = 0; i < d / 2; ++i) {
          const double a = static_cast<double>(t) * std::pow(cfg.rope_base, -2.0 * static_cast<double>(i) / d);
          const double x1 = m(t, h * d + i), x2 = m(t, h * d + i + d / 2);
          m(t, h * d + i) = x1 * std::cos(a) - x2 * std::sin(a);
          m(t, h * d + i + d / 2) = x2 * std::cos(a) + x1 * std::sin(a);
        }
  };
  rotate(q);
  rotate(k);
  Matrix<double> o = Matrix<double>::Zero(T, D);
  for (Index h = 0; h < H; ++h)
    for (Index t = 0; t < T; ++t) {
      std::vector<double> p(static_cast<std::size_t>(t + 1));
      double top = -1e300, sum = 0;
      for (Index s = 0; s <= t; ++s) {
        p[s] = q.row(t).segment(h * d, d).dot(k.row(s).segment(h * d, d)) / std::sqrt(static_cast<double>(d));
        top = std::max(top, p[s]);
      }
      for (auto& e : p) sum += (e = std::exp(e - top));
      for (Index s = 0; s <= t; ++s) o.row(t).segment(h * d, d) += (p[s] / sum) * v.row(s).segment(h * d, d);
    }
  const Matrix<double> want = o * layer.params.wo;
  for (bool reference : {false, true}) {
    AttentionConfig c = cfg;
    c.reference_kernels = reference;
    Attention<double, Identity, Softmax> l(c, 5);
    CHECK((l.forward(x, 1) - want).cwiseAbs().maxCoeff() < 1e-12);
  }
  // ... and differs from the layer without positions
  AttentionConfig none = cfg;
  none.positions = Positions::none;
  CHECK((Attention<double, Identity, Softmax>(none, 5).forward(x, 1) - want).cwiseAbs().maxCoeff() > 1e-3);
}

TEST_CASE("rope in the layer: position 0 changes nothing; the order matters only where the dynamics move q, k") {
  const Matrix<double> one = random_rows(3, 8, 21);  // three sequences of one token: all at position 0
  AttentionConfig a = rope_config(8, 2, RopeOrder::dynamics_then_rotate), none = a;
  none.positions = Positions::none;
  using L = Attention<double, Leapfrog<1>, Softmax>;
  CHECK(L(a, 4).forward(one, 3) == L(none, 4).forward(one, 3));

  const Matrix<double> x = random_rows(6, 8, 22);
  AttentionConfig b = a;
  b.rope_order = RopeOrder::rotate_then_dynamics;
  CHECK((L(a, 4).forward(x, 1) - L(b, 4).forward(x, 1)).cwiseAbs().maxCoeff() > 1e-6);
  using S = Attention<double, Identity, Softmax>;
  CHECK(S(a, 4).forward(x, 1) == S(b, 4).forward(x, 1));
  // the diagnostics measure the dynamics' own displacement, not the rotation's
  AttentionConfig still = a;
  still.dynamics_init_scale = 0;  // the spec's initialisation: the flow is the identity
  const LayerDynamics dyn = L(still, 4).dynamics_diagnostics(x, 1);
  CHECK(dyn.q_displacement < 1e-12);
  CHECK(dyn.k_displacement < 1e-12);
}

TEST_CASE("rope in the layer: what it refuses, with the value seen") {
  auto error_of = [](AttentionConfig c) {
    try {
      Attention<float, Identity, Softmax> l(c, 1);
    } catch (const invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  AttentionConfig c = rope_config(9, 3, RopeOrder::dynamics_then_rotate);
  CHECK(error_of(c).find("positions = rope needs an even head width D/H; got D/H = 3") != std::string::npos);
  c = rope_config(8, 2, RopeOrder::dynamics_then_rotate);
  c.rope_base = 0.5;
  CHECK(error_of(c).find("rope_base must be finite and > 1; got 0.5") != std::string::npos);
  c.rope_base = std::nan("");
  CHECK(error_of(c).find("rope_base must be finite and > 1; got nan") != std::string::npos);
  c.rope_base = 10000;
  CHECK(error_of(c).empty());
}
