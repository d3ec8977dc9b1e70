// The GPT of include/coupledqk/model/gpt.hpp on one CUDA device, and AdamW on the device.
//
//     x      = wte[tokens] + wpe[t]                         embedding kernel (kernels.cuh); without wpe
//                                                           (positions rope or none) x = wte[tokens]
//     block l:
//       x   += attn_l(ln1_l(x))                             cuda::Attention<Integrator, Scoring, T>
//       x   += proj_l(gelu(fc_l(ln2_l(x))))                 cuBLAS GEMMs + fused bias/GELU/residual kernels
//     logits = ln_f(x) wte^T                                cuBLAS, float [B*T, V]
//     loss   = mean cross-entropy                           fused softmax kernel, dlogits in place
//
//   auto host = coupledqk::make_gpt<float>(config, seed);          // the CPU model: init, checkpoints
//   auto gpu  = coupledqk::cuda::make_gpt(config, Precision::bf16); // same variant, shapes only
//   gpu->upload(*host);                                            // parameters host -> device
//   coupledqk::cuda::AdamW opt(*gpu, adamw_config);
//   gpu->zero_grad();  float l = gpu->loss(tokens, targets, B);  StepReport r = opt.step();
//   gpu->download(*host);  opt.download(cpu_adamw);                // device -> host (checkpoints)
//
// Memory: ONE flat float buffer of parameters and ONE of gradients on the device, in exactly the
// order, names and shapes of the CPU model's parameters() / gradients() views (wte, wpe, per block
// ln1.g, ln1.b, attn.* (the layer's own visit order), ln2.g, ln2.b, mlp.fc.w, mlp.fc.b,
// mlp.proj.w, mlp.proj.b, then ln_f.g, ln_f.b): upload and download are one copy per tensor, and
// each attention layer gets a pointer to its contiguous slice. With Precision::bf16 a bf16 shadow of
// the parameters feeds the GEMMs and the layers (refreshed by upload() and by every AdamW step);
// activations are stored bf16; parameters, gradients, optimiser state, every cotangent and every
// accumulation stay float32. Workspaces are allocated on the first call and reused (grow-only).
//
// Determinism: cuBLAS GEMMs and the fixed-order reductions here give the same bits run after run,
// except the embedding's scatter-add into wte (atomics) and whatever the attention layers do; GPU
// runs are reproducible to float round-off, not bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <coupledqk/core/error.hpp>
#include <coupledqk/core/parameters.hpp>
#include <coupledqk/model/gpt.hpp>
#include <coupledqk/optim/adamw.hpp>
#include <coupledqk/optim/schedule.hpp>
#include <coupledqk/registry.hpp>

#include "attention.cuh"
#include "kernels.cuh"
#include "runtime.cuh"

namespace coupledqk::cuda {

/// One tensor of the flat parameter buffer: its name and shape (as the CPU model's views), where
/// it starts, how many floats, and whether AdamW decays it (2-D tensors).
struct ParameterSpec {
  std::string name;
  std::vector<Index> shape;
  Index offset = 0;
  Index size = 0;
  bool decay = false;
};

/// Offsets into the flat buffer of every tensor the model's own kernels use.
struct GptOffsets {
  struct Block {
    Index ln1_g = 0, ln1_b = 0, attn = 0, attn_size = 0, ln2_g = 0, ln2_b = 0, fc_w = 0, fc_b = 0, proj_w = 0,
          proj_b = 0;
  };
  Index wte = 0, wpe = 0, lnf_g = 0, lnf_b = 0;
  bool has_wpe = false;  // learned positions (GptConfig::positions); rope and none have no wpe
  std::vector<Block> blocks;
};

/// The parameter layout of a GPT: the specs in order, the offsets, the dynamics' parameter count.
struct GptLayout {
  std::vector<ParameterSpec> specs;
  GptOffsets offsets;
  Index total = 0;
  Index dynamics = 0;
};

/// The layout of the GPT `config` whose attention layers are HostLayer (a coupledqk::Attention<float,
/// I, Sc>), from the shapes alone: the CPU model's one tensor list (visit_gpt_tensors) and the
/// layer's parameter_specs, the decay rule AdamW's.
template <class HostLayer>
GptLayout gpt_layout(const GptConfig& config) {
  GptLayout out;
  auto add = [&](const std::string& name, std::vector<Index> shape) {
    ParameterSpec s;
    s.name = name;
    s.decay = AdamW<float>::decays(shape);
    s.shape = std::move(shape);
    s.offset = out.total;
    s.size = 1;
    for (Index k : s.shape) s.size *= k;
    out.specs.push_back(std::move(s));
    out.total += out.specs.back().size;
    return out.specs.back().offset;
  };
  const AttentionConfig layer_config = config.attention_config(0);  // the same shapes in every layer
  const std::vector<TensorSpec> attn = HostLayer::parameter_specs(layer_config);
  const auto layer_layout = HostLayer::parameter_layout(layer_config);
  out.offsets.blocks.resize(static_cast<std::size_t>(config.layers));
  visit_gpt_tensors(
      config, static_cast<const GptTensors<float>*>(nullptr),
      [&](Index l, GptTensor id, const char* name, const GptShape& shape, GptInit, const auto*) {
        const Index at = add(gpt_tensor_name(l, name), shape.dims());
        GptOffsets::Block* b = l >= 0 ? &out.offsets.blocks[static_cast<std::size_t>(l)] : nullptr;
        switch (id) {
          case GptTensor::wte: out.offsets.wte = at; break;
          case GptTensor::wpe: out.offsets.wpe = at, out.offsets.has_wpe = true; break;
          case GptTensor::lnf_g: out.offsets.lnf_g = at; break;
          case GptTensor::lnf_b: out.offsets.lnf_b = at; break;
          case GptTensor::ln1_g: b->ln1_g = at; break;
          case GptTensor::ln1_b: b->ln1_b = at; break;
          case GptTensor::ln2_g: b->ln2_g = at; break;
          case GptTensor::ln2_b: b->ln2_b = at; break;
          case GptTensor::fc_w: b->fc_w = at; break;
          case GptTensor::fc_b: b->fc_b = at; break;
          case GptTensor::proj_w: b->proj_w = at; break;
          case GptTensor::proj_b: b->proj_b = at; break;
        }
      },
      [&](Index l) {
        GptOffsets::Block& b = out.offsets.blocks[static_cast<std::size_t>(l)];
        b.attn = out.total;
        const std::string prefix = gpt_tensor_name(l, "attn.");
        for (const auto& v : attn) add(prefix + v.name, v.shape);
        b.attn_size = out.total - b.attn;
      });
  out.dynamics = config.layers * (layer_layout.dynamics + layer_layout.rho);
  return out;
}

/// A GPT on the device whose attention variant and storage precision are fixed by the derived
/// cuda::Gpt<Integrator, Scoring, T> (make_gpt picks them at run time). Owns the flat parameter
/// and gradient buffers, a cuBLAS handle (on the default stream), and the transfers.
class AnyGpt {
 public:
  virtual ~AnyGpt() = default;
  AnyGpt(const AnyGpt&) = delete;
  AnyGpt& operator=(const AnyGpt&) = delete;

