// The variant table's facts (VariantInfo) come from the policies: has dynamics, reversible,
// symplectic, the FLOP formulas; every entry of the built-in table has a FLOP formula.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include <coupledqk/coupledqk.hpp>

#include "policies.hpp"

namespace cqk = coupledqk;

namespace {

/// A policy without a FLOP formula (and nothing else of interest): its count must be "n/a".
template <int N>
struct NoFlops : cqk::Leapfrog<N> {
  template <class H = void>
  static void flops_per_pair() = delete;  // hides the base's: no formula reachable as (d, m)
};

/// A scoring without a FLOP formula.
struct NoScoreFlops : cqk::Softmax {
  static constexpr const char* name = "softmax-no-flops";
  static void score_flops() = delete;
};

}  // namespace

TEST_CASE("variant facts come from the policies, in table order") {
  const auto infos = cqk::builtin_variants.infos();
  REQUIRE(infos.size() == cqk::builtin_variants.size);
  for (std::size_t i = 0; i < infos.size(); ++i) CHECK(infos[i].name == cqk::builtin_variants.names()[i]);
  // Each entry's facts equal its compiled policies' members.
  for (const auto& name : cqk::builtin_variants.names()) {
    const cqk::VariantInfo info = cqk::builtin_variants.info(name);
    cqk::with_variant(name, 1, [&](auto integrator, auto scoring) {
      using I = typename decltype(integrator)::type;
      using Sc = typename decltype(scoring)::type;
      INFO("variant ", name);
      CHECK(info.integrator == I::name);
      CHECK(info.scoring == Sc::name);
      CHECK(info.has_dynamics == I::has_dynamics);
      CHECK(info.is_reversible == I::is_reversible);
      CHECK(info.is_symplectic == I::is_symplectic);
      CHECK(info.is_coupled == I::is_coupled);
      CHECK(info.order == I::order);
      return 0;
    });
  }
  const auto standard = cqk::builtin_variants.info("standard");
  CHECK_FALSE(standard.has_dynamics);
  CHECK_FALSE(standard.has_steps);
  const auto leapfrog = cqk::builtin_variants.info("leapfrog");
  CHECK(leapfrog.has_dynamics);
  CHECK(leapfrog.has_steps);
  CHECK(leapfrog.is_symplectic);
  CHECK(leapfrog.is_reversible);
  CHECK_FALSE(cqk::builtin_variants.info("euler").is_reversible);
  CHECK(std::string(cqk::builtin_variants.first_without_dynamics()) == "standard");
  CHECK(std::string(cqk::builtin_variants.first_with_dynamics()) == "leapfrog");
  constexpr auto only_coupled = cqk::VariantTable(cqk::variant<cqk::Leapfrog, cqk::Softmax>("lf"));
  static_assert(only_coupled.first_without_dynamics() == nullptr);
}

TEST_CASE("info: an unknown name is an error that lists the accepted names") {
  CHECK_THROWS_WITH_AS(cqk::builtin_variants.info("leapfrogg"), doctest::Contains("accepted: standard, leapfrog"),
                       cqk::invalid_argument);
}

TEST_CASE("every entry of the built-in table has a FLOP formula for its dynamics and its scoring") {
  for (const auto& info : cqk::builtin_variants.infos()) {
    INFO("variant ", info.name);
    REQUIRE(bool(info.dynamics_flops_per_pair));
    REQUIRE(bool(info.score_flops));
    for (int steps = 1; steps <= cqk::max_steps; ++steps) {
      const double f = info.dynamics_flops_per_pair(steps, 64, 64);
      CHECK(std::isfinite(f));
      if (info.has_dynamics)
        CHECK(f > 0);
      else
        CHECK(f == 0);
    }
    CHECK(info.score_flops(4, 512, 512) > 0);
  }
}

TEST_CASE("the FLOP formulas are the documented ones (docs/performance-notes.md)") {
  const double d = 64, m = 64;
  auto pair = [&](const char* name, int steps) { return cqk::builtin_variants.info(name).dynamics_flops_per_pair(steps, d, m); };
  for (int N = 1; N <= cqk::max_steps; ++N) {
    CHECK(pair("leapfrog", N) == (2 * N + 1) * 4 * d * m);  // N + 1 kicks, N drifts
    CHECK(pair("diff-leapfrog", N) == (2 * N + 1) * 4 * d * m);
    CHECK(pair("euler", N) == 2 * N * 4 * d * m);
    CHECK(pair("uncoupled", N) == 2 * N * 2 * d * m);
    CHECK(pair("affine", N) == 12 * d * m * N);
  }
  CHECK(cqk::builtin_variants.info("standard").score_flops(4, 512, 512) == 2.0 * 4 * 512 * 512 * 512);
  CHECK(cqk::builtin_variants.info("diff").score_flops(4, 512, 512) == 3.0 * 4 * 512 * 512 * 512);
}

TEST_CASE("a policy without a FLOP formula reports none (never 0)") {
  constexpr auto table = cqk::builtin_variants.with(cqk::variant<NoFlops, cqk::Softmax>("no-flops"),
                                                    cqk::variant<cqk::Leapfrog, NoScoreFlops>("no-score-flops"));
  const auto a = table.info("no-flops");
  CHECK_FALSE(bool(a.dynamics_flops_per_pair));
  CHECK(bool(a.score_flops));
  const auto b = table.info("no-score-flops");
  CHECK(bool(b.dynamics_flops_per_pair));
  CHECK_FALSE(bool(b.score_flops));
}

TEST_CASE("the typed recompute list holds exactly the reversible integrators with dynamics") {
  std::size_t count = 0;
  cqk_test::for_each_type<cqk_test::RecomputeVariants>([&](auto tag) {
    using V = typename decltype(tag)::type;
    CHECK(V::integrator::is_reversible);
    CHECK(V::integrator::has_dynamics);
    CHECK(V::memory == cqk::DynamicsMemory::recompute);
    ++count;
  });
  std::size_t expected = 0;
  cqk_test::for_each_type<cqk_test::Integrators>([&](auto tag) {
    using I = typename decltype(tag)::type;
    if (I::is_reversible && I::has_dynamics) ++expected;
  });
  CHECK(count == expected);
  CHECK(count >= 8);  // Leapfrog and Affine at 1, 2, 3, 7 steps at least
}
