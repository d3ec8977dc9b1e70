// The velocity family (method spec section 3c): drift, newton-euler, newton-leapfrog,
// unit-leapfrog. The physics of spec section 5 for each member, what each has and has not, a
// swapped-in force (examples/linear_force.hpp), and checks that fail on a deliberately broken step.
// (Gradients against central differences, causality and the float/double agreement of the table's
// variants run in the typed tests of test_gradients.cpp and test_attention.cpp.)
#include <doctest/doctest.h>

// The calls by name (make_attention<float/double>) go to the compiled table (coupledqk::variants_layers,
// built once for the whole project), so this file does not instantiate every variant again.
#include <coupledqk/variants.hpp>

#include <coupledqk/testing/gradcheck.hpp>
#include <coupledqk/testing/properties.hpp>

#include <Eigen/LU>

#include <cstdio>

#include "linear_force.hpp"
#include "policies.hpp"

using namespace cqk_test;
namespace t = coupledqk::testing;

namespace {

constexpr Index kD = 4, kM = 6;
constexpr double kTau = 0.7;

/// O(1) parameters: every tensor N(0, 1) scale, biases non-zero.
template <class I>
typename I::template parameters<double> active_parameters(std::uint64_t seed) {
  Rng rng(seed);
  auto p = I::template make_parameters<double>(DynamicsShape{kD, kM, 1.0}, rng);
  perturb(p, rng, 0.3);
  return p;
}

/// det of the pair's Jacobian (from the policy's own backward).
template <class I>
double jacobian_det(const typename I::template parameters<double>& p, const Matrix<double>& q,
                    const Matrix<double>& k, double tau) {
  return t::jacobian<I, double>(p, q, k, tau).determinant();
}

struct Pair {
  Matrix<double> q, k;
};
Pair random_pair(std::uint64_t seed) {
  Rng rng(seed);
  return {random_matrix<double>(1, kD, rng), random_matrix<double>(1, kD, rng)};
}

/// A leapfrog whose second half kick is 0.4 h instead of 0.5 h: still a composition of shears
/// (symplectic), but neither symmetric nor second order. Test-only.
struct BrokenKickScheme {
  static constexpr std::array<Stage, 3> stages{
      {{StageKind::kick, 0.5}, {StageKind::drift, 1.0}, {StageKind::kick, 0.4}}};
  static constexpr int order = 2;  // what it claims
  static constexpr const char* name = "broken-unit-leapfrog";
};
template <int N>
struct BrokenUnitLeapfrog : SymplecticSplitting<BrokenKickScheme, N, UnitMassHamiltonian> {};

}  // namespace

TEST_CASE("velocity family: traits as declared in integrators/velocity.hpp") {
  static_assert(CheckIntegrator<Drift<3>>::value && CheckIntegrator<NewtonEuler<3>>::value &&
                CheckIntegrator<NewtonLeapfrog<3>>::value && CheckIntegrator<UnitLeapfrog<3>>::value);
  static_assert(Drift<1>::is_symplectic && Drift<1>::is_reversible && Drift<1>::is_coupled);
  static_assert(!NewtonEuler<1>::is_symplectic && !NewtonEuler<1>::is_reversible && NewtonEuler<1>::order == 1);
  static_assert(!NewtonLeapfrog<1>::is_symplectic && NewtonLeapfrog<1>::is_reversible && NewtonLeapfrog<1>::order == 2);
  static_assert(UnitLeapfrog<1>::is_symplectic && UnitLeapfrog<1>::is_reversible && UnitLeapfrog<1>::order == 2);
  static_assert(is_velocity_family<Drift<2>> && is_velocity_family<NewtonEuler<2>> &&
                is_velocity_family<NewtonLeapfrog<2>> && is_velocity_family<UnitLeapfrog<2>>);
  static_assert(!is_velocity_family<Leapfrog<2>> && !is_velocity_family<Euler<2>> &&
                !is_velocity_family<Identity> && !is_velocity_family<Affine<2>>);
  CHECK(std::string(Drift<2>::name) == "drift");
  CHECK(std::string(NewtonEuler<2>::name) == "newton-euler");
  CHECK(std::string(NewtonLeapfrog<2>::name) == "newton-leapfrog");
  CHECK(std::string(UnitLeapfrog<2>::name) == "unit-leapfrog");
  CHECK(variant_name<NewtonLeapfrog<3>, Differential>() == "diff-newton-leapfrog");
  CHECK(variant_name<Drift<7>, Softmax>() == "drift");
  // FLOPs per pair, d = m = 64: one axpy; N forces + 2N axpys; (N+1) forces + (2N+1) axpys
  CHECK(Drift<7>::flops_per_pair(64, 64) == 128);
  CHECK(NewtonEuler<1>::flops_per_pair(64, 64) == 4 * 64 * 64 + 4 * 64);
  CHECK(NewtonLeapfrog<1>::flops_per_pair(64, 64) == 2 * 4 * 64 * 64 + 3 * 2 * 64);
  CHECK(UnitLeapfrog<3>::flops_per_pair(64, 64) == 4 * 4 * 64 * 64 + 7 * 2 * 64);
  // the N half kicks merge: N + 1 force evaluations, N drifts; drift: one stage whatever N
  CHECK(NewtonLeapfrog<3>::plan.size == 7);
  CHECK(Drift<7>::plan.size == 1);
}