  /// The configuration, with `attention` and `steps` naming the compiled variant.
  const GptConfig& config() const { return config_; }
  Precision precision() const { return precision_; }
  const std::vector<ParameterSpec>& parameter_specs() const { return layout_.specs; }
  const GptOffsets& offsets() const { return layout_.offsets; }
  Index parameter_count() const { return layout_.total; }
  ParameterReport parameter_report() const {
    ParameterReport r;
    r.total = layout_.total;
    r.dynamics = layout_.dynamics;
    r.dynamics_percent = 100.0 * static_cast<double>(r.dynamics) / static_cast<double>(r.total);
    return r;
  }
  const Blas& blas() const { return *blas_; }
  cudaStream_t stream() const { return blas_->stream(); }

  // ---- training and evaluation -------------------------------------------------------------

  /// Mean cross-entropy of next-token prediction on a batch, with gradients ACCUMULATED (+=) into
  /// the device gradient buffer (zero_grad() between optimiser steps). tokens, targets: B*T host
  /// ids each, rows ordered (b, t); batch = B; T <= context. Synchronises (returns the value).
  virtual float loss(TokenSpan tokens, TokenSpan targets, Index batch) = 0;
  /// The same loss without gradients (the gradient buffer is untouched).
  virtual float evaluate(TokenSpan tokens, TokenSpan targets, Index batch) = 0;

  void zero_grad() { gradients_.zero(stream()); }

  // ---- the flat buffers ----------------------------------------------------------------------

  float* parameters() { return params_.data(); }
  const float* parameters() const { return params_.data(); }
  float* gradients() { return gradients_.data(); }
  const float* gradients() const { return gradients_.data(); }
  /// The bf16 shadow of the parameters (Precision::bf16), or null.
  bf16* shadow() { return precision_ == Precision::bf16 ? shadow_.data() : nullptr; }
  /// Refreshes the bf16 shadow from the float parameters; call after writing parameters() directly.
  void sync_shadow() {
    if (precision_ == Precision::bf16) kernels::refresh_shadow(params_.data(), shadow_.data(), layout_.total, stream());
  }

  // ---- host <-> device -------------------------------------------------------------------------

