// The policy lists every typed test runs over. They follow from the variant table (registry.hpp):
// a variant added there is tested at steps 1, 2, 3 and 7 with every scoring (the velocity family at 1 and 3).
#pragma once

#include <tuple>

#include <coupledqk/coupledqk.hpp>

#include "support/variant.hpp"

namespace cqk_test {

using namespace coupledqk;

using Table = std::decay_t<decltype(builtin_variants)>;

/// The velocity family (spec 3c) is typed at steps 1 and 3 only: its per-step physics at 1, 2, 3
/// and 7 is in test_velocity.cpp, and every typed case costs build time (each variant is a full
/// layer's forward and backward instantiated per test file).
template <class I>
inline constexpr bool typed_at_these_steps = !is_velocity_family<I> || I::steps == 1 || I::steps == 3;
template <class List>
struct typed_only;
template <class... I>
struct typed_only<std::tuple<I...>> {
  using type = decltype(std::tuple_cat(
      std::declval<std::conditional_t<typed_at_these_steps<I>, std::tuple<I>, std::tuple<>>>()...));
};
using Integrators = typename typed_only<table_integrators<Table, 1, 2, 3, 7>>::type;  // tested_steps below
using Scorings = table_scorings<Table>;
// (for the built-in table: Identity, Leapfrog<1, 2, 3, 7>, Euler<...>, Uncoupled<...>, Affine<...>,
// Drift<1, 3>, NewtonEuler<1, 3>, NewtonLeapfrog<1, 3>, UnitLeapfrog<1, 3>; Softmax, Differential)

template <class Tuple>
struct pointers_of;
template <class... T>
struct pointers_of<std::tuple<T...>> {
  using type = std::tuple<T*...>;
};

// One layer configuration under test: Variant<I, Sc, M> (support/variant.hpp).

// Cartesian product of the two lists, as a std::tuple of Variant<I, Sc>.
template <class I, class Scs>
struct with_scorings;
template <class I, class... Sc>
struct with_scorings<I, std::tuple<Sc...>> {
  using type = std::tuple<Variant<I, Sc>...>;
};
template <class Is, class Scs>
struct cross;
template <class... I, class Scs>
struct cross<std::tuple<I...>, Scs> {
  using type = decltype(std::tuple_cat(std::declval<typename with_scorings<I, Scs>::type>()...));
};

/// The reversible mode (DynamicsMemory::recompute) of every integrator whose policy says it is
/// reversible (and has dynamics), at the same step counts, with one scoring each, taken in turn
/// along the step counts (1: the first scoring, 2: the second, 3: the first, ...): the store-mode
/// list above already crosses every scoring, and test_affine.cpp adds the other half for Affine.
inline constexpr int tested_steps[] = {1, 2, 3, 7};
/// The position of J's step count among those its family is typed at (the velocity family: 1, 3).
template <class J>
constexpr std::size_t step_rank() {
  std::size_t r = 0;
  for (int s : tested_steps)
    if (s < J::steps && (!is_velocity_family<J> || s == 1 || s == 3)) ++r;
  return r;
}
template <class Is, class Scs>
struct recompute_list;
template <class... I, class Scs>
struct recompute_list<std::tuple<I...>, Scs> {
  template <class J>
  using one = std::conditional_t<
      J::has_dynamics && J::is_reversible,
      std::tuple<Variant<J, std::tuple_element_t<step_rank<J>() % std::tuple_size_v<Scs>, Scs>,
                         DynamicsMemory::recompute>>,
      std::tuple<>>;
  using type = decltype(std::tuple_cat(std::declval<one<I>>()...));
};
using RecomputeVariants = typename recompute_list<Integrators, Scorings>::type;

/// Every integrator with every scoring, plus the reversible (recompute) mode of each reversible one.
using Variants = decltype(std::tuple_cat(std::declval<cross<Integrators, Scorings>::type>(),
                                         std::declval<RecomputeVariants>()));

/// Calls f(type_tag<T>{}) for every T of a std::tuple type.
template <class Tuple, class F>
void for_each_type(F&& f) {
  std::apply([&](auto*... p) { (f(type_tag<std::remove_pointer_t<decltype(p)>>{}), ...); },
             typename pointers_of<Tuple>::type{});
}

/// Adds N(0, stddev^2) noise to every parameter, so no gradient is trivially zero.
template <class Params>
void perturb(Params& p, Rng& rng, double stddev) {
  p.visit([&](const char*, auto& t) {
    for (Index i = 0; i < t.size(); ++i) t.data()[i] += static_cast<typename std::decay_t<decltype(t)>::Scalar>(stddev * rng.normal());
  });
}

/// A small layer with O(1) random parameters (every dynamics term active).
template <class S, class V>
Attention<S, typename V::integrator, typename V::scoring> random_layer(Index dim, Index heads, Index hidden,
                                                                       std::uint64_t seed, int layer_index = 1) {
  AttentionConfig cfg;
  cfg.dim = dim;
  cfg.heads = heads;
  cfg.hidden = hidden;
  cfg.layer_index = layer_index;
  cfg.init_std = 0.4;
  cfg.dynamics_init_scale = 0.5;
  cfg.init_time = 0.8;
  cfg.memory = V::memory;
  Attention<S, typename V::integrator, typename V::scoring> layer(cfg, seed);
  Rng rng(seed + 1000);
  perturb(layer.params, rng, 0.1);
  return layer;
}

template <class S>
Matrix<S> random_matrix(Index rows, Index cols, Rng& rng, double stddev = 1.0) {
  Matrix<S> m(rows, cols);
  rng.fill_normal(m, stddev);
  return m;
}

}  // namespace cqk_test
