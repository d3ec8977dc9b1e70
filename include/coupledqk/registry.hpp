// Run-time selection: an attention variant by name and step count, mapped onto a closed list of
// compiled Attention<Scalar, Integrator, Scoring> instances.
//
//     auto layer = coupledqk::make_attention<double>("diff-leapfrog", 3, config, seed);
//
// The one list of variants is `builtin_variants` below: one line per variant, {name, integrator,
// scoring}. Everything that needs a name follows from it: the accepted names (`attention_names()`,
// help texts, error messages), the run-time dispatch (`with_variant`), the inverse mapping from
// compiled policies to a name (`VariantTable::name_of`), the device support check
// (cuda/.../gpt.cuh: cuda::variant_supported) and the typed test lists (tests/policies.hpp).
//
// A consumer registers its own integrator in its own table, without editing the library:
//
//     constexpr auto my_variants = coupledqk::builtin_variants.with(
//         coupledqk::variant<ForestRuth, coupledqk::Softmax>("forest-ruth"));
//     auto layer = coupledqk::make_attention<double>(my_variants, "forest-ruth", 2, config);
//     auto model = coupledqk::make_gpt<float>(gpt_config, seed, my_variants);
//
// An integrator that takes a step count is given as its template (`Leapfrog`, compiled for steps
// 1..max_steps); one without (Identity) as a type. Steps are checked to lie in 1..max_steps for
// every variant (and ignored by those without dynamics).
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "attention.hpp"
#include "integrators/affine.hpp"
#include "integrators/euler.hpp"
#include "integrators/identity.hpp"
#include "integrators/leapfrog.hpp"
#include "integrators/uncoupled.hpp"
#include "integrators/velocity.hpp"
#include "scoring/differential.hpp"
#include "scoring/softmax.hpp"

namespace coupledqk {

/// Largest step count compiled into a variant table (the paper sweeps 1-7).
inline constexpr int max_steps = 7;

/// A type carried as a value, so a generic lambda can receive policies: `[](auto i, auto s) {
/// using I = typename decltype(i)::type; ... }`.
template <class T>
struct type_tag {
  using type = T;
};

/// An integrator family with a compile-time step count: Family::at<N> is the policy with N steps.
template <template <int> class I>
struct StepFamily {
  static constexpr bool has_steps = true;
  template <int N>
  using at = I<N>;
  /// Whether policy J is a member of this family.
  template <class J>
  static constexpr bool holds() {
    if constexpr (J::steps >= 1)
      return std::is_same_v<J, I<J::steps>>;
    else
      return false;
  }
};

/// An integrator without a step count (Identity): the same policy for every N.
template <class I>
struct FixedFamily {
  static constexpr bool has_steps = false;
  template <int>
  using at = I;
  template <class J>
  static constexpr bool holds() {
    return std::is_same_v<J, I>;
  }
};

/// One line of a variant table: a run-time name for (integrator family, scoring).
template <class Family, class Scoring>
struct VariantEntry {
  using family = Family;
  using scoring = Scoring;
  const char* name;
};

/// VariantEntry<StepFamily<I>, Sc>{name} for an integrator template, VariantEntry<FixedFamily<I>, Sc> for a type.
template <template <int> class I, class Sc>
constexpr VariantEntry<StepFamily<I>, Sc> variant(const char* name) {
  return {name};
}
template <class I, class Sc>
constexpr VariantEntry<FixedFamily<I>, Sc> variant(const char* name) {
  return {name};
}

/// A closed list of variants. Names must be unique (checked when the table is used).
template <class... Entries>
class VariantTable {
 public:
  constexpr explicit VariantTable(Entries... entries) : entries_(entries...) {}

  static constexpr std::size_t size = sizeof...(Entries);
  using entries = std::tuple<Entries...>;

  /// This table followed by more entries (a consumer's own variants).
  template <class... More>
  constexpr VariantTable<Entries..., More...> with(More... more) const {
    return std::apply([&](auto... e) { return VariantTable<Entries..., More...>(e..., more...); }, entries_);
  }

