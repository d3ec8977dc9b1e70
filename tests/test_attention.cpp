// Layer-level properties: causality, exact reduction to standard attention at initialisation,
// float against double, recompute against store, parameter counts, the registry.
#include <doctest/doctest.h>

// The calls by name (make_attention<float/double>) go to the compiled table (coupledqk::variants_layers,
// built once for the whole project), so this file does not instantiate every variant again.
#include <coupledqk/variants.hpp>

#include <coupledqk/testing/gradcheck.hpp>

#include "policies.hpp"

using namespace cqk_test;

namespace {
constexpr Index kB = 2, kT = 6, kD = 16, kH = 4, kM = 8;

// The standard (Identity) layer with the same scoring as V.
template <class V>
using Baseline = Attention<double, Identity, typename V::scoring>;
}  // namespace

TEST_CASE_TEMPLATE_DEFINE("causality: outputs at t ignore tokens after t", V, causality_id) {
  const auto layer = random_layer<double, V>(kD, kH, kM, 3);
  Rng rng(4);
  const Matrix<double> x = random_matrix<double>(kB * kT, kD, rng);
  const Matrix<double> y = layer.forward(x, kB);
  for (Index t = 0; t < kT - 1; ++t) {
    Matrix<double> x2 = x;
    for (Index b = 0; b < kB; ++b) x2.block(b * kT + t + 1, 0, kT - t - 1, kD) = random_matrix<double>(kT - t - 1, kD, rng);
    const Matrix<double> y2 = layer.forward(x2, kB);
    for (Index b = 0; b < kB; ++b) {
      INFO("t = ", t, ", b = ", b);
      CHECK((y2.block(b * kT, 0, t + 1, kD).array() == y.block(b * kT, 0, t + 1, kD).array()).all());
      CHECK((y2.block(b * kT + t + 1, 0, kT - t - 1, kD) - y.block(b * kT + t + 1, 0, kT - t - 1, kD)).norm() > 0);
    }
  }
}
TEST_CASE_TEMPLATE_APPLY(causality_id, Variants);

TEST_CASE_TEMPLATE_DEFINE("zero-initialised dynamics reproduce standard attention bit for bit", V, zero_id) {
  AttentionConfig cfg;
  cfg.dim = kD;
  cfg.heads = kH;
  cfg.hidden = kM;
  cfg.layer_index = 2;
  cfg.init_std = 0.3;
  cfg.memory = V::memory;  // dynamics_init_scale = 0: the spec's initialisation
  Attention<double, typename V::integrator, typename V::scoring> coupled(cfg, 5);
  Baseline<V> standard(cfg, 6);
  // Same projections and scoring parameters; the dynamics keep their (random W, U, P*1) init.
  standard.params.wq = coupled.params.wq;
  standard.params.wk = coupled.params.wk;
  standard.params.wv = coupled.params.wv;
  standard.params.wo = coupled.params.wo;
  standard.params.score = coupled.params.score;
  // The velocity family (spec 3c) starts at q' = q + tau k, not the identity: standard attention
  // with Wq + tau Wk (tau = init_time for every head), equal to round-off, not bit for bit.
  constexpr bool velocity = is_velocity_family<typename V::integrator>;
  if constexpr (velocity) standard.params.wq = coupled.params.wq + cfg.init_time * coupled.params.wk;
  Rng rng(7);
  const Matrix<double> x = random_matrix<double>(kB * kT, kD, rng), dy = random_matrix<double>(kB * kT, kD, rng);
  typename decltype(coupled)::Context cc;
  typename Baseline<V>::Context sc;
  const Matrix<double> yc = coupled.forward(x, kB, &cc), ys = standard.forward(x, kB, &sc);
  auto gc = coupled.zero_gradients();
  auto gs = standard.zero_gradients();
  const Matrix<double> dxc = coupled.backward(cc, dy, gc), dxs = standard.backward(sc, dy, gs);
  if constexpr (velocity) {
    CHECK((yc - ys).cwiseAbs().maxCoeff() <= 1e-12 * ys.cwiseAbs().maxCoeff());
    CHECK((dxc - dxs).cwiseAbs().maxCoeff() <= 1e-12 * dxs.cwiseAbs().maxCoeff());
    CHECK((gc.wq - gs.wq).cwiseAbs().maxCoeff() <= 1e-12 * gs.wq.cwiseAbs().maxCoeff());
  } else {
    CHECK((yc.array() == ys.array()).all());
    CHECK((dxc.array() == dxs.array()).all());
    CHECK((gc.wq.array() == gs.wq.array()).all());
  }
}
TEST_CASE_TEMPLATE_APPLY(zero_id, Variants);