  /// Copies the CPU model's parameters to the device. The host model must be the same variant with
  /// the same sizes (its views must match parameter_specs() name for name, shape for shape).
  void upload(coupledqk::AnyGpt<float>& host) {
    check_host_config(host.config());
    copy_views(host.parameters(), params_.data(), true, "", "upload");
    sync_shadow();
    synchronize();
  }
  /// Copies the device parameters into the CPU model's (same checks).
  void download(coupledqk::AnyGpt<float>& host) const {
    check_host_config(host.config());
    copy_views(host.parameters(), const_cast<float*>(params_.data()), false, "", "download");
  }
  /// Gradients host -> device and device -> host (tests, debugging).
  void upload_gradients(coupledqk::AnyGpt<float>& host) {
    check_host_config(host.config());
    copy_views(host.gradients(), gradients_.data(), true, "", "upload_gradients");
  }
  void download_gradients(coupledqk::AnyGpt<float>& host) const {
    check_host_config(host.config());
    copy_views(host.gradients(), const_cast<float*>(gradients_.data()), false, "", "download_gradients");
  }
  /// The flat buffers on the host.
  std::vector<float> download_parameters() const { return download_flat(params_.data()); }
  std::vector<float> download_gradients() const { return download_flat(gradients_.data()); }
  /// Writes the flat parameters (parameter_count() floats) and refreshes the shadow.
  void upload_parameters(const std::vector<float>& flat) {
    require(static_cast<Index>(flat.size()) == layout_.total, "cuda gpt: upload_parameters got ", flat.size(),
            " floats; the model has ", layout_.total);
    COUPLEDQK_CUDA_CHECK(cudaMemcpyAsync(params_.data(), flat.data(), flat.size() * sizeof(float),
                                         cudaMemcpyHostToDevice, stream()));
    sync_shadow();
    synchronize();
  }

  /// Copies `views` (host tensors named as parameter_specs() with `prefix`, e.g. AdamW state "m.")
  /// to (to_device) or from the flat device buffer `flat`. Throws invalid_argument naming the first
  /// tensor that does not match.
  void copy_views(const std::vector<TensorView<float>>& views, float* flat, bool to_device, const std::string& prefix,
                  const char* what) const {
    const auto& specs = layout_.specs;
    require(views.size() >= specs.size(), "cuda gpt: ", what, ": the host lists ", views.size(),
            " tensors; the device model has ", specs.size(), " (", config_.attention, ")");
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const ParameterSpec& s = specs[i];
      const TensorView<float>& v = views[i];
      require(v.name == prefix + s.name && v.shape == s.shape && v.data != nullptr, "cuda gpt: ", what, ": host tensor ",
              i, " is '", v.name, "' ", shape_string(v.shape), "; the device model expects '", prefix + s.name, "' ",
              shape_string(s.shape), " (the host model must be the same variant with the same sizes)");
    }
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const ParameterSpec& s = specs[i];
      const std::size_t bytes = static_cast<std::size_t>(s.size) * sizeof(float);
      if (to_device)
        COUPLEDQK_CUDA_CHECK(cudaMemcpyAsync(flat + s.offset, views[i].data, bytes, cudaMemcpyHostToDevice, stream()));
      else
        COUPLEDQK_CUDA_CHECK(cudaMemcpyAsync(views[i].data, flat + s.offset, bytes, cudaMemcpyDeviceToHost, stream()));
    }
    synchronize();
  }

  void synchronize() const { COUPLEDQK_CUDA_CHECK(cudaStreamSynchronize(stream())); }

  /// Checks a run of ids for a batch of B = batch sequences and returns T (the CPU model's checks
  /// and messages).
  Index check_tokens(TokenSpan ids, Index batch, const char* what) const {
    return coupledqk::check_tokens(config_, ids, batch, what);
  }

 protected:
  /// named_config: attention and steps set from the policies; has_dynamics: whether the step count
  /// matters. Throws cuda_error when no device is usable.
  AnyGpt(const GptConfig& named_config, Precision precision, GptLayout layout, bool has_dynamics)
      : config_(named_config), precision_(precision), layout_(std::move(layout)), has_dynamics_(has_dynamics) {
    blas_ = std::make_unique<Blas>();
    const auto n = static_cast<std::size_t>(layout_.total);
    params_.resize(n);
    gradients_.resize(n);
    params_.zero(stream());
    gradients_.zero(stream());
    if (precision_ == Precision::bf16) {
      shadow_.resize(n);
      sync_shadow();
    }
    synchronize();
  }

 private:
  static std::string shape_string(const std::vector<Index>& shape) {
    std::ostringstream os;
    os << "[";
    for (std::size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
    os << "]";
    return os.str();
  }

  void check_host_config(const GptConfig& h) const {
    const GptConfig& c = config_;
    const Index hh = h.hidden > 0 ? h.hidden : (h.heads > 0 ? h.dim / h.heads : 0);
    const Index ch = c.hidden > 0 ? c.hidden : c.dim / c.heads;
    const bool same = h.attention == c.attention && (!has_dynamics_ || h.steps == c.steps) && h.vocab == c.vocab &&
                      h.dim == c.dim && h.layers == c.layers && h.heads == c.heads && h.context == c.context && hh == ch;
    require(same, "cuda gpt: the host model is '", h.attention, "' (", h.steps, " steps) V=", h.vocab, " D=", h.dim,
            " L=", h.layers, " H=", h.heads, " context=", h.context, " m=", hh, "; the device model is '", c.attention,
            "' (", c.steps, " steps) V=", c.vocab, " D=", c.dim, " L=", c.layers, " H=", c.heads,
            " context=", c.context, " m=", ch);
  }

  std::vector<float> download_flat(const float* flat) const {
    std::vector<float> out(static_cast<std::size_t>(layout_.total));
    COUPLEDQK_CUDA_CHECK(
        cudaMemcpyAsync(out.data(), flat, out.size() * sizeof(float), cudaMemcpyDeviceToHost, stream()));
    synchronize();
    return out;
  }

  GptConfig config_;
  Precision precision_;
  GptLayout layout_;
  bool has_dynamics_;
  std::unique_ptr<Blas> blas_;

 protected:
  DeviceBuffer<float> params_, gradients_;
  DeviceBuffer<bf16> shadow_;  // Precision::bf16 only
};

