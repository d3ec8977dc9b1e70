// Masks and sequence layouts in the attention layer (issue 22 item 1): bidirectional and sliding-
// window masks, right-padded and packed batches, for both scorings, both kernel paths and both
// memory modes. Checked against a reference written here from the definition (loops), against
// central differences in double, and by the properties the masks promise: permutation
// equivariance, a window's blindness beyond it, padding that changes nothing and gets no gradient,
// packed = one by one, rope scores that depend on t - t' only, decode = forward.
#include <doctest/doctest.h>

#include <coupledqk/coupledqk.hpp>
#include <coupledqk/testing/gradcheck.hpp>

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

using namespace coupledqk;

namespace {

Matrix<double> random_rows(Index rows, Index cols, std::uint64_t seed) {
  Rng rng(seed);
  Matrix<double> x(rows, cols);
  rng.fill_normal(x, 1.0);
  return x;
}

AttentionConfig masked_config(bool causal, Index window, Index dim = 8, Index heads = 2) {
  AttentionConfig c;
  c.dim = dim;
  c.heads = heads;
  c.init_std = 0.4;             // scores of order 1
  c.dynamics_init_scale = 0.5;  // the dynamics move q and k
  c.causal = causal;
  c.window = window;
  return c;
}

struct MaskCase {
  bool causal;
  Index window;
};
const MaskCase mask_cases[] = {{true, 0}, {false, 0}, {true, 3}, {false, 2}, {true, 1}, {false, 1}};

std::string describe(const AttentionConfig& c) { return to_string(c.mask()); }

/// Standard attention (no dynamics) from the definition: per sequence and head,
/// o_t = sum over visible t' of softmax(q_t . k_t' / sqrt(d)) v_t', y = o Wo; padding rows 0.
Matrix<double> reference_standard(const Attention<double, Identity, Softmax>& layer, const Matrix<double>& x,
                                  const Sequences& seqs) {
  const AttentionConfig& cfg = layer.config();
  const Index D = cfg.dim, H = cfg.heads, d = D / H;
  const Matrix<double> q = x * layer.params.wq, k = x * layer.params.wk, v = x * layer.params.wv;
  Matrix<double> o = Matrix<double>::Zero(x.rows(), D);
  for (Index b = 0; b < seqs.batch(); ++b) {
    const Index r0 = seqs.start(b), L = seqs.length(b);
    for (Index h = 0; h < H; ++h)
      for (Index t = 0; t < L; ++t) {
        std::vector<double> p;
        std::vector<Index> keys;
        for (Index s = 0; s < L; ++s) {
          const bool seen = (cfg.causal ? s <= t : true) &&
                            (cfg.window == 0 || (cfg.causal ? t - s < cfg.window : std::abs(t - s) < cfg.window));
          if (!seen) continue;
          keys.push_back(s);
          p.push_back(q.row(r0 + t).segment(h * d, d).dot(k.row(r0 + s).segment(h * d, d)) /
                      std::sqrt(static_cast<double>(d)));
        }
        const double top = *std::max_element(p.begin(), p.end());
        double sum = 0;
        for (auto& e : p) sum += (e = std::exp(e - top));
        for (std::size_t j = 0; j < keys.size(); ++j)
          o.row(r0 + t).segment(h * d, d) += (p[j] / sum) * v.row(r0 + keys[j]).segment(h * d, d);
      }
  }
  return o * layer.params.wo;
}

template <class Layer, class Batch>
void check_gradients_of(const AttentionConfig& cfg, const Matrix<double>& x, const Batch& batch, const char* what) {
  INFO(what << ", mask " << describe(cfg) << ", memory " << to_string(cfg.memory) << ", reference "
            << cfg.reference_kernels);
  const Layer layer(cfg, 31);
  const Matrix<double> dy = random_rows(x.rows(), cfg.dim, 32);
  for (const auto& e : testing::check_gradients(layer, x, batch, dy)) {
    INFO("tensor " << e.name << ": error " << e.error << ", scale " << e.scale);
    CHECK(e.error < 1e-6);
  }
}

double max_diff(const Matrix<double>& a, const Matrix<double>& b) {
  return (a - b).cwiseAbs().maxCoeff();
}

}  // namespace

