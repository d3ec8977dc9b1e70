// The invertible affine coupling (method spec section 3b): exact inverse, log-determinant,
// volume preservation, identity at initialisation, float against double, gradients in the
// recompute mode for the combinations tests/policies.hpp leaves out, parameter counts, errors.
// (Gradients, causality, decoding and the reduction to standard attention run over the typed
// lists of tests/policies.hpp, which hold Affine<1, 2, 3, 7>.)
#include <doctest/doctest.h>

// The calls by name (make_attention<float/double>) go to the compiled table (coupledqk::variants_layers,
// built once for the whole project), so this file does not instantiate every variant again.
#include <coupledqk/variants.hpp>

#include <Eigen/LU>
#include <cstdio>
#include <limits>

#include <coupledqk/model/gpt.hpp>
#include <coupledqk/testing/gradcheck.hpp>
#include <coupledqk/testing/properties.hpp>

#include "policies.hpp"

using namespace cqk_test;
namespace t = coupledqk::testing;

namespace {

constexpr Index kD = 5, kM = 7, kP = 9;

using AffineSteps = std::tuple<Affine<1>, Affine<2>, Affine<3>, Affine<7>>;

/// O(1) conditioners: every s and t clearly non-zero.
template <class I>
AffineParameters<double> active_parameters(std::uint64_t seed, double scale = 0.7) {
  Rng rng(seed);
  auto p = I::template make_parameters<double>(DynamicsShape{kD, kM, scale}, rng);
  perturb(p, rng, 0.1);  // non-zero a too
  return p;
}

/// The [2d, 2d] Jacobian d(q', k') / d(q, k) of one pair by central differences of the forward.
template <class I>
Matrix<double> numeric_jacobian(const AffineParameters<double>& p, const Matrix<double>& q0,
                                const Matrix<double>& k0, double tau, double eps = 1e-6) {
  const Index d = q0.cols();
  Matrix<double> J(2 * d, 2 * d);
  auto run = [&](Index i, double delta) {
    Matrix<double> q = q0, k = k0;
    (i < d ? q(0, i) : k(0, i - d)) += delta;
    t::flow<I, double>(p, tau, q, k);
    Matrix<double> out(1, 2 * d);
    out << q, k;
    return out;
  };
  for (Index i = 0; i < 2 * d; ++i) J.col(i) = ((run(i, eps) - run(i, -eps)) / (2 * eps)).transpose();
  return J;
}

template <class V>
double max_abs(const V& v) {
  return v.cwiseAbs().maxCoeff();
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("affine: inverse(forward(q, k)) = (q, k) to round-off in double", I, inverse_id) {
  const auto p = active_parameters<I>(3);
  Rng rng(4);
  const Matrix<double> q0 = random_matrix<double>(kP, kD, rng), k0 = random_matrix<double>(kP, kD, rng);
  Vector<double> tau(kP);
  for (Index r = 0; r < kP; ++r) tau[r] = 0.3 + 0.2 * r;  // a different time per row
  Matrix<double> q = q0, k = k0;
  I::template forward<double>(p, tau, q, k, nullptr, DynamicsMemory::store);
  const double moved = std::max(max_abs(q - q0), max_abs(k - k0));
  CHECK(moved > 0.1);  // the map does something
  I::template inverse<double>(p, tau, q, k);
  const double err = std::max(max_abs(q - q0), max_abs(k - k0));
  INFO("Affine<", I::steps, ">: moved by ", moved, ", inverse error ", err);
  CHECK(err <= 1e-13);
  // and the other way round: forward(inverse(q, k)) = (q, k)
  I::template inverse<double>(p, tau, q, k);
  I::template forward<double>(p, tau, q, k, nullptr, DynamicsMemory::store);
  CHECK(std::max(max_abs(q - q0), max_abs(k - k0)) <= 1e-13);
}
TEST_CASE_TEMPLATE_APPLY(inverse_id, AffineSteps);

TEST_CASE_TEMPLATE_DEFINE("affine: log|det J| from the formula equals that of the numerical Jacobian", I, logdet_id) {
  const auto p = active_parameters<I>(5);
  Rng rng(6);
  for (int trial = 0; trial < 3; ++trial) {
    const Matrix<double> q = random_matrix<double>(1, kD, rng), k = random_matrix<double>(1, kD, rng);
    const double tau = 0.9;
    const double formula = I::template log_det<double>(p, Vector<double>::Constant(1, tau), q, k)[0];
    const Matrix<double> Jn = numeric_jacobian<I>(p, q, k, tau);
    const double numeric = std::log(std::abs(Jn.determinant()));
    // the analytic Jacobian (the policy's backward) too, store and recompute
    const Matrix<double> Js = t::jacobian<I, double>(p, q, k, tau, DynamicsMemory::store);
    const Matrix<double> Jr = t::jacobian<I, double>(p, q, k, tau, DynamicsMemory::recompute);
    INFO("Affine<", I::steps, ">: formula ", formula, ", numerical ", numeric, ", analytic ",
         std::log(std::abs(Js.determinant())));
    CHECK(std::abs(formula) > 1e-3);  // volume does change
    CHECK(std::abs(formula - numeric) <= 1e-7);
    CHECK(std::abs(formula - std::log(std::abs(Js.determinant()))) <= 1e-12);
    // the whole Jacobian from the backward agrees with the differences, not only its determinant
    CHECK(max_abs(Js - Jn) <= 1e-7 * std::max(1.0, max_abs(Jn)));
    CHECK(max_abs(Js - Jr) <= 1e-12);
  }
}
TEST_CASE_TEMPLATE_APPLY(logdet_id, AffineSteps);

TEST_CASE_TEMPLATE_DEFINE("affine: volume-preserving (det J = 1) when S = s0 = 0", I, volume_id) {
  auto p = active_parameters<I>(7);
  for (auto* c : {&p.k, &p.q}) {
    c->S.setZero();
    c->s.setZero();
  }
  Rng rng(8);
  const Matrix<double> q = random_matrix<double>(1, kD, rng), k = random_matrix<double>(1, kD, rng);
  CHECK(I::template log_det<double>(p, Vector<double>::Constant(1, 0.8), q, k)[0] == 0.0);
  const Matrix<double> J = t::jacobian<I, double>(p, q, k, 0.8);
  INFO("det J = ", J.determinant());
  CHECK(std::abs(J.determinant() - 1.0) <= 1e-12);
  CHECK(t::coupling_strength<I, double>(p, q, k, 0.8) > 1e-3);  // still coupled through the shifts
  CHECK(std::abs(numeric_jacobian<I>(p, q, k, 0.8).determinant() - 1.0) <= 1e-8);
}
TEST_CASE_TEMPLATE_APPLY(volume_id, AffineSteps);

TEST_CASE_TEMPLATE_DEFINE("affine: the initialisation is exactly the identity map", I, identity_id) {
  Rng rng(9);
  const auto p = I::template make_parameters<float>(DynamicsShape{kD, kM, 0.0}, rng);  // spec init
  CHECK(max_abs(p.k.A) > 0);  // A is random, the rest zero
  Matrix<float> q0(kP, kD), k0(kP, kD);
  rng.fill_normal(q0, 3.0);
  rng.fill_normal(k0, 3.0);
  Matrix<float> q = q0, k = k0;
  I::template forward<float>(p, Vector<float>::Constant(kP, 1.3f), q, k, nullptr, DynamicsMemory::store);
  CHECK((q.array() == q0.array()).all());
  CHECK((k.array() == k0.array()).all());
}
TEST_CASE_TEMPLATE_APPLY(identity_id, AffineSteps);

TEST_CASE_TEMPLATE_DEFINE("affine: float forward and backward agree with double", I, float_id) {
  const auto pd = active_parameters<I>(10);
  Rng init(1);
  auto pf = I::template make_parameters<float>(DynamicsShape{kD, kM, 0.0}, init);
  {  // pf = pd in float, tensor by tensor in visit order
    std::vector<const double*> src;
    std::vector<Index> sizes;
    pd.visit([&](const char*, const auto& x) {
      src.push_back(x.data());
      sizes.push_back(x.size());
    });
    std::size_t i = 0;
    pf.visit([&](const char*, auto& x) {
      REQUIRE(x.size() == sizes[i]);
      for (Index j = 0; j < x.size(); ++j) x.data()[j] = static_cast<float>(src[i][j]);
      ++i;
    });
  }
  Rng rng(11);
  const Matrix<double> q0 = random_matrix<double>(kP, kD, rng), k0 = random_matrix<double>(kP, kD, rng);
  const Matrix<double> dq0 = random_matrix<double>(kP, kD, rng), dk0 = random_matrix<double>(kP, kD, rng);
  const Vector<double> tau = Vector<double>::Constant(kP, 0.7);
  for (const DynamicsMemory memory : {DynamicsMemory::store, DynamicsMemory::recompute}) {
    Matrix<double> qd = q0, kd = k0, dqd = dq0, dkd = dk0;
    Matrix<float> qf = q0.cast<float>(), kf = k0.cast<float>(), dqf = dq0.cast<float>(), dkf = dk0.cast<float>();
    trace_of<I, double> td;
    trace_of<I, float> tf;
    I::template forward<double>(pd, tau, qd, kd, &td, memory);
    I::template forward<float>(pf, tau.cast<float>(), qf, kf, &tf, memory);
    auto gd = zeros_like(pd);
    auto gf = zeros_like(pf);
    Vector<double> dtd = Vector<double>::Zero(kP);
    Vector<float> dtf = Vector<float>::Zero(kP);
    I::template backward<double>(pd, tau, td, qd, kd, dqd, dkd, gd, dtd, memory);
    I::template backward<float>(pf, tau.cast<float>(), tf, qf, kf, dqf, dkf, gf, dtf, memory);
    const double tol = 2e-4 * I::steps;  // a few thousand float epsilons, growing with N
    INFO("Affine<", I::steps, ">, ", to_string(memory));
    CHECK(t::max_relative_error(qf.cast<double>(), qd) <= tol);
    CHECK(t::max_relative_error(kf.cast<double>(), kd) <= tol);
    CHECK(t::max_relative_error(dqf.cast<double>(), dqd) <= tol);
    CHECK(t::max_relative_error(dkf.cast<double>(), dkd) <= tol);
    CHECK(t::max_relative_error(dtf.cast<double>(), dtd) <= tol);
    CHECK(t::max_relative_error(gf.q.S.template cast<double>(), gd.q.S) <= tol);
    CHECK(t::max_relative_error(gf.k.A.template cast<double>(), gd.k.A) <= tol);
  }
}
TEST_CASE_TEMPLATE_APPLY(float_id, AffineSteps);

// tests/policies.hpp runs the recompute mode for (1, Softmax), (2, Differential), (3, Softmax),
// (7, Differential); these are the other four.
using RecomputeRest = std::tuple<Variant<Affine<1>, Differential, DynamicsMemory::recompute>,
                                 Variant<Affine<2>, Softmax, DynamicsMemory::recompute>,
                                 Variant<Affine<3>, Differential, DynamicsMemory::recompute>,
                                 Variant<Affine<7>, Softmax, DynamicsMemory::recompute>>;
TEST_CASE_TEMPLATE_DEFINE("affine layer gradients match central differences, recompute mode", V, recompute_id) {
  const Index B = 2, T = 5, D = 12, H = 4, m = 6;
  auto layer = random_layer<double, V>(D, H, m, 7);
  Rng rng(11);
  const Matrix<double> x = random_matrix<double>(B * T, D, rng), dy = random_matrix<double>(B * T, D, rng);
  const auto errors = t::check_gradients(layer, x, B, dy);
  CHECK(errors.size() == 5 + 13 + (std::is_same_v<typename V::scoring, Differential> ? 5 : 0));
  for (const auto& e : errors) {
    INFO("Affine<", V::integrator::steps, ">, scoring ", V::scoring::name, ", tensor ", e.name, ": rel. error ",
         e.error, ", scale ", e.scale);
    CHECK(e.scale > 1e-8);
    CHECK(e.error <= 1e-6);
  }
}
TEST_CASE_TEMPLATE_APPLY(recompute_id, RecomputeRest);

TEST_CASE("affine: recompute and store give the same layer gradients; recompute keeps nothing") {
  using VS = Variant<Affine<3>, Differential>;
  using VR = Variant<Affine<3>, Differential, DynamicsMemory::recompute>;
  const auto ls = random_layer<double, VS>(16, 4, 8, 12);
  auto lr = random_layer<double, VR>(16, 4, 8, 12);
  lr.params = ls.params;
  Rng rng(13);
  const Matrix<double> x = random_matrix<double>(2 * 70, 16, rng), dy = random_matrix<double>(2 * 70, 16, rng);
  decltype(ls)::Context cs;
  decltype(lr)::Context cr;
  CHECK((ls.forward(x, 2, &cs).array() == lr.forward(x, 2, &cr).array()).all());
  REQUIRE(cr.dynamics.size() == 3);  // 2 * 70 tokens x 4 pairs = 560 pairs: 3 chunks
  for (const auto& trace : cr.dynamics) CHECK(trace.states.empty());
  for (const auto& trace : cs.dynamics) CHECK(trace.states.size() == 6);  // q_s, k_s for 3 steps
  auto gs = ls.zero_gradients();
  auto gr = lr.zero_gradients();
  CHECK(t::max_relative_error(lr.backward(cr, dy, gr), ls.backward(cs, dy, gs)) <= 1e-12);
  CHECK(t::max_relative_error(gr.dyn.q.S, gs.dyn.q.S) <= 1e-12);
  CHECK(t::max_relative_error(gr.dyn.k.A, gs.dyn.k.A) <= 1e-12);
  CHECK(t::max_relative_error(gr.rho, gs.rho) <= 1e-12);
}

TEST_CASE("affine: tensor names and parameter counts follow the spec") {
  AttentionConfig cfg;
  cfg.dim = 512;
  cfg.heads = 8;  // d = m = 64
  const auto af = make_attention<float>("affine", 1, cfg);
  std::vector<std::string> names;
  for (const auto& v : af->parameters()) names.push_back(v.name);
  const std::vector<std::string> expected{"wq",      "wk",      "wv",      "wo",      "dyn.k.A", "dyn.k.a",
                                          "dyn.k.S", "dyn.k.s", "dyn.k.T", "dyn.k.t", "dyn.q.A", "dyn.q.a",
                                          "dyn.q.S", "dyn.q.s", "dyn.q.T", "dyn.q.t", "dyn.rho"};
  CHECK(names == expected);
  // 2 (3 m d + m + 2 d) + H = 2 (12,288 + 64 + 128) + 8 = 24,968 per layer
  CHECK(af->dynamics_parameter_count() == 24968);
  CHECK(af->parameter_count() == 4 * 512 * 512 + 24968);
  cfg.hidden = 32;  // m != d: S, T are [d, m]
  const auto small = make_attention<float>("diff-affine", 2, cfg);
  CHECK(small->dynamics_parameter_count() == 2 * (3 * 32 * 64 + 32 + 2 * 64) + 8);
}

TEST_CASE("parameter report: the affine dynamics' share of a D=512, L=8, H=8 model") {
  GptConfig c;
  c.dim = 512;
  c.layers = 8;
  c.heads = 8;
  c.context = 1024;
  c.attention = "affine";
  // The vocabulary that makes the standard model 60M parameters (the paper's small model):
  // 60,000,000 - (8 (12 D^2 + 9 D) + 1024 D + 2 D) = 34,272,288 = 66,938.1 D.
  c.vocab = 66938;
  const auto r = Gpt<float, Affine<1>, Softmax>(c, 0).parameter_report();
  CHECK(r.dynamics == 8 * 24968);  // 199,744
  std::printf("affine dynamics, D=512 L=8 H=8 (m = d = 64): %lld of %lld parameters = %.3f%%\n",
              static_cast<long long>(r.dynamics), static_cast<long long>(r.total), r.dynamics_percent);
  CHECK(r.dynamics_percent == doctest::Approx(0.33).epsilon(0.02));
  // With GPT-2's vocabulary (50,257 tokens) the same dynamics are a larger share of a smaller model.
  c.vocab = 50257;
  const auto g2 = Gpt<float, Affine<1>, Softmax>(c, 0).parameter_report();
  std::printf("  with a 50,257-token vocabulary: %lld of %lld = %.3f%%\n", static_cast<long long>(g2.dynamics),
              static_cast<long long>(g2.total), g2.dynamics_percent);
}

TEST_CASE("affine: bad input gives a clear error naming the value") {
  auto error_of = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const coupledqk::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  Rng rng(1);
  auto msg = error_of([&] { AffineParameters<double>(DynamicsShape{0, 4, 0.0}, rng); });
  CHECK(msg.find("d = 0") != std::string::npos);
  msg = error_of([&] { AffineParameters<double>(DynamicsShape{4, 0, 0.0}, rng); });
  CHECK(msg.find("m = 0") != std::string::npos);
  AttentionConfig cfg;
  cfg.dim = 8;
  cfg.heads = 2;
  for (int steps : {0, 8, -1}) {
    msg = error_of([&] { make_attention<double>("diff-affine", steps, cfg); });
    CHECK(msg.find("got " + std::to_string(steps)) != std::string::npos);
    CHECK(msg.find("1..7") != std::string::npos);
  }
  auto layer = make_attention<double>("affine", 2, cfg);
  for (auto& v : layer->parameters())
    if (v.name == "dyn.q.S") v.data[3] = std::numeric_limits<double>::infinity();
  msg = error_of([&] { layer->check_parameters(); });
  CHECK(msg.find("dyn.q.S") != std::string::npos);
  CHECK(msg.find("flat index 3") != std::string::npos);
  // shapes that do not match the parameters
  const auto p = Affine<1>::make_parameters<double>(DynamicsShape{4, 3, 0.0}, rng);
  Matrix<double> q = Matrix<double>::Zero(2, 5), k = Matrix<double>::Zero(2, 5);
  msg = error_of([&] { Affine<1>::forward<double>(p, Vector<double>::Ones(2), q, k, nullptr, DynamicsMemory::store); });
  CHECK(msg.find("[2, 5]") != std::string::npos);
}