namespace detail {

/// Everything of the GPT that does not depend on the attention policies, compiled once per storage
/// type T: the forward, the loss, the backward and their workspaces. The derived cuda::Gpt supplies
/// the attention layers through two hooks.
template <class T>
class GptCore : public AnyGpt {
  static_assert(is_storage<T>::value, "cuda::Gpt: storage type must be float or bf16");

 public:
  float loss(TokenSpan tokens, TokenSpan targets, Index batch) override { return run(tokens, targets, batch, true); }
  float evaluate(TokenSpan tokens, TokenSpan targets, Index batch) override {
    return run(tokens, targets, batch, false);
  }

 protected:
  GptCore(const GptConfig& named_config, GptLayout layout, bool has_dynamics)
      : AnyGpt(named_config, std::is_same_v<T, float> ? Precision::f32 : Precision::bf16, std::move(layout),
               has_dynamics) {}

  /// y = attn_l(x): p, pt the layer's float slice and the same slice in storage T; x must stay
  /// valid until attention_backward(l).
  virtual void attention_forward(Index l, const float* p, const T* pt, const T* x, Index batch, Index seq, T* y,
                                 bool for_backward) = 0;
  /// dx = d attn_l / dx (written), dp += the layer's parameter gradients, for the last forward.
  virtual void attention_backward(Index l, const float* p, const T* pt, const float* dy, float* dx, float* dp) = 0;

  /// The parameters in storage T: the masters (float) or the bf16 shadow.
  const T* weights() const {
    if constexpr (std::is_same_v<T, float>)
      return params_.data();
    else
      return shadow_.data();
  }

 private:
  /// Activations kept from the forward for the backward, and scratch. Grow-only.
  struct Workspace {
    Index rows = 0;  // capacity in tokens (B*T)
    DeviceBuffer<std::int32_t> tokens, targets;
    std::vector<DeviceBuffer<T>> x;                   // L+1 residual streams [N, D]
    std::vector<DeviceBuffer<T>> xmid, ln1, ln2;      // L each: x + attn, ln1(x), ln2(xmid) [N, D]
    std::vector<DeviceBuffer<T>> pre, act;            // L each: fc output + bias, gelu of it [N, 4D]
    DeviceBuffer<T> lnf, attn_y;                      // [N, D]
    std::vector<DeviceBuffer<float>> mean, rstd;      // 2L+1 LayerNorms: ln1_l = 2l, ln2_l = 2l+1, ln_f = 2L
    DeviceBuffer<float> logits;                       // [N, V] (the loss's gradient in place)
    DeviceBuffer<float> fm;                           // [N, 4D] GEMM output / its gradient
    DeviceBuffer<float> fd, dres, dtmp;               // [N, D]
    DeviceBuffer<T> cot;                              // bf16: cotangents cast for the GEMMs [N, max(V, 4D)]
    DeviceBuffer<float> row_loss;                     // [N]
    DeviceBuffer<float> partials;                     // column reductions
    DeviceBuffer<double> loss_sum;                    // [1]
  };

  void reserve(Index N) {
    Workspace& w = ws_;
    if (N <= w.rows) return;
    const GptConfig& c = config();
    const Index D = c.dim, M = c.mlp_dim(), V = c.vocab, L = c.layers;
    const auto n = [](Index k) { return static_cast<std::size_t>(k); };
    w.tokens.reserve(n(N));
    w.targets.reserve(n(N));
    w.x.resize(n(L + 1));
    for (auto& b : w.x) b.reserve(n(N * D));
    for (auto* v : {&w.xmid, &w.ln1, &w.ln2}) {
      v->resize(n(L));
      for (auto& b : *v) b.reserve(n(N * D));
    }
    for (auto* v : {&w.pre, &w.act}) {
      v->resize(n(L));
      for (auto& b : *v) b.reserve(n(N * M));
    }
    w.lnf.reserve(n(N * D));
    w.attn_y.reserve(n(N * D));
    w.mean.resize(n(2 * L + 1));
    w.rstd.resize(n(2 * L + 1));
    for (auto& b : w.mean) b.reserve(n(N));
    for (auto& b : w.rstd) b.reserve(n(N));
    w.logits.reserve(n(N * V));
    w.fm.reserve(n(N * M));
    w.fd.reserve(n(N * D));
    w.dres.reserve(n(N * D));
    w.dtmp.reserve(n(N * D));
    if constexpr (!std::is_same_v<T, float>) w.cot.reserve(n(N * std::max(V, M)));
    w.row_loss.reserve(n(N));
    w.partials.reserve(n(kernels::column_chunks(N) * std::max(2 * D, M)));
    w.loss_sum.reserve(1);
    w.rows = N;
  }

