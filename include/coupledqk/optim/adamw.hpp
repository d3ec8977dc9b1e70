// AdamW with decoupled weight decay, global gradient-norm clipping and a warm-up + cosine schedule.
//
// One update t = 1, 2, ... (step() takes the learning rate lr_t = schedule.at(t - 1)):
//
//   norm  = sqrt(sum over every gradient entry of g^2)              (pre-clip, reported)
//   c     = clip_norm / norm if clip_norm > 0 and norm > clip_norm, else 1
//   for every tensor, entry-wise, with g <- c * g:
//     m   = beta1 m + (1 - beta1) g
//     v   = beta2 v + (1 - beta2) g^2
//     p   = p (1 - lr_t weight_decay)                               (decayed tensors only)
//     p   = p - (lr_t / (1 - beta1^t)) m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//
// Decay applies to 2-D tensors only (weight matrices and embeddings, including the dynamics' W, U,
// P*): never to vectors (biases, LayerNorm gains, rho, a/b/c/e, lq*/lk*, subln). The gradient
// buffers are read, not modified (clipping is a factor in the update).
//
// The state -- m and v of every tensor and the step count -- is exposed as named tensor views, so a
// checkpoint saves and restores it exactly.
//
// Threads: the entries are cut into fixed pieces (adamw_piece entries of one tensor at most,
// optimiser_pieces) that the threads share. The update is entry-wise, and the norm sums each piece
// (in double, eight interleaved accumulators that the compiler vectorises) and then the pieces'
// sums in piece order: the pieces depend on the tensor sizes alone, so the same inputs give
// bit-identical results on any thread count (tested: tests/autodiff/test_optim.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "../core/error.hpp"
#include "../core/parallel.hpp"
#include "../core/parameters.hpp"
#include "../core/types.hpp"
#include "schedule.hpp"

namespace coupledqk {

struct AdamWConfig {
  double lr = 6e-4;               ///< peak learning rate (after warm-up)
  std::optional<double> min_lr;   ///< floor of the cosine decay; default 10% of lr
  Index warmup_steps = 0;         ///< linear warm-up length
  Index total_steps = 1;          ///< end of the cosine decay (lr = min_lr afterwards)
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;      ///< decoupled, on 2-D tensors only
  double clip_norm = 1.0;         ///< global gradient-norm clipping; 0 disables it