TEST_CASE_TEMPLATE("unit-leapfrog: symplectic and reversible to round-off, energy error of order 2", I,
                   UnitLeapfrog<1>, UnitLeapfrog<2>, UnitLeapfrog<3>, UnitLeapfrog<7>) {
  const auto p = active_parameters<I>(3);
  const Pair s = random_pair(5);
  const double defect = t::symplecticity_defect<I, double>(p, s.q, s.k, kTau);
  const double back = t::reversibility_error<I, double>(p, s.q, s.k, kTau);
  const double order = t::energy_convergence_order<I, double>(p, s.q, s.k, 2.0, 4, 4);
  INFO("steps ", I::steps, ": defect ", defect, ", reversibility ", back, ", fitted order ", order);
  CHECK(defect <= 1e-10);
  CHECK(back <= 1e-13);
  CHECK(std::abs(order - 2.0) <= 0.3);
  const Matrix<double> Js = t::jacobian<I, double>(p, s.q, s.k, kTau, DynamicsMemory::store);
  const Matrix<double> Jr = t::jacobian<I, double>(p, s.q, s.k, kTau, DynamicsMemory::recompute);
  CHECK((Js - Jr).cwiseAbs().maxCoeff() <= 1e-12);
}

TEST_CASE_TEMPLATE("newton-leapfrog: reversible, det J = 1 to round-off, not symplectic for a random force", I,
                   NewtonLeapfrog<1>, NewtonLeapfrog<2>, NewtonLeapfrog<3>, NewtonLeapfrog<7>) {
  const auto p = active_parameters<I>(3);
  const Pair s = random_pair(5);
  const double back = t::reversibility_error<I, double>(p, s.q, s.k, kTau);
  const double det = jacobian_det<I>(p, s.q, s.k, kTau);
  const double defect = t::symplecticity_defect<I, double>(p, s.q, s.k, kTau);
  INFO("steps ", I::steps, ": reversibility ", back, ", det J - 1 = ", det - 1, ", symplecticity defect ", defect);
  CHECK(back <= 1e-13);
  CHECK(std::abs(det - 1) <= 1e-12);
  CHECK(defect > 1e-2);  // clearly non-zero: ~1e10 times the round-off of unit-leapfrog's
  // the recompute backward (walking back with the exact inverse) gives the stored Jacobian
  const Matrix<double> Js = t::jacobian<I, double>(p, s.q, s.k, kTau, DynamicsMemory::store);
  const Matrix<double> Jr = t::jacobian<I, double>(p, s.q, s.k, kTau, DynamicsMemory::recompute);
  CHECK((Js - Jr).cwiseAbs().maxCoeff() <= 1e-12);
  std::printf("newton-leapfrog<%d>: symplecticity defect %.3e, |det J - 1| %.1e, reversibility %.1e\n", I::steps,
              defect, std::abs(det - 1), back);
}