  /// The cotangent x (float, n elements) in storage T: itself, or cast into the bf16 scratch.
  const T* storage(const float* x, Index n) {
    if constexpr (std::is_same_v<T, float>) {
      (void)n;
      return x;
    } else {
      convert<T, float>(x, ws_.cot.data(), n, stream());
      return ws_.cot.data();
    }
  }

  float run(TokenSpan tokens, TokenSpan targets, Index batch, bool with_gradients) {
    const Index seq = check_tokens(tokens, batch, "tokens");
    require(targets.size == tokens.size, "gpt: ", targets.size, " targets for ", tokens.size,
            " tokens; expected one target per token (B*T each)");
    check_tokens(targets, batch, "targets");
    const Index N = tokens.size;
    reserve(N);
    Workspace& w = ws_;
    const cudaStream_t s = stream();
    const GptConfig& c = config();
    const Index D = c.dim, M = c.mlp_dim(), V = c.vocab, L = c.layers;
    const GptOffsets& o = offsets();
    const float* P = parameters();
    const T* Pt = weights();
    const Blas& bl = blas();

    COUPLEDQK_CUDA_CHECK(cudaMemcpyAsync(w.tokens.data(), tokens.data, static_cast<std::size_t>(N) * sizeof(std::int32_t),
                                         cudaMemcpyHostToDevice, s));
    COUPLEDQK_CUDA_CHECK(cudaMemcpyAsync(w.targets.data(), targets.data,
                                         static_cast<std::size_t>(N) * sizeof(std::int32_t), cudaMemcpyHostToDevice, s));

    // ---- forward
    kernels::embedding_forward<T>(w.tokens.data(), P + o.wte, o.has_wpe ? P + o.wpe : nullptr, w.x[0].data(), N, seq,
                                  D, s);
    for (Index l = 0; l < L; ++l) {
      const auto& b = o.blocks[static_cast<std::size_t>(l)];
      const auto i = static_cast<std::size_t>(l);
      // x += attn(ln1(x))
      kernels::layer_norm_forward<T>(w.x[i].data(), P + b.ln1_g, P + b.ln1_b, w.ln1[i].data(), w.mean[2 * i].data(),
                                     w.rstd[2 * i].data(), N, D, s);
      attention_forward(l, P + b.attn, Pt + b.attn, w.ln1[i].data(), batch, seq, w.attn_y.data(), with_gradients);
      kernels::residual_add<T>(w.x[i].data(), w.attn_y.data(), w.xmid[i].data(), N * D, s);
      // x += proj(gelu(fc(ln2(x))))
      kernels::layer_norm_forward<T>(w.xmid[i].data(), P + b.ln2_g, P + b.ln2_b, w.ln2[i].data(),
                                     w.mean[2 * i + 1].data(), w.rstd[2 * i + 1].data(), N, D, s);
      gemm<T, float>(bl, false, false, N, M, D, 1.f, w.ln2[i].data(), D, Pt + b.fc_w, M, 0.f, w.fm.data(), M);
      kernels::bias_gelu_forward<T>(w.fm.data(), P + b.fc_b, w.pre[i].data(), w.act[i].data(), N, M, s);
      gemm<T, float>(bl, false, false, N, D, M, 1.f, w.act[i].data(), M, Pt + b.proj_w, D, 0.f, w.fd.data(), D);
      kernels::bias_residual<T>(w.xmid[i].data(), w.fd.data(), P + b.proj_b, w.x[i + 1].data(), N, D, s);
    }
    const auto lf = static_cast<std::size_t>(2 * L);
    kernels::layer_norm_forward<T>(w.x[static_cast<std::size_t>(L)].data(), P + o.lnf_g, P + o.lnf_b, w.lnf.data(),
                                   w.mean[lf].data(), w.rstd[lf].data(), N, D, s);
    // logits = ln_f(x) wte^T: [N, V]
    gemm<T, float>(bl, false, true, N, V, D, 1.f, w.lnf.data(), D, Pt + o.wte, D, 0.f, w.logits.data(), V);
    kernels::cross_entropy(w.logits.data(), w.targets.data(), w.row_loss.data(), w.loss_sum.data(), N, V,
                           with_gradients, 1.f / static_cast<float>(N), s);

    if (with_gradients) backward(N, batch, seq);

    double sum = 0;
    COUPLEDQK_CUDA_CHECK(cudaMemcpyAsync(&sum, w.loss_sum.data(), sizeof(double), cudaMemcpyDeviceToHost, s));
    synchronize();
    return static_cast<float>(sum / static_cast<double>(N));
  }