TEST_CASE_TEMPLATE_DEFINE("float agrees with double to float precision", V, float_id) {
  const auto ld = random_layer<double, V>(kD, kH, kM, 8);
  Attention<float, typename V::integrator, typename V::scoring> lf(ld.config(), 0);
  std::vector<TensorView<double>> pd;
  std::vector<TensorView<float>> pf;
  append_views<double>(const_cast<decltype(ld.params)&>(ld.params), "", pd);
  append_views<float>(lf.params, "", pf);
  REQUIRE(pd.size() == pf.size());
  for (std::size_t i = 0; i < pd.size(); ++i)
    for (Index j = 0; j < pd[i].size(); ++j) pf[i].data[j] = static_cast<float>(pd[i].data[j]);
  Rng rng(9);
  const Matrix<double> x = random_matrix<double>(kB * kT, kD, rng), dy = random_matrix<double>(kB * kT, kD, rng);
  typename std::decay_t<decltype(ld)>::Context cd;
  typename decltype(lf)::Context cf;
  const Matrix<double> yd = ld.forward(x, kB, &cd);
  const Matrix<float> yf = lf.forward(x.cast<float>(), kB, &cf);
  auto gd = ld.zero_gradients();
  auto gf = lf.zero_gradients();
  const Matrix<double> dxd = ld.backward(cd, dy, gd);
  const Matrix<float> dxf = lf.backward(cf, dy.cast<float>(), gf);
  // A few hundred float operations deep: allow 200 ulp of the largest entry.
  const double tol = 200 * std::numeric_limits<float>::epsilon();
  CHECK(testing::max_relative_error(yf.cast<double>(), yd) <= tol);
  CHECK(testing::max_relative_error(dxf.cast<double>(), dxd) <= tol);
}
TEST_CASE_TEMPLATE_APPLY(float_id, Variants);

TEST_CASE("recompute mode gives the gradients of store mode") {
  using Store = Variant<Leapfrog<3>, Differential>;
  using Recompute = Variant<Leapfrog<3>, Differential, DynamicsMemory::recompute>;
  auto ls = random_layer<double, Store>(kD, kH, kM, 12);
  auto lr = random_layer<double, Recompute>(kD, kH, kM, 12);
  Rng rng(13);
  const Matrix<double> x = random_matrix<double>(kB * kT, kD, rng), dy = random_matrix<double>(kB * kT, kD, rng);
  decltype(ls)::Context cs;
  decltype(lr)::Context cr;
  CHECK((ls.forward(x, kB, &cs).array() == lr.forward(x, kB, &cr).array()).all());
  for (const auto& trace : cr.dynamics) CHECK(trace.states.empty());  // nothing stored
  REQUIRE(!cs.dynamics.empty());
  for (const auto& trace : cs.dynamics) CHECK(trace.states.size() == 7);  // 4 kicks + 3 drifts
  auto gs = ls.zero_gradients();
  auto gr = lr.zero_gradients();
  CHECK(testing::max_relative_error(lr.backward(cr, dy, gr), ls.backward(cs, dy, gs)) <= 1e-12);
  CHECK(testing::max_relative_error(gr.dyn.W, gs.dyn.W) <= 1e-12);
  CHECK(testing::max_relative_error(gr.rho, gs.rho) <= 1e-12);
}

TEST_CASE("parameter counts follow the spec") {
  AttentionConfig cfg;
  cfg.dim = 512;
  cfg.heads = 8;  // d = m = 64
  const auto lf = make_attention<float>("leapfrog", 1, cfg);
  const auto st = make_attention<float>("standard", 1, cfg);
  const auto un = make_attention<float>("uncoupled", 1, cfg);
  CHECK(st->parameter_count() == 4 * 512 * 512);
  CHECK(st->dynamics_parameter_count() == 0);
  // 2 (m d + 2 m) + H per layer: 8,456; 8 layers = 67,648 (0.11% of a 60M model)
  CHECK(lf->dynamics_parameter_count() == 8456);
  CHECK(8 * lf->dynamics_parameter_count() == 67648);
  CHECK(lf->parameter_count() == 4 * 512 * 512 + 8456);
  // Uncoupled: 2 (m/2 d + m/2 + d m/2) + H = 2 m d + m + H = 8,264 (2.3% fewer, see docs/method.md)
  CHECK(un->dynamics_parameter_count() == 8264);
  const auto df = make_attention<float>("diff-euler", 2, cfg);
  CHECK(df->parameter_count() == 4 * 512 * 512 + 8456 + 4 * 64 + 128);
}