TEST_CASE_TEMPLATE("newton-euler: neither reversible nor symplectic nor volume-preserving", I, NewtonEuler<1>,
                   NewtonEuler<3>, NewtonEuler<7>) {
  const auto p = active_parameters<I>(3);
  const Pair s = random_pair(5);
  Matrix<double> q = s.q, k = s.k;
  t::flow<I, double>(p, kTau, q, k);
  t::flow<I, double>(p, -kTau, q, k);  // running it with -h does not come back
  const double back = std::max((q - s.q).cwiseAbs().maxCoeff(), (k - s.k).cwiseAbs().maxCoeff());
  const double defect = t::symplecticity_defect<I, double>(p, s.q, s.k, kTau);
  const double det = jacobian_det<I>(p, s.q, s.k, kTau);
  INFO("steps ", I::steps, ": -h error ", back, ", defect ", defect, ", det J - 1 = ", det - 1);
  CHECK(back > 1e-4);
  CHECK(defect > 1e-3);
  CHECK(std::abs(det - 1) > 1e-4);
  // its inverse is implicit: the recompute backward is refused, by the policy and by the layer
  Matrix<double> q2 = s.q, k2 = s.k;
  trace_of<I, double> keep;
  CHECK_THROWS_AS(I::template forward<double>(p, Vector<double>::Constant(1, kTau), q2, k2, &keep,
                                              DynamicsMemory::recompute),
                  coupledqk::invalid_argument);
  AttentionConfig cfg;
  cfg.dim = 8;
  cfg.heads = 2;
  cfg.memory = DynamicsMemory::recompute;
  CHECK_THROWS_AS((Attention<double, I, Softmax>(cfg)), coupledqk::invalid_argument);
}

TEST_CASE("newton-leapfrog and newton-euler converge to the same flow, at orders 2 and 1") {
  // End points of the flow over tau = 1 against a fine leapfrog reference: halving h divides the
  // error by 2^order.
  const auto p = active_parameters<NewtonLeapfrog<1>>(21);
  const Pair s = random_pair(22);
  auto end = [&](auto policy, int repeats) {
    using I = decltype(policy);
    Matrix<double> q = s.q, k = s.k;
    for (int r = 0; r < repeats; ++r) t::flow<I, double>(p, 1.0 / repeats, q, k);
    Matrix<double> out(1, 2 * kD);
    out << q, k;
    return out;
  };
  const Matrix<double> ref = end(NewtonLeapfrog<1>{}, 4096);
  const double l1 = (end(NewtonLeapfrog<1>{}, 16) - ref).norm(), l2 = (end(NewtonLeapfrog<1>{}, 32) - ref).norm();
  const double e1 = (end(NewtonEuler<1>{}, 64) - ref).norm(), e2 = (end(NewtonEuler<1>{}, 128) - ref).norm();
  INFO("leapfrog errors ", l1, " ", l2, "; euler errors ", e1, " ", e2);
  CHECK(l1 / l2 == doctest::Approx(4.0).epsilon(0.1));
  CHECK(e1 / e2 == doctest::Approx(2.0).epsilon(0.1));
}

TEST_CASE_TEMPLATE("drift: N steps are one step of time tau, the exact shear q + tau k", I, Drift<1>, Drift<2>,
                   Drift<3>, Drift<7>) {
  const typename I::template parameters<double> p{};
  const Pair s = random_pair(8);
  Matrix<double> q = s.q, k = s.k, q1 = s.q, k1 = s.k;
  t::flow<I, double>(p, kTau, q, k);
  t::flow<Drift<1>, double>(p, kTau, q1, k1);
  const Matrix<double> exact = s.q + kTau * s.k;
  CHECK((q - q1).cwiseAbs().maxCoeff() <= 1e-15);
  CHECK((q - exact).cwiseAbs().maxCoeff() <= 1e-15);
  CHECK((k.array() == s.k.array()).all());
  CHECK(t::symplecticity_defect<I, double>(p, s.q, s.k, kTau) <= 1e-14);
  CHECK(t::reversibility_error<I, double>(p, s.q, s.k, kTau) <= 1e-15);
  // J = [[I, tau I], [0, I]]
  Matrix<double> J = Matrix<double>::Identity(2 * kD, 2 * kD);
  J.block(0, kD, kD, kD) = kTau * Matrix<double>::Identity(kD, kD);
  CHECK((t::jacobian<I, double>(p, s.q, s.k, kTau) - J).cwiseAbs().maxCoeff() <= 1e-15);
}