  void backward(Index N, Index batch, Index seq) {
    Workspace& w = ws_;
    const cudaStream_t s = stream();
    const GptConfig& c = config();
    const Index D = c.dim, M = c.mlp_dim(), V = c.vocab, L = c.layers;
    const GptOffsets& o = offsets();
    const float* P = parameters();
    const T* Pt = weights();
    float* G = gradients();
    const Blas& bl = blas();
    float* part = w.partials.data();

    // logits = lnf wte^T: dlnf = dZ wte, dwte += dZ^T lnf
    const T* dz = storage(w.logits.data(), N * V);
    gemm<T, float>(bl, false, false, N, D, V, 1.f, dz, V, Pt + o.wte, D, 0.f, w.dtmp.data(), D);
    gemm<T, float>(bl, true, false, V, D, N, 1.f, dz, V, w.lnf.data(), D, 1.f, G + o.wte, D);
    const auto lf = static_cast<std::size_t>(2 * L);
    kernels::layer_norm_backward<T>(w.x[static_cast<std::size_t>(L)].data(), P + o.lnf_g, w.mean[lf].data(),
                                    w.rstd[lf].data(), w.dtmp.data(), w.dres.data(), false, G + o.lnf_g, G + o.lnf_b,
                                    part, N, D, s);
    // dres: the gradient of the residual stream
    for (Index l = L - 1; l >= 0; --l) {
      const auto& b = o.blocks[static_cast<std::size_t>(l)];
      const auto i = static_cast<std::size_t>(l);
      // x_out = xmid + act proj_w + proj_b
      kernels::column_sums(w.dres.data(), N, D, G + b.proj_b, part, s);
      const T* dr = storage(w.dres.data(), N * D);
      gemm<T, float>(bl, true, false, M, D, N, 1.f, w.act[i].data(), M, dr, D, 1.f, G + b.proj_w, D);
      gemm<T, float>(bl, false, true, N, M, D, 1.f, dr, D, Pt + b.proj_w, D, 0.f, w.fm.data(), M);
      // act = gelu(pre), pre = ln2 fc_w + fc_b
      kernels::gelu_backward<T>(w.pre[i].data(), w.fm.data(), N * M, s);
      kernels::column_sums(w.fm.data(), N, M, G + b.fc_b, part, s);
      const T* dp = storage(w.fm.data(), N * M);
      gemm<T, float>(bl, true, false, D, M, N, 1.f, w.ln2[i].data(), D, dp, M, 1.f, G + b.fc_w, M);
      gemm<T, float>(bl, false, true, N, D, M, 1.f, dp, M, Pt + b.fc_w, M, 0.f, w.dtmp.data(), D);
      kernels::layer_norm_backward<T>(w.xmid[i].data(), P + b.ln2_g, w.mean[2 * i + 1].data(), w.rstd[2 * i + 1].data(),
                                      w.dtmp.data(), w.dres.data(), true, G + b.ln2_g, G + b.ln2_b, part, N, D, s);
      // xmid = x + attn(ln1(x))
      attention_backward(l, P + b.attn, Pt + b.attn, w.dres.data(), w.dtmp.data(), G + b.attn);
      kernels::layer_norm_backward<T>(w.x[i].data(), P + b.ln1_g, w.mean[2 * i].data(), w.rstd[2 * i].data(),
                                      w.dtmp.data(), w.dres.data(), true, G + b.ln1_g, G + b.ln1_b, part, N, D, s);
    }
    kernels::embedding_backward(w.tokens.data(), w.dres.data(), G + o.wte, o.has_wpe ? G + o.wpe : nullptr, batch, seq,
                                D, s);
  }

  Workspace ws_;
};

}  // namespace detail

/// The compiled model: L layers of cuda::Attention<Integrator, Scoring, T> (T: activation storage,
/// float or bf16). Parameters start at zero: upload() a CPU model's (which holds the initialisation).
template <class Integrator, class Scoring, class T = float>
class Gpt final : public detail::GptCore<T> {
 public:
  using Layer = Attention<Integrator, Scoring, T>;
  using HostLayer = typename Layer::Host;
  using Context = typename Layer::Context;

  /// config.attention and config.steps are set from the policies (as coupledqk::Gpt does; `name`
  /// for policies outside the built-in table).
  explicit Gpt(const GptConfig& config, const std::string& name = {}) : Gpt(named(config, name), 0) {}

  Layer& layer(Index l) { return *layers_.at(static_cast<std::size_t>(l)); }
  const Layer& layer(Index l) const { return *layers_.at(static_cast<std::size_t>(l)); }

 protected:
  void attention_forward(Index l, const float* p, const T* pt, const T* x, Index batch, Index seq, T* y,
                         bool for_backward) override {
    const auto i = static_cast<std::size_t>(l);
    layers_[i]->forward(this->blas(), p, pt, x, batch, seq, y, *contexts_[i], for_backward);
  }
  void attention_backward(Index l, const float* p, const T* pt, const float* dy, float* dx, float* dp) override {
    const auto i = static_cast<std::size_t>(l);
    layers_[i]->backward(this->blas(), p, pt, *contexts_[i], dy, dx, dp);
  }