TEST_CASE("registry: every name and step count maps to a working layer") {
  AttentionConfig cfg;
  cfg.dim = 8;
  cfg.heads = 2;
  Rng rng(1);
  const Matrix<double> x = random_matrix<double>(3 * 2, 8, rng);
  for (const auto& name : attention_names())
    for (int steps = 1; steps <= max_steps; ++steps) {
      auto layer = make_attention<double>(name, steps, cfg, 1);
      REQUIRE(layer);
      CHECK(layer->name() == name);
      CHECK(layer->steps() == steps);
      CHECK(layer->forward(x, 3).rows() == 6);
      CHECK(layer->backward(x).cols() == 8);
      const bool coupled = name != "standard" && name != "diff";
      CHECK((layer->dynamics_parameter_count() > 0) == coupled);
      const auto views = layer->parameters();
      CHECK(views.size() == layer->gradients().size());
      CHECK(views.front().name == "wq");
    }
}

TEST_CASE_TEMPLATE_DEFINE("decoding with a KV cache matches the full forward", V, decode_id) {
  const auto layer = random_layer<double, V>(kD, kH, kM, 14);
  Rng rng(15);
  const Matrix<double> x = random_matrix<double>(kB * kT, kD, rng);
  const Matrix<double> y = layer.forward(x, kB);
  auto cache = layer.make_cache(kB, kT);
  for (Index t = 0; t < kT; ++t) {
    Matrix<double> xt(kB, kD);
    for (Index b = 0; b < kB; ++b) xt.row(b) = x.row(b * kT + t);
    const Matrix<double> yt = layer.decode(xt, cache);
    for (Index b = 0; b < kB; ++b) {
      INFO("t = ", t, ", b = ", b);
      CHECK(testing::max_relative_error(yt.row(b), y.row(b * kT + t)) <= 1e-12);
    }
  }
  CHECK(cache.length == kT);
  CHECK_THROWS_AS(layer.decode(Matrix<double>::Zero(kB, kD), cache), coupledqk::invalid_argument);
}
TEST_CASE_TEMPLATE_APPLY(decode_id, Variants);

TEST_CASE_TEMPLATE_DEFINE("tiled (flash) scoring kernels agree with the reference path", V, flash_id) {
  // T = 150: three query/key tiles of 64, the last one partial.
  const Index B = 2, T = 150;
  auto fast = random_layer<double, V>(kD, kH, kM, 16);
  AttentionConfig cfg = fast.config();
  cfg.reference_kernels = true;
  Attention<double, typename V::integrator, typename V::scoring> ref(cfg, 0);
  ref.params = fast.params;
  Rng rng(17);
  const Matrix<double> x = random_matrix<double>(B * T, kD, rng), dy = random_matrix<double>(B * T, kD, rng);
  typename decltype(ref)::Context cf, cr;
  const Matrix<double> yf = fast.forward(x, B, &cf), yr = ref.forward(x, B, &cr);
  CHECK(testing::max_relative_error(yf, yr) <= 1e-12);
  if constexpr (std::is_same_v<typename V::scoring, Softmax>) {
    CHECK(cf.scoring.probs.empty());  // the fast path keeps log-sum-exps, not probabilities
    CHECK(cf.scoring.lse.size() == B * kH * T);
    CHECK(cr.scoring.probs.size() == static_cast<std::size_t>(B * kH));
  } else {
    CHECK(cf.scoring.probs1.empty());
    CHECK(cf.scoring.lse1.size() == B * (kH / 2) * T);
  }
  auto gf = fast.zero_gradients();
  auto gr = ref.zero_gradients();
  CHECK(testing::max_relative_error(fast.backward(cf, dy, gf), ref.backward(cr, dy, gr)) <= 1e-12);
  CHECK(testing::max_relative_error(gf.wq, gr.wq) <= 1e-12);
  CHECK(testing::max_relative_error(gf.wv, gr.wv) <= 1e-12);
  if constexpr (std::is_same_v<typename V::scoring, Differential>) {
    CHECK(testing::max_relative_error(gf.score.lq1, gr.score.lq1) <= 1e-10);
    CHECK(testing::max_relative_error(gf.score.subln, gr.score.subln) <= 1e-12);
  }
}
TEST_CASE_TEMPLATE_APPLY(flash_id, Variants);

