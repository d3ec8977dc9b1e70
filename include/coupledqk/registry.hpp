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

#include <algorithm>
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

namespace detail {
// Optional policy members, detected (absent: the fact is "not given", never a made-up 0).
template <class I, class = void>
struct has_pair_flops : std::false_type {};
template <class I>
struct has_pair_flops<I, std::void_t<decltype(I::flops_per_pair(1.0, 1.0))>> : std::true_type {};
template <class Sc, class = void>
struct has_score_flops : std::false_type {};
template <class Sc>
struct has_score_flops<Sc, std::void_t<decltype(Sc::score_flops(1.0, 1.0, 1.0))>> : std::true_type {};
}  // namespace detail

/// What a variant table knows about one of its entries, read from the entry's policies (never from
/// its name): the one place the benchmarks, the trainer, checkpoints, the compare and study tools,
/// the typed tests and the Python package ask.
struct VariantInfo {
  std::string name;          ///< the table's name, e.g. "diff-leapfrog"
  std::string integrator;    ///< the integrator policy's name (Identity: "identity")
  std::string scoring;       ///< the scoring policy's name, e.g. "differential"
  bool has_dynamics = false; ///< false: no dynamics parameters, no integration time, steps ignored
  bool has_steps = false;    ///< the family takes a step count (1..max_steps)
  bool is_reversible = false;  ///< supports DynamicsMemory::recompute
  bool is_symplectic = false;
  bool is_coupled = false;
  int order = 0;             ///< convergence order of the energy error (0: not a flow)
  /// Forward FLOPs of the dynamics per (token, head) pair at `steps` steps, head size d and hidden
  /// width m (a multiply-add counts 2), from the integrator's optional `flops_per_pair`; nullptr
  /// when the policy does not give it (report "n/a").
  double (*dynamics_flops_per_pair)(int steps, double d, double m) = nullptr;
  /// Forward FLOPs of the scoring for B sequences of T tokens at width D (Softmax's causal half of
  /// Q K^T and P V: 2 B T^2 D), from the scoring's optional `score_flops`; nullptr when not given.
  double (*score_flops)(double batch, double seq, double dim) = nullptr;
};

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

  /// The facts of the entry named `name` (VariantInfo); throws coupledqk::invalid_argument, listing
  /// the accepted names, for an unknown one.
  VariantInfo info(std::string_view name) const {
    require_unique_names();
    require(contains(name), "unknown attention variant '", bounded(name), "'; accepted: ", names_joined());
    std::optional<VariantInfo> out;
    std::apply([&](const auto&... e) { ((!out && name == e.name ? (out.emplace(info_of(e)), 0) : 0), ...); },
               entries_);
    return *out;
  }

  /// The facts of every entry, in table order.
  std::vector<VariantInfo> infos() const {
    std::vector<VariantInfo> out;
    std::apply([&](const auto&... e) { (out.push_back(info_of(e)), ...); }, entries_);
    return out;
  }

  /// The name of the table's first entry without dynamics (the natural baseline of a comparison:
  /// the default variant of a model or a run), or of its first entry with dynamics; nullptr when
  /// there is none.
  constexpr const char* first_without_dynamics() const { return first_where(false); }
  constexpr const char* first_with_dynamics() const { return first_where(true); }

  /// The table of entry K alone (the compiled-table shards of variants.hpp dispatch on it).
  template <std::size_t K>
  constexpr auto only() const {
    return VariantTable<std::tuple_element_t<K, entries>>(std::get<K>(entries_));
  }

  /// The position of `name` in the table; the same errors as dispatch for an unknown name or a step
  /// count outside 1..max_steps.
  std::size_t index_of(std::string_view name, int steps) const {
    check(name, steps);
    const auto n = names();
    return static_cast<std::size_t>(std::find(n.begin(), n.end(), name) - n.begin());
  }

  /// Calls f(type_tag<Integrator>{}, type_tag<Scoring>{}) for every compiled policy pair of the
  /// table: each entry at every step count 1..max_steps (once for a family without steps).
  template <class F>
  void for_each_policy(F&& f) const {
    std::apply([&](const auto&... e) { (each_step<std::decay_t<decltype(e)>>(f, std::make_integer_sequence<int, max_steps>{}), ...); },
               entries_);
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
    check(name, steps);
    using First = std::tuple_element_t<0, entries>;
    using R = decltype(f(type_tag<typename First::family::template at<1>>{}, type_tag<typename First::scoring>{}));
    std::optional<R> out;
    std::apply([&](const auto&... e) { ((!out && name == e.name ? (call(e, steps, f, out), 0) : 0), ...); },
               entries_);
    return std::move(*out);
  }

 private:
  constexpr const char* first_where(bool dynamics) const {
    const char* out = nullptr;
    std::apply(
        [&](const auto&... e) {
          ((out == nullptr && std::decay_t<decltype(e)>::family::template at<1>::has_dynamics == dynamics
                ? (out = e.name, 0)
                : 0),
           ...);
        },
        entries_);
    return out;
  }

  template <class E, class F, int... N>
  static void each_step(F& f, std::integer_sequence<int, N...>) {
    using Family = typename E::family;
    using Sc = typename E::scoring;
    if constexpr (Family::has_steps)
      (f(type_tag<typename Family::template at<N + 1>>{}, type_tag<Sc>{}), ...);
    else
      f(type_tag<typename Family::template at<1>>{}, type_tag<Sc>{});
  }

  template <class E>
  static VariantInfo info_of(const E& e) {
    using Family = typename E::family;
    using Sc = typename E::scoring;
    using I1 = typename Family::template at<1>;
    VariantInfo i;
    i.name = e.name;
    i.integrator = I1::name;
    i.scoring = Sc::name;
    i.has_dynamics = I1::has_dynamics;
    i.has_steps = Family::has_steps;
    i.is_reversible = I1::is_reversible;
    i.is_symplectic = I1::is_symplectic;
    i.is_coupled = I1::is_coupled;
    i.order = I1::order;
    if constexpr (detail::has_pair_flops<I1>::value)
      i.dynamics_flops_per_pair = &pair_flops<Family>;
    if constexpr (detail::has_score_flops<Sc>::value)
      i.score_flops = [](double b, double t, double dim) { return Sc::score_flops(b, t, dim); };
    return i;
  }

  /// Family::at<steps>::flops_per_pair(d, m), steps in 1..max_steps (a family without steps: its one policy).
  template <class Family>
  static double pair_flops(int steps, double d, double m) {
    if constexpr (!Family::has_steps) {
      return Family::template at<1>::flops_per_pair(d, m);
    } else {
      require(steps >= 1 && steps <= max_steps, "flops_per_pair: steps must be in 1..", max_steps, "; got ", steps);
      return pair_flops_at<Family>(steps, d, m, std::make_integer_sequence<int, max_steps>{});
    }
  }
  template <class Family, int... N>
  static double pair_flops_at(int steps, double d, double m, std::integer_sequence<int, N...>) {
    double out = 0;
    ((steps == N + 1 ? (out = Family::template at<N + 1>::flops_per_pair(d, m), 0) : 0), ...);
    return out;
  }

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

  void check(std::string_view name, int steps) const {
    require_unique_names();
    require(contains(name), "unknown attention variant '", bounded(name), "'; accepted: ", names_joined());
    require(steps >= 1 && steps <= max_steps, "attention '", name, "': steps must be in 1..", max_steps,
            "; got ", steps);
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

static_assert(builtin_variants.first_without_dynamics() != nullptr && builtin_variants.first_with_dynamics() != nullptr,
              "the built-in table needs an entry without dynamics (the default variant) and one with");

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
  /// y = layer(x) over right-padded or packed sequences (scoring/mask.hpp); x: [seqs.rows(), D].
  virtual Matrix<S> forward(const ConstMatrixRef<S>& x, const Sequences& seqs) = 0;
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
  Matrix<S> forward(const ConstMatrixRef<S>& x, const Sequences& seqs) override {
    return layer_.forward(x, seqs, &ctx_);
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
/// `fallback` when given (a consumer table's name), else "<integrator>+<scoring>" from the
/// policies' own names (no variant name is made up here).
template <class I, class Sc>
std::string variant_name(const std::string& fallback = {}) {
  if (auto n = builtin_variants.name_of<I, Sc>()) return *n;
  if (!fallback.empty()) return fallback;
  return std::string(I::name) + "+" + Sc::name;
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

/// Entry K of the built-in table at scalar S: its layers at every step count. One explicit
/// instantiation compiles one entry, so the optional compiled table (variants.hpp, library
/// coupledqk::variants) spreads the table over several translation units, and a program that
/// includes variants.hpp instantiates none of it. K past the table's end: an empty class.
template <class S, std::size_t K, class = void>
struct BuiltinAttention {};
template <class S, std::size_t K>
struct BuiltinAttention<S, K, std::enable_if_t<(K < std::decay_t<decltype(builtin_variants)>::size)>> {
  static std::unique_ptr<AnyAttention<S>> make(std::string_view name, int steps, const AttentionConfig& config,
                                               std::uint64_t seed);
};
template <class S, std::size_t K>
std::unique_ptr<AnyAttention<S>> BuiltinAttention<
    S, K, std::enable_if_t<(K < std::decay_t<decltype(builtin_variants)>::size)>>::make(std::string_view name, int steps,
                                                                                       const AttentionConfig& config,
                                                                                       std::uint64_t seed) {
  return make_attention<S>(builtin_variants.only<K>(), name, steps, config, seed);
}

namespace detail {
/// Calls f(std::integral_constant<std::size_t, K>{}) for the K == index among 0..N-1.
template <class F, std::size_t... K>
auto with_index(std::size_t index, F&& f, std::index_sequence<K...>) {
  using R = decltype(f(std::integral_constant<std::size_t, 0>{}));
  std::optional<R> out;
  ((index == K ? (out.emplace(f(std::integral_constant<std::size_t, K>{})), 0) : 0), ...);
  return std::move(*out);
}
template <class F>
auto with_builtin_index(std::size_t index, F&& f) {
  return with_index(index, std::forward<F>(f),
                    std::make_index_sequence<std::decay_t<decltype(builtin_variants)>::size>{});
}
}  // namespace detail

/// The built-in layer named `name` (see VariantTable::dispatch for the errors).
template <class S>
std::unique_ptr<AnyAttention<S>> make_attention(std::string_view name, int steps, const AttentionConfig& config,
                                                std::uint64_t seed = 0) {
  return detail::with_builtin_index(builtin_variants.index_of(name, steps), [&](auto k) {
    return BuiltinAttention<S, decltype(k)::value>::make(name, steps, config, seed);
  });
}

}  // namespace coupledqk