 private:
  Gpt(const GptConfig& c, int) : detail::GptCore<T>(c, gpt_layout<HostLayer>(c), Integrator::has_dynamics) {
    for (Index l = 0; l < c.layers; ++l) {
      layers_.push_back(std::make_unique<Layer>(c.attention_config(static_cast<int>(l))));
      contexts_.push_back(std::make_unique<Context>());
      const Index expected = this->offsets().blocks[static_cast<std::size_t>(l)].attn_size;
      require(layers_.back()->parameter_count() == expected, "cuda gpt: the CUDA attention layer has ",
              layers_.back()->parameter_count(), " parameters; the host layer's views hold ", expected);
    }
  }

  static GptConfig named(GptConfig c, const std::string& name) {
    ::coupledqk::validate(c);
    c.attention = variant_name<Integrator, Scoring>(name);
    if constexpr (Integrator::has_dynamics) c.steps = Integrator::steps;
    return c;
  }

  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<std::unique_ptr<Context>> contexts_;
};

/// Which of a variant's two policies have device kernels: its integrator (DeviceDynamics<I>,
/// dynamics.cuh) and its scoring (DeviceScoring<Sc>, scoring.cuh).
struct DeviceSupport {
  bool integrator = false;
  bool scoring = false;
  constexpr bool both() const { return integrator && scoring; }
};

template <class I, class Sc>
constexpr DeviceSupport device_support_of() {
  return DeviceSupport{has_device_dynamics<I>, DeviceScoring<Sc>::supported};
}

/// The device support of `table`'s variant `name` with `steps` steps (for tools that report it).
/// Throws coupledqk::invalid_argument, listing what is accepted, for an unknown name or step count.
template <class... E>
DeviceSupport device_support(const VariantTable<E...>& table, std::string_view name, int steps = 1) {
  return table.dispatch(name, steps, [](auto integrator, auto scoring) {
    return device_support_of<typename decltype(integrator)::type, typename decltype(scoring)::type>();
  });
}
inline DeviceSupport device_support(std::string_view name, int steps = 1) {
  return device_support(builtin_variants, name, steps);
}

/// Whether `table`'s variant `name` with `steps` steps has device kernels, for its integrator and
/// its scoring. False for unknown names and step counts.
template <class... E>
bool variant_supported(const VariantTable<E...>& table, std::string_view name, int steps) {
  if (!table.contains(name) || steps < 1 || steps > max_steps) return false;
  return device_support(table, name, steps).both();
}
inline bool variant_supported(std::string_view name, int steps) { return variant_supported(builtin_variants, name, steps); }

namespace detail {
/// "its integrator 'x' has no device kernels (...)" and / or the same for its scoring.
inline std::string missing_device_kernels(const DeviceSupport& s, const char* integrator, const char* scoring) {
  std::string out;
  if (!s.integrator)
    out += std::string("its integrator '") + integrator +
           "' has no device kernels (no cuda::DeviceDynamics specialisation for its family, dynamics.cuh, or "
           "outside its limits)";
  if (!s.scoring)
    out += std::string(out.empty() ? "" : "; ") + "its scoring '" + scoring +
           "' has no device kernels (no cuda::DeviceScoring specialisation, scoring.cuh)";
  return out;
}
}  // namespace detail

/// The device GPT whose attention layers are the variant config.attention with config.steps steps
/// from `table` (default: the built-in variants), storing activations in `precision`. Throws
/// coupledqk::invalid_argument for an unknown name, step count, a variant without device kernels
/// (naming the policy that lacks them: device_support) or unusable sizes, cuda_error when no device
/// is usable. (A template only so that translation units that include this header without calling
/// it do not compile every variant x 2 precisions.)
template <int = 0, class... E>
std::unique_ptr<AnyGpt> make_gpt(const GptConfig& config, Precision precision, const VariantTable<E...>& table) {
  ::coupledqk::validate(config);
  return table.dispatch(config.attention, config.steps, [&](auto integrator, auto scoring) -> std::unique_ptr<AnyGpt> {
    using I = typename decltype(integrator)::type;
    using Sc = typename decltype(scoring)::type;
    constexpr DeviceSupport support = device_support_of<I, Sc>();
    if constexpr (!support.both()) {
      require(false, "cuda gpt: attention '", config.attention, "' with ", config.steps,
              " steps has no device kernels: ", detail::missing_device_kernels(support, I::name, Sc::name));
      return nullptr;
    } else {
      if (precision == Precision::bf16) return std::make_unique<Gpt<I, Sc, bf16>>(config, config.attention);
      return std::make_unique<Gpt<I, Sc, float>>(config, config.attention);
    }
  });
}
template <int = 0>
std::unique_ptr<AnyGpt> make_gpt(const GptConfig& config, Precision precision) {
  return make_gpt(config, precision, builtin_variants);
}

// ---- AdamW on the device ------------------------------------------------------------------------------