  /// Every accepted name, in table order.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    std::apply([&](const auto&... e) { (out.emplace_back(e.name), ...); }, entries_);
    return out;
  }

  /// The names joined with `sep` (for help texts and error messages).
  std::string names_joined(const char* sep = ", ") const {
    std::string out;
    for (const auto& n : names()) out += (out.empty() ? "" : sep) + n;
    return out;
  }

  bool contains(std::string_view name) const {
    for (const auto& n : names())
      if (n == name) return true;
    return false;
  }

  /// The name of the variant whose policies are (I, Sc), if the table has it.
  template <class I, class Sc>
  std::optional<std::string> name_of() const {
    std::optional<std::string> out;
    std::apply(
        [&](const auto&... e) {
          ((!out && std::decay_t<decltype(e)>::family::template holds<I>() &&
                    std::is_same_v<typename std::decay_t<decltype(e)>::scoring, Sc>
                ? (out.emplace(e.name), 0)
                : 0),
           ...);
        },
        entries_);
    return out;
  }

  /// Checks `name` and `steps`, then calls f(type_tag<Integrator>{}, type_tag<Scoring>{}) with the
  /// compiled policies they name and returns its result (f must return the same non-void type for
  /// every policy pair). Throws coupledqk::invalid_argument, listing what is accepted, for an
  /// unknown name or a step count outside 1..max_steps.
  template <class F>
  auto dispatch(std::string_view name, int steps, F&& f) const {
    require_unique_names();
    require(contains(name), "unknown attention variant '", bounded(name), "'; accepted: ", names_joined());
    require(steps >= 1 && steps <= max_steps, "attention '", name, "': steps must be in 1..", max_steps,
            "; got ", steps);
    using First = std::tuple_element_t<0, entries>;
    using R = decltype(f(type_tag<typename First::family::template at<1>>{}, type_tag<typename First::scoring>{}));
    std::optional<R> out;
    std::apply([&](const auto&... e) { ((!out && name == e.name ? (call(e, steps, f, out), 0) : 0), ...); },
               entries_);
    return std::move(*out);
  }

 private:
  template <class E, class F, class R>
  static void call(const E&, int steps, F& f, std::optional<R>& out) {
    using Family = typename E::family;
    using Sc = typename E::scoring;
    if constexpr (Family::has_steps)
      with_steps<Family, Sc>(steps, f, out, std::make_integer_sequence<int, max_steps>{});
    else
      out.emplace(f(type_tag<typename Family::template at<1>>{}, type_tag<Sc>{}));
  }

  template <class Family, class Sc, class F, class R, int... N>
  static void with_steps(int steps, F& f, std::optional<R>& out, std::integer_sequence<int, N...>) {
    ((steps == N + 1 ? (out.emplace(f(type_tag<typename Family::template at<N + 1>>{}, type_tag<Sc>{})), 0) : 0),
     ...);
  }

  void require_unique_names() const {
    const auto n = names();
    for (std::size_t i = 0; i < n.size(); ++i)
      for (std::size_t j = i + 1; j < n.size(); ++j)
        require(n[i] != n[j], "variant table: the name '", n[i], "' appears twice; names must be unique");
  }

  /// A name from the outside world, cut to a length a message can carry.
  static std::string bounded(std::string_view s) {
    constexpr std::size_t limit = 64;
    return s.size() <= limit ? std::string(s) : std::string(s.substr(0, limit)) + "...";
  }

  std::tuple<Entries...> entries_;
};