  CosineSchedule schedule() const {
    return CosineSchedule{lr, min_lr.value_or(0.1 * lr), warmup_steps, total_steps};
  }
};

inline void validate(const AdamWConfig& c) {
  c.schedule().validate();
  require(c.beta1 >= 0 && c.beta1 < 1, "adamw: beta1 must be in [0, 1); got ", c.beta1);
  require(c.beta2 >= 0 && c.beta2 < 1, "adamw: beta2 must be in [0, 1); got ", c.beta2);
  require(std::isfinite(c.eps) && c.eps > 0, "adamw: eps must be finite and > 0; got ", c.eps);
  require(std::isfinite(c.weight_decay) && c.weight_decay >= 0, "adamw: weight_decay must be finite and ",
          ">= 0; got ", c.weight_decay);
  require(std::isfinite(c.clip_norm) && c.clip_norm >= 0, "adamw: clip_norm must be finite and >= 0 ",
          "(0 disables clipping); got ", c.clip_norm);
}

/// A piece of one tensor's entries, [begin, begin + size): the unit of work the optimiser's loops
/// share among threads.
struct OptimiserPiece {
  std::size_t tensor = 0;
  Index begin = 0, size = 0;
};

/// Entries per piece at most (128 KB of float per array: a piece's p, g, m, v stay in L2).
inline constexpr Index adamw_piece = Index(1) << 15;

/// Every tensor cut at multiples of adamw_piece: the same pieces for the same sizes, whatever the
/// thread count.
template <class S>
std::vector<OptimiserPiece> optimiser_pieces(const std::vector<TensorView<S>>& tensors) {
  std::vector<OptimiserPiece> out;
  for (std::size_t k = 0; k < tensors.size(); ++k)
    for (Index b = 0, n = tensors[k].size(); b < n; b += adamw_piece)
      out.push_back(OptimiserPiece{k, b, std::min(adamw_piece, n - b)});
  return out;
}

namespace detail {
/// Sum of x[i]^2 in double with eight interleaved accumulators (vectorised by the compiler; the
/// association is written out, so it does not depend on the vector width), then added in order.
template <class S>
double sum_of_squares(const S* x, Index n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  Index i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) {
      const double g = static_cast<double>(x[i + j]);
      acc[j] += g * g;
    }
  for (int j = 0; i + j < n; ++j) {
    const double g = static_cast<double>(x[i + j]);
    acc[j] += g * g;
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}
}  // namespace detail

/// sqrt of the sum of squares of every entry of every tensor, in double: each piece's sum in
/// parallel, then the pieces' sums in piece order (`partial` [pieces] is the workspace). The same
/// bits on any thread count.
template <class S>
double global_norm(const std::vector<TensorView<S>>& tensors, const std::vector<OptimiserPiece>& pieces,
                   std::vector<double>& partial) {
  partial.resize(pieces.size());
  parallel_rows(static_cast<Index>(pieces.size()), pieces.size() > 1, [&](Index i) {
    const OptimiserPiece& c = pieces[static_cast<std::size_t>(i)];
    partial[static_cast<std::size_t>(i)] = detail::sum_of_squares(tensors[c.tensor].data + c.begin, c.size);
  });
  double sum = 0;
  for (double x : partial) sum += x;
  return std::sqrt(sum);
}

/// The same without kept buffers.
template <class S>
double global_norm(const std::vector<TensorView<S>>& tensors) {
  std::vector<double> partial;
  return global_norm(tensors, optimiser_pieces(tensors), partial);
}

/// What one step did.
struct StepReport {
  Index step = 0;          ///< updates taken so far, this one included
  double lr = 0;           ///< learning rate used
  double grad_norm = 0;    ///< global gradient norm before clipping
  double clip_scale = 1;   ///< factor applied to the gradients (1: not clipped)
  bool skipped = false;    ///< true when the gradient norm was not finite: nothing was changed
};

template <class S>
class AdamW {
 public:
  /// params and grads: named views of the same tensors in the same order (e.g. AnyGpt's
  /// parameters() and gradients()). The storage they point to must outlive the optimiser.
  AdamW(std::vector<TensorView<S>> params, std::vector<TensorView<S>> grads, const AdamWConfig& config)
      : params_(std::move(params)), grads_(std::move(grads)), config_(config), schedule_(config.schedule()) {
    validate(config_);
    require(params_.size() == grads_.size(), "adamw: ", params_.size(), " parameter tensors but ",
            grads_.size(), " gradient tensors; expected the same list");
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const auto &p = params_[i], &g = grads_[i];
      require(p.name == g.name && p.shape == g.shape && p.data && g.data, "adamw: tensor ", i, " is '",
              p.name, "' but its gradient is '", g.name, "' (or the shapes differ, or a view is empty); ",
              "expected matching lists");
      m_.push_back(Vector<S>::Zero(p.size()));
      v_.push_back(Vector<S>::Zero(p.size()));
      decay_.push_back(decays(p));
    }
    pieces_ = optimiser_pieces(params_);
    partial_.resize(pieces_.size());
    step_ = Vector<S>::Zero(1);
  }

  /// Whether weight decay applies: 2-D tensors (matrices, embeddings), never vectors.
  static bool decays(const TensorView<S>& t) { return decays(t.shape); }
  static bool decays(const std::vector<Index>& shape) { return shape.size() == 2; }

  const AdamWConfig& config() const { return config_; }
  const CosineSchedule& schedule() const { return schedule_; }

  /// Updates taken so far (read from the "step" state tensor, so a restored value counts).
  Index steps_done() const {
    const S s = step_[0];
    // Bounded before the conversion (a restored state may hold anything: 1e25, inf): every integer
    // up to 2^digits is exact in S, and converts to Index without overflow.
    const S most = std::ldexp(S(1), std::numeric_limits<S>::digits);
    require(s >= S(0) && s <= most && std::floor(s) == s, "adamw: the step state holds ", s,
            "; expected a non-negative integer of at most ", most,
            " (was the state restored from a bad checkpoint?)");
    return static_cast<Index>(s);
  }