TEST_CASE("masks: standard attention equals the definition for every mask and layout, both kernel paths") {
  const Index D = 12, H = 3;
  const Sequences layouts[] = {Sequences::equal(2, 70), Sequences::padded(70, {70, 41}),
                               Sequences::packed({0, 70, 111, 112})};
  for (const MaskCase& m : mask_cases)
    for (const Sequences& seqs : layouts)
      for (bool reference : {false, true}) {
        AttentionConfig cfg = masked_config(m.causal, m.window, D, H);
        cfg.reference_kernels = reference;
        const Attention<double, Identity, Softmax> layer(cfg, 5);
        const Matrix<double> x = random_rows(seqs.rows(), D, 6);
        INFO("mask " << describe(cfg) << ", layout " << to_string(seqs.layout()) << ", reference " << reference);
        CHECK(max_diff(layer.forward(x, seqs), reference_standard(layer, x, seqs)) < 1e-12);
      }
  // a window wider than the sequence is no window
  const Matrix<double> x = random_rows(2 * 9, D, 7);
  for (bool causal : {true, false}) {
    const Attention<double, Identity, Softmax> wide(masked_config(causal, 9, D, H), 5), none(masked_config(causal, 0, D, H), 5);
    CHECK(wide.forward(x, 2) == none.forward(x, 2));
  }
}

TEST_CASE("masks: the tiled kernels equal the reference path, forward and backward, both scorings") {
  // T = 150 spans three tiles of 64, so a window skips whole tiles and cuts others
  const Index D = 8;
  const Sequences layouts[] = {Sequences::equal(2, 150), Sequences::padded(150, {150, 77}),
                               Sequences::packed({0, 150, 213})};
  auto run = [&](auto tag, const AttentionConfig& cfg, const Sequences& seqs) {
    using Layer = typename decltype(tag)::type;
    const Matrix<double> x = random_rows(seqs.rows(), D, 8), dy = random_rows(seqs.rows(), D, 9);
    AttentionConfig fast = cfg, ref = cfg;
    ref.reference_kernels = true;
    const Layer a(fast, 3), b(ref, 3);
    typename Layer::Context ca, cb;
    const Matrix<double> ya = a.forward(x, seqs, &ca), yb = b.forward(x, seqs, &cb);
    auto ga = a.zero_gradients(), gb = b.zero_gradients();
    const Matrix<double> dxa = a.backward(ca, dy, ga), dxb = b.backward(cb, dy, gb);
    INFO("mask " << describe(cfg) << ", layout " << to_string(seqs.layout()));
    CHECK(max_diff(ya, yb) < 1e-12);
    CHECK(max_diff(dxa, dxb) < 1e-12);
    std::vector<TensorView<double>> va, vb;
    append_views<double>(ga, "", va);
    append_views<double>(gb, "", vb);
    for (std::size_t i = 0; i < va.size(); ++i)
      for (Index j = 0; j < va[i].size(); ++j) CHECK(std::abs(va[i].data[j] - vb[i].data[j]) < 1e-10);
  };
  struct SoftmaxLayer {
    using type = Attention<double, Leapfrog<1>, Softmax>;
  };
  struct DiffLayer {
    using type = Attention<double, Leapfrog<1>, Differential>;
  };
  for (const MaskCase& m : {MaskCase{false, 0}, MaskCase{true, 70}, MaskCase{false, 40}, MaskCase{true, 0}})
    for (const Sequences& seqs : layouts) {
      const AttentionConfig cfg = masked_config(m.causal, m.window, D, 2);
      run(SoftmaxLayer{}, cfg, seqs);
      run(DiffLayer{}, cfg, seqs);
    }
}