/// The library's variants: the paper's integrators with standard and with Differential scoring.
/// Adding a built-in variant is one line here (and its policy header).
inline constexpr VariantTable builtin_variants{
    variant<Identity, Softmax>("standard"),
    variant<Leapfrog, Softmax>("leapfrog"),
    variant<Euler, Softmax>("euler"),
    variant<Uncoupled, Softmax>("uncoupled"),
    variant<Identity, Differential>("diff"),
    variant<Leapfrog, Differential>("diff-leapfrog"),
    variant<Euler, Differential>("diff-euler"),
    variant<Uncoupled, Differential>("diff-uncoupled"),
    variant<Affine, Softmax>("affine"),
    variant<Affine, Differential>("diff-affine"),
    variant<Drift, Softmax>("drift"),
    variant<SiluNewtonEuler, Softmax>("newton-euler"),
    variant<SiluNewtonLeapfrog, Softmax>("newton-leapfrog"),
    variant<UnitLeapfrog, Softmax>("unit-leapfrog"),
    variant<Drift, Differential>("diff-drift"),
    variant<SiluNewtonEuler, Differential>("diff-newton-euler"),
    variant<SiluNewtonLeapfrog, Differential>("diff-newton-leapfrog"),
    variant<UnitLeapfrog, Differential>("diff-unit-leapfrog"),
};

namespace detail {
template <class T, class Tuple>
struct tuple_has;
template <class T, class... U>
struct tuple_has<T, std::tuple<U...>> : std::bool_constant<(std::is_same_v<T, U> || ...)> {};
/// The tuple of Ts without repeats, in first-seen order.
template <class Acc, class... Ts>
struct unique_of {
  using type = Acc;
};
template <class... A, class T, class... Ts>
struct unique_of<std::tuple<A...>, T, Ts...>
    : unique_of<std::conditional_t<tuple_has<T, std::tuple<A...>>::value, std::tuple<A...>, std::tuple<A..., T>>,
                Ts...> {};
template <class Family, int... N>
using family_members = std::conditional_t<Family::has_steps, std::tuple<typename Family::template at<N>...>,
                                          std::tuple<typename Family::template at<1>>>;
template <class Entries, int... N>
struct table_lists;
template <class... E, int... N>
struct table_lists<std::tuple<E...>, N...> {
  template <class Families>
  struct members;
  template <class... F>
  struct members<std::tuple<F...>> {
    using type = decltype(std::tuple_cat(std::declval<family_members<F, N...>>()...));
  };
  using integrators = typename members<typename unique_of<std::tuple<>, typename E::family...>::type>::type;
  using scorings = typename unique_of<std::tuple<>, typename E::scoring...>::type;
};
}  // namespace detail

/// The integrator policies of a variant table (each family once, at step counts N...) and its
/// scorings, as std::tuples: typed test lists follow from the table (tests/policies.hpp).
template <class Table, int... N>
using table_integrators = typename detail::table_lists<typename Table::entries, N...>::integrators;
template <class Table>
using table_scorings = typename detail::table_lists<typename Table::entries, 1>::scorings;

/// Every built-in variant name, in table order.
inline const std::vector<std::string>& attention_names() {
  static const std::vector<std::string> names = builtin_variants.names();
  return names;
}

/// builtin_variants.dispatch(name, steps, f), or the same on a consumer's table.
template <class F>
auto with_variant(std::string_view name, int steps, F&& f) {
  return builtin_variants.dispatch(name, steps, std::forward<F>(f));
}
template <class... E, class F>
auto with_variant(const VariantTable<E...>& table, std::string_view name, int steps, F&& f) {
  return table.dispatch(name, steps, std::forward<F>(f));
}

/// A layer whose policies were chosen at run time. It keeps the context of its last forward and
/// its own gradient buffer, so forward() then backward() is all a caller needs.
template <class S>
class AnyAttention {
 public:
  virtual ~AnyAttention() = default;
  virtual const std::string& name() const = 0;
  virtual int steps() const = 0;
  virtual const AttentionConfig& config() const = 0;
  /// y = layer(x); x: [B*T, D], rows ordered (b, t).
  virtual Matrix<S> forward(const ConstMatrixRef<S>& x, Index batch) = 0;
  /// Accumulates parameter gradients (see gradients()) and returns dLoss/dx for the last forward.
  virtual Matrix<S> backward(const ConstMatrixRef<S>& dy) = 0;
  /// Named views of the parameters and of their gradients, same order, same shapes.
  virtual std::vector<TensorView<S>> parameters() = 0;
  virtual std::vector<TensorView<S>> gradients() = 0;
  virtual void zero_gradients() = 0;
  virtual Index parameter_count() const = 0;
  virtual Index dynamics_parameter_count() const = 0;
  /// Throws if any parameter is NaN or infinite (for parameters loaded from elsewhere).
  virtual void check_parameters() const = 0;
};

