// make_kernel<S> for one scalar type: every variant of builtin_variants at every step count, through
// coupledqk::with_variant (a variant added to the table is compiled in here with no edit). Included
// by kernels_float.cpp and kernels_double.cpp, one scalar each, so the two compile side by side.
#pragma once

#include "kernels.hpp"

#include <coupledqk/registry.hpp>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <utility>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace coupledqk::python {

namespace detail {

inline void set_threads(int threads) {
#if defined(_OPENMP)
  if (threads > 0 && omp_get_max_threads() != threads) omp_set_num_threads(threads);
#else
  (void)threads;
#endif
}

/// Copies flat row-major buffers into the fields of `p` (visit order), sized as they come.
template <class Params, class S>
void load(Params& p, const std::vector<TensorSpec>& specs, const std::vector<const S*>& data) {
  std::size_t i = 0;
  p.visit([&](const char*, auto& t) {
    using T = std::decay_t<decltype(t)>;
    const TensorSpec& s = specs[i];
    if constexpr (T::ColsAtCompileTime == 1)
      t = Eigen::Map<const T>(data[i], s.shape[0]);
    else
      t = Eigen::Map<const T>(data[i], s.shape[0], s.shape[1]);
    ++i;
  });
}

/// Copies the fields of `p` (visit order) into flat buffers.
template <class Params, class S>
void store(const Params& p, const std::vector<S*>& out) {
  std::size_t i = 0;
  p.visit([&](const char*, const auto& t) {
    std::copy(t.data(), t.data() + t.size(), out[i]);
    ++i;
  });
}

template <class Layer>
class LayerPass final : public Pass<typename Layer::scalar> {
  using S = typename Layer::scalar;

 public:
  explicit LayerPass(const Layer& prototype) : layer_(prototype) {}
  Layer& layer() { return layer_; }
  typename Layer::Context& context() { return ctx_; }

  void backward(const S* dy, S* dx, const std::vector<S*>& grads, int threads) const override {
    set_threads(threads);
    const Index N = ctx_.x.rows(), D = layer_.config().dim;
    if (grad_.wq.size() == 0)
      grad_ = layer_.zero_gradients();
    else
      set_zero(grad_);
    layer_.backward_into(ctx_, ConstMatrixMap<S>(dy, N, D), grad_, dx_);
    std::copy(dx_.data(), dx_.data() + dx_.size(), dx);
    store(grad_, grads);
  }

 private:
  Layer layer_;
  typename Layer::Context ctx_;
  mutable typename Layer::Parameters grad_;  // the backward's buffers, kept with the pass
  mutable Matrix<S> dx_;
};

/// Passes whose forward and backward are done, kept for the next forward of the same kernel: their
/// parameters, Context and gradient buffers already have the right sizes, so a training loop's
/// steps allocate none of them again (the layer's Context is built for such reuse). At most
/// `limit` are kept (what one training step needs), so the memory held between steps is one pass.
template <class Layer>
struct PassPool {
  static constexpr std::size_t limit = 1;
  std::mutex mutex;
  std::vector<std::unique_ptr<LayerPass<Layer>>> idle;
};

template <class Layer>
class LayerKernel final : public Kernel<typename Layer::scalar> {
  using S = typename Layer::scalar;

 public:
  explicit LayerKernel(const AttentionConfig& config)
      : specs_(Layer::parameter_specs(config)), prototype_(config, 0), pool_(std::make_shared<PassPool<Layer>>()) {
    prototype_.params = typename Layer::Parameters{};  // a pass copies the prototype, then takes the caller's parameters
  }
  const std::vector<TensorSpec>& specs() const override { return specs_; }
  const AttentionConfig& config() const override { return prototype_.config(); }

  void initial_parameters(std::uint64_t seed, const std::vector<S*>& out) const override {
    store(Layer(prototype_.config(), seed).params, out);
  }

  std::shared_ptr<Pass<S>> forward(const S* x, Index batch, Index seq, const std::vector<const S*>& params, S* y,
                                   bool keep, int threads) const override {
    set_threads(threads);
    std::unique_ptr<LayerPass<Layer>> pass;
    {
      std::lock_guard<std::mutex> lock(pool_->mutex);
      if (!pool_->idle.empty()) {
        pass = std::move(pool_->idle.back());
        pool_->idle.pop_back();
      }
    }
    if (!pass) pass = std::make_unique<LayerPass<Layer>>(prototype_);
    load(pass->layer().params, specs_, params);
    require_finite_parameters(pass->layer().params);
    const Index D = prototype_.config().dim;
    Matrix<S> out;
    pass->layer().forward_into(ConstMatrixMap<S>(x, batch * seq, D), batch, keep ? &pass->context() : nullptr, out);
    std::copy(out.data(), out.data() + out.size(), y);
    if (!keep) {
      release(pool_, std::move(pass));
      return nullptr;
    }
    // Returned to the pool when the caller lets go of it (if the kernel still exists).
    return std::shared_ptr<Pass<S>>(pass.release(), [pool = std::weak_ptr<PassPool<Layer>>(pool_)](Pass<S>* p) {
      std::unique_ptr<LayerPass<Layer>> owned(static_cast<LayerPass<Layer>*>(p));
      if (auto live = pool.lock()) release(live, std::move(owned));
    });
  }

 private:
  static void release(const std::shared_ptr<PassPool<Layer>>& pool, std::unique_ptr<LayerPass<Layer>> pass) {
    std::lock_guard<std::mutex> lock(pool->mutex);
    if (pool->idle.size() < PassPool<Layer>::limit) pool->idle.push_back(std::move(pass));
  }

  std::vector<TensorSpec> specs_;
  Layer prototype_;
  std::shared_ptr<PassPool<Layer>> pool_;
};

}  // namespace detail

template <class S>
std::unique_ptr<Kernel<S>> make_kernel(const std::string& attention, int steps, const AttentionConfig& config) {
  return with_variant(attention, steps, [&](auto integrator, auto scoring) -> std::unique_ptr<Kernel<S>> {
    using Layer = Attention<S, typename decltype(integrator)::type, typename decltype(scoring)::type>;
    Layer::check_config(config);
    return std::make_unique<detail::LayerKernel<Layer>>(config);
  });
}

}  // namespace coupledqk::python