TEST_CASE_TEMPLATE("at F2 = f2 = 0 (a = 0) every member is q' = q + tau k, k' = k; at tau = 0 the identity", I,
                   Drift<3>, NewtonEuler<1>, NewtonEuler<3>, NewtonLeapfrog<1>, NewtonLeapfrog<7>, UnitLeapfrog<2>,
                   UnitLeapfrog<7>) {
  // the spec's initialisation: dynamics_init_scale = 0
  Rng rng(4);
  const auto p = I::template make_parameters<double>(DynamicsShape{kD, kM, 0.0}, rng);
  Rng xr(6);
  const Matrix<double> q0 = random_matrix<double>(5, kD, xr), k0 = random_matrix<double>(5, kD, xr);
  Vector<double> tau(5);
  tau << 0.3, 1.0, 1.7, 0.01, 2.5;
  Matrix<double> q = q0, k = k0;
  I::template forward<double>(p, tau, q, k, nullptr, DynamicsMemory::store);
  const Matrix<double> exact = q0 + (k0.array().colwise() * tau.array()).matrix();
  CHECK((q - exact).cwiseAbs().maxCoeff() <= 1e-14);
  CHECK((k.array() == k0.array()).all());
  Matrix<double> qz = q0, kz = k0;
  I::template forward<double>(p, Vector<double>::Zero(5), qz, kz, nullptr, DynamicsMemory::store);
  CHECK((qz.array() == q0.array()).all());
  CHECK((kz.array() == k0.array()).all());
}

TEST_CASE("a swapped-in force (examples/linear_force.hpp): symplectic exactly when it is a gradient field") {
  using I = LinearNewtonLeapfrog<3>;
  static_assert(CheckIntegrator<I>::value && !I::is_symplectic && I::is_reversible);
  auto p = active_parameters<I>(13);
  const Pair s = random_pair(14);
  const double general = t::symplecticity_defect<I, double>(p, s.q, s.k, kTau);
  CHECK(general > 1e-2);
  CHECK(std::abs(jacobian_det<I>(p, s.q, s.k, kTau) - 1) <= 1e-12);
  CHECK(t::reversibility_error<I, double>(p, s.q, s.k, kTau) <= 1e-13);
  p.L = (p.L + p.L.transpose()).eval() / 2;  // F = grad of -(q^T L q / 2 + l . q)
  const double conservative = t::symplecticity_defect<I, double>(p, s.q, s.k, kTau);
  INFO("defect ", general, " for a general L, ", conservative, " for a symmetric one");
  CHECK(conservative <= 1e-12);
}

TEST_CASE("a swapped-in force inside the layer: gradients match central differences, both memory modes") {
  for (const DynamicsMemory memory : {DynamicsMemory::store, DynamicsMemory::recompute}) {
    auto check = [&](auto variant) {
      using V = decltype(variant);
      auto layer = random_layer<double, V>(8, 2, 6, 41);
      Rng rng(42);
      const Matrix<double> x = random_matrix<double>(2 * 4, 8, rng), dy = random_matrix<double>(2 * 4, 8, rng);
      for (const auto& e : t::check_gradients(layer, x, 2, dy)) {
        INFO(V::integrator::name, " ", to_string(V::memory), " ", e.name, ": ", e.error);
        CHECK(e.scale > 1e-8);
        CHECK(e.error <= 1e-6);
      }
    };
    if (memory == DynamicsMemory::store) {
      check(Variant<LinearNewtonLeapfrog<2>, Softmax>{});
      check(Variant<LinearNewtonEuler<2>, Differential>{});
    } else {
      check(Variant<LinearNewtonLeapfrog<2>, Differential, DynamicsMemory::recompute>{});
    }
  }
  auto layer = make_attention<double>(linear_force_variants, "linear-newton-leapfrog", 2, [] {
    AttentionConfig c;
    c.dim = 8;
    c.heads = 2;
    return c;
  }());
  const auto views = layer->parameters();
  std::vector<std::string> names;
  for (const auto& v : views) names.push_back(v.name);
  CHECK(names == std::vector<std::string>{"wq", "wk", "wv", "wo", "dyn.L", "dyn.l", "dyn.rho"});
}

TEST_CASE("the physics checks fail on a deliberately broken step (a wrong half kick)") {
  using Good = UnitLeapfrog<2>;
  using Bad = BrokenUnitLeapfrog<2>;
  const auto p = active_parameters<Good>(3);
  const Pair s = random_pair(5);
  // the checks unit-leapfrog passes above
  const double back_good = t::reversibility_error<Good, double>(p, s.q, s.k, kTau);
  const double back_bad = t::reversibility_error<Bad, double>(p, s.q, s.k, kTau);
  const double order_good = t::energy_convergence_order<Good, double>(p, s.q, s.k, 2.0, 4, 4);
  const double order_bad = t::energy_convergence_order<Bad, double>(p, s.q, s.k, 2.0, 4, 4);
  INFO("reversibility ", back_good, " vs broken ", back_bad, "; fitted order ", order_good, " vs broken ", order_bad);
  CHECK(back_good <= 1e-13);
  CHECK_FALSE(back_bad <= 1e-13);  // the reversibility check reports the broken step
  CHECK(back_bad > 1e-3);
  CHECK(std::abs(order_good - 2.0) <= 0.3);
  CHECK_FALSE(std::abs(order_bad - Bad::order) <= 0.3);  // so does the order check
  CHECK(order_bad < 0.5);  // kicks of 0.9 h per step: not even consistent, the energy error does not shrink
}