/// optim/adamw.hpp's AdamW over the model's flat buffers: the same update, schedule, clipping
/// (factor from the pre-clip global norm, accumulated in double), decay on 2-D tensors only, and a
/// non-finite norm skips the step. Its state (m, v, step count) transfers to and from a CPU
/// coupledqk::AdamW<float> over the same model (the state() views: m.<name>, v.<name>, step), so
/// checkpoints are interchangeable. With Precision::bf16 each step also refreshes the shadow.
class AdamW {
 public:
  AdamW(AnyGpt& model, const AdamWConfig& config)
      : model_(&model), config_(config), schedule_(config.schedule()) {
    ::coupledqk::validate(config_);
    const auto n = static_cast<std::size_t>(model.parameter_count());
    m_.resize(n);
    v_.resize(n);
    m_.zero(model.stream());
    v_.zero(model.stream());
    std::vector<std::uint8_t> mask(n, 0);
    for (const ParameterSpec& s : model.parameter_specs())
      if (s.decay) std::fill(mask.begin() + s.offset, mask.begin() + s.offset + s.size, std::uint8_t(1));
    decay_.upload(mask);
    partials_.resize(kernels::norm_blocks);
    norm_.resize(1);
    model.synchronize();
  }
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;

  const AdamWConfig& config() const { return config_; }
  const CosineSchedule& schedule() const { return schedule_; }
  Index steps_done() const { return step_; }

  /// The global gradient norm of the model (sqrt of the sum of squares, in double). Synchronises.
  double grad_norm() {
    kernels::sum_squares(model_->gradients(), model_->parameter_count(), partials_.data(), norm_.data(),
                         model_->stream());
    double sum = 0;
    COUPLEDQK_CUDA_CHECK(cudaMemcpyAsync(&sum, norm_.data(), sizeof(double), cudaMemcpyDeviceToHost, model_->stream()));
    model_->synchronize();
    return std::sqrt(sum);
  }

  /// One update with lr = schedule().at(steps_done()) (AdamW<float>::step's contract).
  StepReport step() {
    StepReport r;
    const Index t = step_ + 1;
    r.lr = schedule_.at(t - 1);
    r.grad_norm = grad_norm();
    if (!std::isfinite(r.grad_norm)) {
      r.skipped = true;
      r.step = t - 1;
      return r;
    }
    if (config_.clip_norm > 0 && r.grad_norm > config_.clip_norm) r.clip_scale = config_.clip_norm / r.grad_norm;
    const kernels::AdamWStepConstants k = kernels::adamw_constants(config_.beta1, config_.beta2, config_.eps,
                                                                   config_.weight_decay, r.lr, r.clip_scale, t);
    kernels::adamw_update(model_->parameters(), model_->gradients(), m_.data(), v_.data(), decay_.data(),
                          model_->shadow(), model_->parameter_count(), k, model_->stream());
    step_ = t;
    r.step = t;
    return r;
  }

  /// The state into a CPU optimiser over a model of the same variant and sizes.
  void download(coupledqk::AdamW<float>& host) const {
    std::vector<TensorView<float>> s = host.state();
    check_state(s, "download");
    const std::size_t K = model_->parameter_specs().size();
    model_->copy_views(s, const_cast<float*>(m_.data()), false, "m.", "AdamW download (m)");
    model_->copy_views(std::vector<TensorView<float>>(s.begin() + static_cast<std::ptrdiff_t>(K), s.end()),
                       const_cast<float*>(v_.data()), false, "v.", "AdamW download (v)");
    s.back().data[0] = static_cast<float>(step_);
  }

  /// The state from a CPU optimiser (its step count must be a non-negative integer).
  void upload(coupledqk::AdamW<float>& host) {
    std::vector<TensorView<float>> s = host.state();
    check_state(s, "upload");
    const Index steps = host.steps_done();
    const std::size_t K = model_->parameter_specs().size();
    model_->copy_views(s, m_.data(), true, "m.", "AdamW upload (m)");
    model_->copy_views(std::vector<TensorView<float>>(s.begin() + static_cast<std::ptrdiff_t>(K), s.end()), v_.data(),
                       true, "v.", "AdamW upload (v)");
    step_ = steps;
  }

  /// m and v on the host (flat, the model's layout).
  std::vector<float> download_m() const { return m_.download(); }
  std::vector<float> download_v() const { return v_.download(); }

 private:
  void check_state(const std::vector<TensorView<float>>& s, const char* what) const {
    const std::size_t K = model_->parameter_specs().size();
    require(s.size() == 2 * K + 1 && s.back().name == "step" && s.back().size() == 1, "cuda AdamW ", what,
            ": the host optimiser's state has ", s.size(), " tensors; expected m.* and v.* of the model's ", K,
            " tensors and 'step' (an optimiser over a model of the same variant and sizes)");
  }

  AnyGpt* model_;
  AdamWConfig config_;
  CosineSchedule schedule_;
  DeviceBuffer<float> m_, v_;
  DeviceBuffer<std::uint8_t> decay_;
  DeviceBuffer<double> partials_, norm_;
  Index step_ = 0;
};

}  // namespace coupledqk::cuda