#ifdef _OPENMP
TEST_CASE("results do not depend on the thread count") {
  using V = Variant<Leapfrog<2>, Differential>;
  auto layer = random_layer<float, V>(kD, kH, kM, 18);
  Rng rng(19);
  const Matrix<float> x = random_matrix<float>(3 * 100, kD, rng), dy = random_matrix<float>(3 * 100, kD, rng);
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    decltype(layer)::Context ctx;
    Matrix<float> y = layer.forward(x, 3, &ctx);
    auto grad = layer.zero_gradients();
    Matrix<float> dx = layer.backward(ctx, dy, grad);
    return std::make_tuple(y, dx, Matrix<float>(grad.dyn.W), Vector<float>(grad.rho));
  };
  const int before = omp_get_max_threads();
  const auto one = run(1), two = run(2);
  omp_set_num_threads(before);
  CHECK((std::get<0>(one).array() == std::get<0>(two).array()).all());
  CHECK((std::get<1>(one).array() == std::get<1>(two).array()).all());
  CHECK((std::get<2>(one).array() == std::get<2>(two).array()).all());
  CHECK((std::get<3>(one).array() == std::get<3>(two).array()).all());
}
#endif

TEST_CASE("dynamics diagnostics: tau from rho, the displacement recomputed by hand, zero at the identity") {
  using L = Variant<Leapfrog<2>, Softmax>;
  const auto layer = random_layer<double, L>(kD, kH, kM, 21);
  Rng rng(22);
  const Matrix<double> x = random_matrix<double>(kB * kT, kD, rng);
  const LayerDynamics d = layer.dynamics_diagnostics(x, kB);
  REQUIRE(d.tau.size() == static_cast<std::size_t>(kH));
  for (Index h = 0; h < kH; ++h) CHECK(d.tau[static_cast<std::size_t>(h)] == doctest::Approx(std::log1p(std::exp(layer.params.rho(h)))));
  // by hand: Q = x Wq before the dynamics, Q' from the forward's context, per (token, head) pair
  decltype(layer)::Context c;
  layer.forward(x, kB, &c);
  const Matrix<double> q0 = x * layer.params.wq, k0 = x * layer.params.wk;
  const Index hd = kD / kH;
  double sq = 0, sk = 0;
  for (Index r = 0; r < kB * kT; ++r)
    for (Index h = 0; h < kH; ++h) {
      sq += (c.q.row(r).segment(h * hd, hd) - q0.row(r).segment(h * hd, hd)).norm() / q0.row(r).segment(h * hd, hd).norm();
      sk += (c.k.row(r).segment(h * hd, hd) - k0.row(r).segment(h * hd, hd)).norm() / k0.row(r).segment(h * hd, hd).norm();
    }
  CHECK(d.pairs == kB * kT * kH);
  CHECK(d.q_displacement == doctest::Approx(sq / static_cast<double>(kB * kT * kH)).epsilon(1e-12));
  CHECK(d.k_displacement == doctest::Approx(sk / static_cast<double>(kB * kT * kH)).epsilon(1e-12));
  CHECK(d.q_displacement > 1e-3);
  // the spec's initialisation (dynamics_init_scale 0) is exactly the identity
  AttentionConfig cfg = layer.config();
  cfg.dynamics_init_scale = 0;
  const Attention<double, Leapfrog<2>, Softmax> zero(cfg, 3);
  const LayerDynamics z = zero.dynamics_diagnostics(x, kB);
  CHECK(z.q_displacement == 0);
  CHECK(z.k_displacement == 0);
  CHECK(z.tau.size() == static_cast<std::size_t>(kH));
  // standard attention has no dynamics
  const Attention<double, Identity, Softmax> standard(cfg, 3);
  const LayerDynamics s = standard.dynamics_diagnostics(x, kB);
  CHECK(s.tau.empty());
  CHECK(s.q_displacement == 0);
}