/// AnyAttention for the compiled layer Attention<S, Integrator, Scoring>, with its context and
/// gradient buffer.
template <class S, class Integrator, class Scoring>
class SelectedAttention final : public AnyAttention<S> {
 public:
  using Layer = Attention<S, Integrator, Scoring>;

  SelectedAttention(std::string name, int steps, const AttentionConfig& config, std::uint64_t seed)
      : name_(std::move(name)), steps_(steps), layer_(config, seed), grad_(layer_.zero_gradients()) {}

  const std::string& name() const override { return name_; }
  int steps() const override { return steps_; }
  const AttentionConfig& config() const override { return layer_.config(); }
  Matrix<S> forward(const ConstMatrixRef<S>& x, Index batch) override {
    return layer_.forward(x, batch, &ctx_);
  }
  Matrix<S> backward(const ConstMatrixRef<S>& dy) override { return layer_.backward(ctx_, dy, grad_); }
  std::vector<TensorView<S>> parameters() override {
    std::vector<TensorView<S>> out;
    append_views<S>(layer_.params, "", out);
    return out;
  }
  std::vector<TensorView<S>> gradients() override {
    std::vector<TensorView<S>> out;
    append_views<S>(grad_, "", out);
    return out;
  }
  void zero_gradients() override { set_zero(grad_); }
  Index parameter_count() const override { return layer_.parameter_count(); }
  Index dynamics_parameter_count() const override { return layer_.dynamics_parameter_count(); }
  void check_parameters() const override { require_finite_parameters(layer_.params); }

  Layer& layer() { return layer_; }

 private:
  std::string name_;
  int steps_;
  Layer layer_;
  typename Layer::Parameters grad_;
  typename Layer::Context ctx_;
};

/// The run-time name of the compiled policies (I, Sc): their name in the built-in table, else
/// `fallback` when given (a consumer table's name), else "<integrator>" or "<integrator>+<scoring>".
template <class I, class Sc>
std::string variant_name(const std::string& fallback = {}) {
  if (auto n = builtin_variants.name_of<I, Sc>()) return *n;
  if (!fallback.empty()) return fallback;
  const std::string integrator = I::has_dynamics ? I::name : "";
  if (std::is_same_v<Sc, Softmax>) return I::has_dynamics ? integrator : "standard";
  if (std::is_same_v<Sc, Differential>) return I::has_dynamics ? "diff-" + integrator : "diff";
  return (I::has_dynamics ? integrator : "standard") + "+" + Sc::name;
}

/// The layer named `name` with `steps` integration steps, from `table` (see VariantTable::dispatch
/// for the errors).
template <class S, class... E>
std::unique_ptr<AnyAttention<S>> make_attention(const VariantTable<E...>& table, std::string_view name, int steps,
                                                const AttentionConfig& config, std::uint64_t seed = 0) {
  return table.dispatch(name, steps, [&](auto integrator, auto scoring) -> std::unique_ptr<AnyAttention<S>> {
    using I = typename decltype(integrator)::type;
    using Sc = typename decltype(scoring)::type;
    return std::make_unique<SelectedAttention<S, I, Sc>>(std::string(name), steps, config, seed);
  });
}

/// The built-in layer named `name`.
template <class S>
std::unique_ptr<AnyAttention<S>> make_attention(std::string_view name, int steps, const AttentionConfig& config,
                                                std::uint64_t seed = 0) {
  return make_attention<S>(builtin_variants, name, steps, config, seed);
}

}  // namespace coupledqk
