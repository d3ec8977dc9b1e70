// Run-time selection: an attention variant by name and step count, mapped onto a closed list of
// compiled Attention<Scalar, Integrator, Scoring> instances.
//
//     auto layer = coupledqk::make_attention<double>("diff-leapfrog", 3, config, seed);
//
// Names: standard, leapfrog, euler, uncoupled, diff, diff-leapfrog, diff-euler, diff-uncoupled.
// Steps: 1..max_steps (ignored by standard and diff, which have no dynamics, but still checked).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attention.hpp"
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
                                              "diff",     "diff-leapfrog", "diff-euler", "diff-uncoupled"};
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

namespace detail {

template <class S, template <int> class Integrator, class Scoring, int... N>
std::unique_ptr<AnyAttention<S>> make_stepped(const std::string& name, int steps,
                                              const AttentionConfig& config, std::uint64_t seed,
                                              std::integer_sequence<int, N...>) {
  std::unique_ptr<AnyAttention<S>> out;
  ((steps == N + 1
        ? (out = std::make_unique<AttentionModel<S, Integrator<N + 1>, Scoring>>(name, steps, config, seed),
           0)
        : 0),
   ...);
  return out;
}

template <class S, template <int> class Integrator, class Scoring>
std::unique_ptr<AnyAttention<S>> make_stepped(const std::string& name, int steps,
                                              const AttentionConfig& config, std::uint64_t seed) {
  return make_stepped<S, Integrator, Scoring>(name, steps, config, seed,
                                              std::make_integer_sequence<int, max_steps>{});
}

}  // namespace detail

/// The layer named `name` with `steps` integration steps. Throws coupledqk::invalid_argument,
/// listing what is accepted, for an unknown name or a step count outside 1..max_steps.
template <class S>
std::unique_ptr<AnyAttention<S>> make_attention(std::string_view name, int steps,
                                                const AttentionConfig& config, std::uint64_t seed = 0) {
  const std::string n(name);
  bool known = false;
  for (const auto& v : attention_names()) known = known || v == n;
  require(known, "unknown attention variant '", n, "'; accepted: ", join(attention_names()));
  require(steps >= 1 && steps <= max_steps, "attention '", n, "': steps must be in 1..", max_steps,
          "; got ", steps);
  if (n == "standard") return std::make_unique<AttentionModel<S, Identity, Softmax>>(n, steps, config, seed);
  if (n == "diff") return std::make_unique<AttentionModel<S, Identity, Differential>>(n, steps, config, seed);
  if (n == "leapfrog") return detail::make_stepped<S, Leapfrog, Softmax>(n, steps, config, seed);
  if (n == "euler") return detail::make_stepped<S, Euler, Softmax>(n, steps, config, seed);
  if (n == "uncoupled") return detail::make_stepped<S, Uncoupled, Softmax>(n, steps, config, seed);
  if (n == "diff-leapfrog") return detail::make_stepped<S, Leapfrog, Differential>(n, steps, config, seed);
  if (n == "diff-euler") return detail::make_stepped<S, Euler, Differential>(n, steps, config, seed);
  return detail::make_stepped<S, Uncoupled, Differential>(n, steps, config, seed);
}

}  // namespace coupledqk
