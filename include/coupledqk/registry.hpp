// Run-time selection: an attention variant by name and step count, mapped onto a closed list of
// compiled Attention<Scalar, Integrator, Scoring> instances.
//
//     auto layer = coupledqk::make_attention<double>("diff-leapfrog", 3, config, seed);
//
// Names: standard, leapfrog, euler, uncoupled, diff, diff-leapfrog, diff-euler, diff-uncoupled,
// affine, diff-affine.
// Steps: 1..max_steps (ignored by standard and diff, which have no dynamics, but still checked).
#pragma once

#include <memory>
#include <optional>
#include <type_traits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attention.hpp"
#include "integrators/affine.hpp"
#include "integrators/euler.hpp"
#include "integrators/identity.hpp"
#include "integrators/leapfrog.hpp"
#include "integrators/uncoupled.hpp"
#include "scoring/differential.hpp"
#include "scoring/softmax.hpp"

namespace coupledqk {

/// Largest step count compiled into the registry (the paper sweeps 1-7).
inline constexpr int max_steps = 7;

/// Every accepted variant name, in a fixed order.
inline const std::vector<std::string>& attention_names() {
  static const std::vector<std::string> names{"standard", "leapfrog",      "euler",      "uncoupled",
                                              "diff",     "diff-leapfrog", "diff-euler", "diff-uncoupled",
                                              "affine",   "diff-affine"};
  return names;
}

inline std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
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

template <class S, class Integrator, class Scoring>
class AttentionModel final : public AnyAttention<S> {
 public:
  using Layer = Attention<S, Integrator, Scoring>;

  AttentionModel(std::string name, int steps, const AttentionConfig& config, std::uint64_t seed)
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

/// A type carried as a value, so a generic lambda can receive policies: `[](auto i, auto s) {
/// using I = typename decltype(i)::type; ... }`.
template <class T>
struct type_tag {
  using type = T;
};

namespace detail {

template <template <int> class Integrator, class Scoring, class F, int... N>
auto with_steps(int steps, F& f, std::integer_sequence<int, N...>) {
  using R = decltype(f(type_tag<Integrator<1>>{}, type_tag<Scoring>{}));
  std::optional<R> out;
  ((steps == N + 1 ? (out.emplace(f(type_tag<Integrator<N + 1>>{}, type_tag<Scoring>{})), 0) : 0), ...);
  return std::move(*out);
}

}  // namespace detail

/// Checks `name` and `steps`, then calls f(type_tag<Integrator>{}, type_tag<Scoring>{}) with the
/// compiled policies they name and returns its result (f must return the same non-void type for
/// every policy pair). The one place that maps names onto
/// policies: the layer registry below and the model registry use it.
/// Throws coupledqk::invalid_argument, listing what is accepted, for an unknown name or a step
/// count outside 1..max_steps.
template <class F>
auto with_variant(std::string_view name, int steps, F&& f) {
  const std::string n(name);
  bool known = false;
  for (const auto& v : attention_names()) known = known || v == n;
  require(known, "unknown attention variant '", n, "'; accepted: ", join(attention_names()));
  require(steps >= 1 && steps <= max_steps, "attention '", n, "': steps must be in 1..", max_steps,
          "; got ", steps);
  constexpr auto all = std::make_integer_sequence<int, max_steps>{};
  if (n == "standard") return f(type_tag<Identity>{}, type_tag<Softmax>{});
  if (n == "diff") return f(type_tag<Identity>{}, type_tag<Differential>{});
  if (n == "leapfrog") return detail::with_steps<Leapfrog, Softmax>(steps, f, all);
  if (n == "euler") return detail::with_steps<Euler, Softmax>(steps, f, all);
  if (n == "uncoupled") return detail::with_steps<Uncoupled, Softmax>(steps, f, all);
  if (n == "affine") return detail::with_steps<Affine, Softmax>(steps, f, all);
  if (n == "diff-affine") return detail::with_steps<Affine, Differential>(steps, f, all);
  if (n == "diff-leapfrog") return detail::with_steps<Leapfrog, Differential>(steps, f, all);
  if (n == "diff-euler") return detail::with_steps<Euler, Differential>(steps, f, all);
  return detail::with_steps<Uncoupled, Differential>(steps, f, all);
}

/// The layer named `name` with `steps` integration steps (see with_variant for the errors).
template <class S>
std::unique_ptr<AnyAttention<S>> make_attention(std::string_view name, int steps,
                                                const AttentionConfig& config, std::uint64_t seed = 0) {
  return with_variant(name, steps, [&](auto integrator, auto scoring) -> std::unique_ptr<AnyAttention<S>> {
    using I = typename decltype(integrator)::type;
    using Sc = typename decltype(scoring)::type;
    return std::make_unique<AttentionModel<S, I, Sc>>(std::string(name), steps, config, seed);
  });
}

}  // namespace coupledqk