TEST_CASE("masks: analytic gradients against central differences, every mask, layout and position order") {
  const Matrix<double> x_equal = random_rows(2 * 5, 8, 12);
  const Sequences padded = Sequences::padded(5, {5, 3}), packed = Sequences::packed({0, 4, 5, 8});
  const Matrix<double> x_packed = random_rows(8, 8, 13);
  for (const MaskCase& m : {MaskCase{false, 0}, MaskCase{true, 2}, MaskCase{false, 2}}) {
    for (Positions pos : {Positions::none, Positions::rope})
      for (RopeOrder order : {RopeOrder::dynamics_then_rotate, RopeOrder::rotate_then_dynamics}) {
        if (pos == Positions::none && order == RopeOrder::rotate_then_dynamics) continue;
        AttentionConfig cfg = masked_config(m.causal, m.window);
        cfg.positions = pos;
        cfg.rope_order = order;
        cfg.rope_base = 100.0;
        check_gradients_of<Attention<double, Identity, Softmax>>(cfg, x_equal, Index(2), "standard");
        check_gradients_of<Attention<double, Leapfrog<2>, Softmax>>(cfg, x_equal, padded, "leapfrog, padded");
        check_gradients_of<Attention<double, Affine<1>, Softmax>>(cfg, x_packed, packed, "affine, packed");
        check_gradients_of<Attention<double, Leapfrog<1>, Differential>>(cfg, x_equal, padded, "diff-leapfrog, padded");
        check_gradients_of<Attention<double, Leapfrog<1>, Differential>>(cfg, x_packed, packed, "diff-leapfrog, packed");
        AttentionConfig recompute = cfg;
        recompute.memory = DynamicsMemory::recompute;
        check_gradients_of<Attention<double, Leapfrog<2>, Softmax>>(recompute, x_packed, packed, "leapfrog, packed");
        AttentionConfig reference = cfg;
        reference.reference_kernels = true;
        check_gradients_of<Attention<double, Euler<1>, Differential>>(reference, x_equal, padded, "diff-euler, padded");
      }
  }
}

TEST_CASE("masks: bidirectional attention without positions is permutation-equivariant") {
  const Index T = 9, D = 8;
  const Matrix<double> x = random_rows(T, D, 14);
  std::vector<Index> perm(T);
  std::iota(perm.begin(), perm.end(), 0);
  std::reverse(perm.begin(), perm.end());
  std::swap(perm[1], perm[5]);
  Matrix<double> px(T, D);
  for (Index t = 0; t < T; ++t) px.row(t) = x.row(perm[t]);
  auto check = [&](auto layer) {
    const Matrix<double> y = layer.forward(x, 1), py = layer.forward(px, 1);
    for (Index t = 0; t < T; ++t) CHECK((py.row(t) - y.row(perm[t])).cwiseAbs().maxCoeff() < 1e-12);
  };
  check(Attention<double, Leapfrog<2>, Softmax>(masked_config(false, 0), 2));
  check(Attention<double, Affine<1>, Differential>(masked_config(false, 0), 2));
  // ... and the causal layer is not
  const Attention<double, Identity, Softmax> causal(masked_config(true, 0), 2);
  CHECK((causal.forward(px, 1).row(0) - causal.forward(x, 1).row(perm[0])).cwiseAbs().maxCoeff() > 1e-6);
}

TEST_CASE("masks: a window ignores the tokens beyond it (bitwise)") {
  const Index T = 140, D = 8, w = 5;
  const Matrix<double> x = random_rows(T, D, 15);
  for (bool causal : {true, false}) {
    const Attention<double, Leapfrog<1>, Softmax> layer(masked_config(causal, w), 3);
    const Matrix<double> y = layer.forward(x, 1);
    const Index t = 100;
    Matrix<double> changed = x;
    for (Index s = 0; s < T; ++s)
      if (s <= t - w || (!causal && s >= t + w) || (causal && s > t)) changed.row(s) *= -3.0;
    const Matrix<double> yc = layer.forward(changed, 1);
    INFO("causal " << causal);
    CHECK(yc.row(t) == y.row(t));
    CHECK((yc.row(t + w) - y.row(t + w)).cwiseAbs().maxCoeff() > 1e-6);  // its neighbours do see them
  }
}