TEST_CASE("velocity family: parameter counts (2 m d + m + d + H per layer for newton-*; 0.11% at 60M)") {
  AttentionConfig cfg;
  cfg.dim = 512;
  cfg.heads = 8;  // d = m = 64
  const Index d = 64, m = 64, H = 8, layers = 8;
  const auto ne = make_attention<float>("newton-euler", 1, cfg);
  const auto nl = make_attention<float>("diff-newton-leapfrog", 3, cfg);
  const auto ul = make_attention<float>("unit-leapfrog", 1, cfg);
  const auto dr = make_attention<float>("drift", 7, cfg);
  CHECK(ne->dynamics_parameter_count() == 2 * m * d + m + d + H);
  CHECK(ne->dynamics_parameter_count() == 8328);
  CHECK(layers * ne->dynamics_parameter_count() == 66624);
  CHECK(nl->dynamics_parameter_count() == 8328);
  CHECK(ul->dynamics_parameter_count() == m * d + 2 * m + H);
  CHECK(dr->dynamics_parameter_count() == H);
  std::vector<std::string> names;
  for (const auto& v : ne->parameters()) names.push_back(v.name);
  CHECK(names == std::vector<std::string>{"wq", "wk", "wv", "wo", "dyn.F1", "dyn.f1", "dyn.F2", "dyn.f2", "dyn.rho"});
  names.clear();
  for (const auto& v : ul->parameters()) names.push_back(v.name);
  CHECK(names == std::vector<std::string>{"wq", "wk", "wv", "wo", "dyn.W", "dyn.b", "dyn.a", "dyn.rho"});
  names.clear();
  for (const auto& v : dr->parameters()) names.push_back(v.name);
  CHECK(names == std::vector<std::string>{"wq", "wk", "wv", "wo", "dyn.rho"});
  const double share = 100.0 * static_cast<double>(layers * ne->dynamics_parameter_count()) / 60e6;
  std::printf("newton-*: %lld dynamics parameters per layer, %lld over 8 layers = %.3f%% of 60M "
              "(unit-leapfrog %lld, drift %lld per layer)\n",
              static_cast<long long>(ne->dynamics_parameter_count()),
              static_cast<long long>(layers * ne->dynamics_parameter_count()), share,
              static_cast<long long>(ul->dynamics_parameter_count()), static_cast<long long>(dr->dynamics_parameter_count()));
  CHECK(share == doctest::Approx(0.111).epsilon(0.01));
}

TEST_CASE_TEMPLATE("velocity family at init: the layer is standard attention with Wq + tau Wk", I, Drift<2>,
                   NewtonEuler<2>, NewtonLeapfrog<3>, UnitLeapfrog<1>) {
  // A single tau for all heads, so that Wq + tau Wk is one matrix.
  AttentionConfig cfg;
  cfg.dim = 12;
  cfg.heads = 3;
  cfg.init_std = 0.3;
  cfg.init_time = 0.6;
  Attention<double, I, Softmax> coupled(cfg, 5);
  Attention<double, Identity, Softmax> standard(cfg, 6);
  const double tau = std::log1p(std::exp(coupled.params.rho(0)));
  CHECK(tau == doctest::Approx(0.6).epsilon(1e-12));
  standard.params.wq = coupled.params.wq + tau * coupled.params.wk;
  standard.params.wk = coupled.params.wk;
  standard.params.wv = coupled.params.wv;
  standard.params.wo = coupled.params.wo;
  Rng rng(7);
  const Matrix<double> x = random_matrix<double>(2 * 5, 12, rng);
  const Matrix<double> yc = coupled.forward(x, 2), ys = standard.forward(x, 2);
  CHECK((yc - ys).cwiseAbs().maxCoeff() <= 1e-12 * ys.cwiseAbs().maxCoeff());
}
