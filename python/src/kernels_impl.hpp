// make_kernel<S> for one scalar type, over the compiled table: the layers come from
// make_attention<S>(name, steps, config) of coupledqk::variants_layers (include/coupledqk/variants.hpp),
// so these files instantiate no layer of their own and a variant added to the table is here with
// no edit. Included by kernels_float.cpp and kernels_double.cpp, one scalar each.
#pragma once

#include "kernels.hpp"

#include <coupledqk/variants.hpp>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

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

/// Copies flat row-major buffers into the tensors `views` names (same order, sizes as specs()).
template <class S>
void load(const std::vector<TensorView<S>>& views, const std::vector<const S*>& data) {
  for (std::size_t i = 0; i < views.size(); ++i) std::copy(data[i], data[i] + views[i].size(), views[i].data);
}

/// Copies the tensors `views` names into flat buffers.
template <class S>
void store(const std::vector<TensorView<S>>& views, const std::vector<S*>& out) {
  for (std::size_t i = 0; i < views.size(); ++i)
    std::copy(views[i].data, views[i].data + views[i].size(), out[i]);
}

/// One forward's layer: its own copy of the parameters, the Context of that forward and the
/// gradient buffers (AnyAttention keeps all three), so several passes can be in flight at once.
template <class S>
class LayerPass final : public Pass<S> {
 public:
  explicit LayerPass(std::unique_ptr<AnyAttention<S>> layer) : layer_(std::move(layer)) {}
  AnyAttention<S>& layer() { return *layer_; }
  void set_rows(Index rows) { rows_ = rows; }

  void backward(const S* dy, S* dx, const std::vector<S*>& grads, int threads) const override {
    set_threads(threads);
    const Index D = layer_->config().dim;
    layer_->zero_gradients();  // written, not accumulated
    const Matrix<S> d = layer_->backward(ConstMatrixMap<S>(dy, rows_, D));
    std::copy(d.data(), d.data() + d.size(), dx);
    store(layer_->gradients(), grads);
  }

 private:
  std::unique_ptr<AnyAttention<S>> layer_;
  Index rows_ = 0;
};

/// Passes whose forward and backward are done, kept for the next forward of the same kernel: their
/// parameters, Context and gradient buffers already have the right sizes, so a training loop's
/// steps build no layer again. At most `limit` are kept (what one training step needs), so the
/// memory held between steps is one pass.
template <class S>
struct PassPool {
  static constexpr std::size_t limit = 1;
  std::mutex mutex;
  std::vector<std::unique_ptr<LayerPass<S>>> idle;
};

template <class S>
class LayerKernel final : public Kernel<S> {
 public:
  LayerKernel(std::string attention, int steps, const AttentionConfig& config)
      : attention_(std::move(attention)), steps_(steps), pool_(std::make_shared<PassPool<S>>()) {
    auto layer = make_attention<S>(attention_, steps_, config, 0);
    for (const auto& v : layer->parameters()) specs_.push_back(TensorSpec{v.name, v.shape});
    config_ = layer->config();
    pool_->idle.push_back(std::make_unique<LayerPass<S>>(std::move(layer)));  // the first forward's
  }
  const std::vector<TensorSpec>& specs() const override { return specs_; }
  const AttentionConfig& config() const override { return config_; }

  void initial_parameters(std::uint64_t seed, const std::vector<S*>& out) const override {
    store(make_attention<S>(attention_, steps_, config_, seed)->parameters(), out);
  }

  std::shared_ptr<Pass<S>> forward(const S* x, const Sequences& seqs, const std::vector<const S*>& params, S* y,
                                   bool keep, int threads) const override {
    set_threads(threads);
    std::unique_ptr<LayerPass<S>> pass;
    {
      std::lock_guard<std::mutex> lock(pool_->mutex);
      if (!pool_->idle.empty()) {
        pass = std::move(pool_->idle.back());
        pool_->idle.pop_back();
      }
    }
    if (!pass) pass = std::make_unique<LayerPass<S>>(make_attention<S>(attention_, steps_, config_, 0));
    AnyAttention<S>& layer = pass->layer();
    load(layer.parameters(), params);
    layer.check_parameters();
    const Index D = config_.dim;
    const Matrix<S> out = layer.forward(ConstMatrixMap<S>(x, seqs.rows(), D), seqs);
    std::copy(out.data(), out.data() + out.size(), y);
    pass->set_rows(seqs.rows());
    if (!keep) {
      release(pool_, std::move(pass));
      return nullptr;
    }
    // Returned to the pool when the caller lets go of it (if the kernel still exists).
    return std::shared_ptr<Pass<S>>(pass.release(), [pool = std::weak_ptr<PassPool<S>>(pool_)](Pass<S>* p) {
      std::unique_ptr<LayerPass<S>> owned(static_cast<LayerPass<S>*>(p));
      if (auto live = pool.lock()) release(live, std::move(owned));
    });
  }

 private:
  static void release(const std::shared_ptr<PassPool<S>>& pool, std::unique_ptr<LayerPass<S>> pass) {
    std::lock_guard<std::mutex> lock(pool->mutex);
    if (pool->idle.size() < PassPool<S>::limit) pool->idle.push_back(std::move(pass));
  }

  std::string attention_;
  int steps_;
  AttentionConfig config_;
  std::vector<TensorSpec> specs_;
  std::shared_ptr<PassPool<S>> pool_;
};

}  // namespace detail

template <class S>
std::unique_ptr<Kernel<S>> make_kernel(const std::string& attention, int steps, const AttentionConfig& config) {
  check_attention(attention, steps, config);  // the library's words for a name, steps or config it refuses
  return std::make_unique<detail::LayerKernel<S>>(attention, steps, config);
}

}  // namespace coupledqk::python