  /// One update with lr = schedule().at(steps_done()). A non-finite gradient norm skips it.
  StepReport step() {
    StepReport r;
    const Index t = steps_done() + 1;
    r.lr = schedule_.at(t - 1);
    r.grad_norm = global_norm(grads_, pieces_, partial_);
    if (!std::isfinite(r.grad_norm)) {
      r.skipped = true;
      r.step = t - 1;
      return r;
    }
    if (config_.clip_norm > 0 && r.grad_norm > config_.clip_norm) r.clip_scale = config_.clip_norm / r.grad_norm;
    const S b1 = S(config_.beta1), b2 = S(config_.beta2), one_b1 = S(1 - config_.beta1),
            one_b2 = S(1 - config_.beta2);
    const double bc1 = 1 - std::pow(config_.beta1, static_cast<double>(t));
    const double bc2 = 1 - std::pow(config_.beta2, static_cast<double>(t));
    const S step_size = S(r.lr / bc1), inv_sqrt_bc2 = S(1 / std::sqrt(bc2)), eps = S(config_.eps);
    const S decay = S(1 - r.lr * config_.weight_decay), clip = S(r.clip_scale);
    // Entry-wise, piece by piece on the threads; the decayed and the other tensors in separate
    // loops, so that each is a straight vectorisable loop.
    parallel_rows(static_cast<Index>(pieces_.size()), pieces_.size() > 1, [&](Index i) {
      const OptimiserPiece& c = pieces_[static_cast<std::size_t>(i)];
      S* __restrict p = params_[c.tensor].data + c.begin;
      const S* __restrict gr = grads_[c.tensor].data + c.begin;
      S* __restrict m = m_[c.tensor].data() + c.begin;
      S* __restrict v = v_[c.tensor].data() + c.begin;
      const Index n = c.size;
      if (decay_[c.tensor]) {
        for (Index j = 0; j < n; ++j) {
          const S g = gr[j] * clip;
          m[j] = b1 * m[j] + one_b1 * g;
          v[j] = b2 * v[j] + one_b2 * g * g;
          p[j] *= decay;
          p[j] -= step_size * m[j] / (std::sqrt(v[j]) * inv_sqrt_bc2 + eps);
        }
      } else {
        for (Index j = 0; j < n; ++j) {
          const S g = gr[j] * clip;
          m[j] = b1 * m[j] + one_b1 * g;
          v[j] = b2 * v[j] + one_b2 * g * g;
          p[j] -= step_size * m[j] / (std::sqrt(v[j]) * inv_sqrt_bc2 + eps);
        }
      }
    });
    step_[0] = S(t);
    r.step = t;
    return r;
  }

  /// The optimiser's state as named views: "m.<name>" and "v.<name>" for every parameter (its
  /// shape), then "step" [1] (the update count, exact up to 2^24 in float, 2^53 in double).
  /// Writing into them restores a saved state.
  std::vector<TensorView<S>> state() {
    std::vector<TensorView<S>> out;
    for (std::size_t k = 0; k < params_.size(); ++k)
      out.push_back(TensorView<S>{"m." + params_[k].name, params_[k].shape, m_[k].data()});
    for (std::size_t k = 0; k < params_.size(); ++k)
      out.push_back(TensorView<S>{"v." + params_[k].name, params_[k].shape, v_[k].data()});
    out.push_back(TensorView<S>{"step", {1}, step_.data()});
    return out;
  }

 private:
  std::vector<TensorView<S>> params_, grads_;
  AdamWConfig config_;
  CosineSchedule schedule_;
  std::vector<Vector<S>> m_, v_;
  std::vector<bool> decay_;
  std::vector<OptimiserPiece> pieces_;  // the threads' units of work (fixed by the sizes)
  std::vector<double> partial_;         // the norm's per-piece sums
  Vector<S> step_;  // [1], the update count
};

}  // namespace coupledqk