TEST_CASE("masks: padding changes nothing, outputs zero and gets zero gradient") {
  const Index T = 7, D = 8;
  const Sequences seqs = Sequences::padded(T, {7, 4, 1});
  const Matrix<double> x = random_rows(3 * T, D, 16), dy = random_rows(3 * T, D, 17);
  Matrix<double> other = x;  // different padding rows
  for (Index b = 0; b < 3; ++b)
    for (Index t = seqs.length(b); t < T; ++t) other.row(b * T + t) = random_rows(1, D, 100 + b * T + t);
  auto check = [&](auto tag, AttentionConfig cfg) {
    using Layer = typename decltype(tag)::type;
    for (bool causal : {true, false}) {
      cfg.causal = causal;
      const Layer layer(cfg, 4);
      typename Layer::Context c1, c2;
      const Matrix<double> y1 = layer.forward(x, seqs, &c1), y2 = layer.forward(other, seqs, &c2);
      auto g1 = layer.zero_gradients(), g2 = layer.zero_gradients();
      const Matrix<double> dx1 = layer.backward(c1, dy, g1), dx2 = layer.backward(c2, dy, g2);
      INFO(Layer::integrator::name << " + " << Layer::scoring::name << ", causal " << causal);
      for (Index b = 0; b < 3; ++b)
        for (Index t = 0; t < T; ++t) {
          const Index r = b * T + t;
          if (t < seqs.length(b)) {
            CHECK(y1.row(r) == y2.row(r));
            CHECK(dx1.row(r) == dx2.row(r));
          } else {
            CHECK(y1.row(r).isZero(0));
            CHECK(dx1.row(r).isZero(0));
            CHECK(dx2.row(r).isZero(0));
          }
        }
      std::vector<TensorView<double>> v1, v2;
      append_views<double>(g1, "", v1);
      append_views<double>(g2, "", v2);
      for (std::size_t i = 0; i < v1.size(); ++i)
        for (Index j = 0; j < v1[i].size(); ++j) CHECK(std::abs(v1[i].data[j] - v2[i].data[j]) < 1e-13);
      // each valid row equals its sequence run alone
      for (Index b = 0; b < 3; ++b) {
        const Index L = seqs.length(b);
        const Matrix<double> alone = layer.forward(x.middleRows(b * T, L), 1);
        CHECK((alone - y1.middleRows(b * T, L)).cwiseAbs().maxCoeff() < 1e-13);
      }
    }
  };
  struct A {
    using type = Attention<double, Leapfrog<2>, Softmax>;
  };
  struct B {
    using type = Attention<double, Affine<1>, Differential>;
  };
  AttentionConfig cfg = masked_config(true, 0);
  check(A{}, cfg);
  check(B{}, cfg);
  cfg.positions = Positions::rope;
  check(A{}, cfg);
  cfg.reference_kernels = true;
  check(B{}, cfg);
}

TEST_CASE("masks: a packed batch equals its sequences run one by one") {
  const Index D = 8;
  const std::vector<Index> offsets{0, 5, 6, 77, 80};
  const Sequences seqs = Sequences::packed(offsets);
  const Matrix<double> x = random_rows(offsets.back(), D, 18);
  for (const MaskCase& m : mask_cases)
    for (Positions pos : {Positions::none, Positions::rope}) {
      AttentionConfig cfg = masked_config(m.causal, m.window);
      cfg.positions = pos;
      const Attention<double, NewtonLeapfrog<1, SiluForce>, Differential> layer(cfg, 6);
      const Matrix<double> y = layer.forward(x, seqs);
      INFO("mask " << describe(cfg) << ", positions " << to_string(pos));
      for (Index b = 0; b + 1 < static_cast<Index>(offsets.size()); ++b) {
        const Index r0 = offsets[b], L = offsets[b + 1] - r0;
        CHECK((layer.forward(x.middleRows(r0, L), 1) - y.middleRows(r0, L)).cwiseAbs().maxCoeff() < 1e-13);
      }
    }
}

TEST_CASE("masks: with rope after the dynamics, scores depend only on t - t'") {
  // The layer's evolved, rotated q, k (context) are un-rotated and rotated again with every
  // position shifted by s: every score q_t . k_t' is unchanged.
  const Index T = 11, D = 8, H = 2, d = D / H;
  AttentionConfig cfg = masked_config(false, 0, D, H);
  cfg.positions = Positions::rope;
  cfg.rope_base = 50.0;
  const Attention<double, Leapfrog<2>, Softmax> layer(cfg, 7);
  const Matrix<double> x = random_rows(T, D, 19);
  Attention<double, Leapfrog<2>, Softmax>::Context c;
  layer.forward(x, 1, &c);
  for (Index shift : {1, 5, 1000}) {
    Matrix<double> q = c.q, k = c.k;
    const Rope<double> at0(d, T, cfg.rope_base), shifted(d, T, cfg.rope_base, shift);
    at0.rotate(q, T, true);
    at0.rotate(k, T, true);
    shifted.rotate(q, T);
    shifted.rotate(k, T);
    for (Index h = 0; h < H; ++h) {
      const Matrix<double> s0 = c.q.middleCols(h * d, d) * c.k.middleCols(h * d, d).transpose();
      const Matrix<double> s1 = q.middleCols(h * d, d) * k.middleCols(h * d, d).transpose();
      CHECK((s0 - s1).cwiseAbs().maxCoeff() < 1e-11);
    }
  }
}

TEST_CASE("masks: decoding equals the full forward with a window and with rope") {
  const Index B = 2, T = 9, D = 8;
  const Matrix<double> x = random_rows(B * T, D, 20);
  for (Index w : {0, 1, 3})
    for (Positions pos : {Positions::none, Positions::rope}) {
      AttentionConfig cfg = masked_config(true, w);
      cfg.positions = pos;
      const Attention<double, Leapfrog<2>, Differential> layer(cfg, 8);
      const Matrix<double> y = layer.forward(x, B);
      auto cache = layer.make_cache(B, T);
      INFO("window " << w << ", positions " << to_string(pos));
      for (Index t = 0; t < T; ++t) {
        Matrix<double> row(B, D);
        for (Index b = 0; b < B; ++b) row.row(b) = x.row(b * T + t);
        const Matrix<double> out = layer.decode(row, cache);
        for (Index b = 0; b < B; ++b) CHECK((out.row(b) - y.row(b * T + t)).cwiseAbs().maxCoeff() < 1e-12);
      }
    }
}

namespace {
/// Softmax that does not read masks (a consumer's scoring written before them).
struct MaskBlindSoftmax : Softmax {
  static constexpr const char* name = "mask-blind softmax";
  static constexpr bool supports_masks = false;
};
}  // namespace

TEST_CASE("masks: what is refused, with the value seen") {
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  auto has = [](const std::string& msg, const char* part) {
    INFO("message: " << msg);
    CHECK(msg.find(part) != std::string::npos);
  };
  has(message([] { Attention<float, Identity, Softmax> l(masked_config(true, -1), 1); }),
      "window must be >= 0 (0 means no window); got -1");
  has(message([] { Attention<float, Identity, MaskBlindSoftmax> l(masked_config(false, 0), 1); }),
      "the mask 'bidirectional' needs a scoring that reads masks; 'mask-blind softmax' does not");
  CHECK(message([] { Attention<float, Identity, MaskBlindSoftmax> l(masked_config(true, 0), 1); }).empty());
  has(message([] { Sequences::padded(5, {5, 6}); }), "length of sequence 1 is 6; expected 1..5");
  has(message([] { Sequences::padded(5, {0}); }), "length of sequence 0 is 0; expected 1..5");
  has(message([] { Sequences::packed({0, 3, 3}); }), "offsets[1] = 3, offsets[2] = 3");
  has(message([] { Sequences::packed({1, 3}); }), "must start at 0; got 1");
  has(message([] { Sequences::packed({0}); }), "hold 1 value(s); expected B+1 >= 2");
  const Attention<double, Identity, Softmax> layer(masked_config(false, 0), 1);
  has(message([&] { layer.forward(random_rows(9, 8, 1), Sequences::packed({0, 4, 8})); }),
      "x has 9 rows; the packed sequences hold 8 (2 sequences)");
  has(message([&] { layer.forward(random_rows(9, 8, 1), Sequences::padded(5, {5, 2})); }),
      "x has 9 rows; the padded sequences hold 10 (2 sequences of 5 rows)");
  auto cache = layer.make_cache(1, 4);
  has(message([&] { layer.decode(random_rows(1, 8, 1), cache); }),
      "the layer is bidirectional (mask 'bidirectional'): a token attends to later tokens");
}
