// A GPT-2 style decoder built on coupled query-key attention layers (method spec section 6).
//
//     x      = wte[tokens] (+ wpe[positions] with learned positions)  [B*T, D], rows ordered (b, t)
//     block l (pre-LayerNorm), l = 0..L-1:
//       x   += attn_l(ln1_l(x))                                  Attention<S, Integrator, Scoring>
//       x   += proj_l(gelu_tanh(fc_l(ln2_l(x))))                 fc: [D, 4D] + b, proj: [4D, D] + b
//     x      = ln_f(x)
//     logits = x wte^T                                           [B*T, V], tied output embedding
//     loss   = mean over tokens of cross-entropy(logits, targets)
//
// Gpt<S, Integrator, Scoring> is the compiled model; AnyGpt<S> is its run-time interface and
// make_gpt<S>(config, seed) picks the policies from config.attention and config.steps through
// coupledqk::with_variant. Every op is one tape node (autodiff/ops.hpp); an attention layer is one
// node whose backward is the layer's own analytic backward.
//
// Positions (GptConfig::positions): learned absolute embeddings wpe added to x (GPT-2, the
// default), rotary embeddings of every layer's q and k (rope: no wpe; AttentionConfig::positions,
// with rope_base and rope_order), or none (no wpe, no rotation). GptConfig::window gives every layer
// a causal sliding window (0: none). A GPT is always causal.
//
// Parameter names (visit order; checkpoints and the optimiser rely on it):
//   wte [V, D], wpe [T, D] (learned positions only),
//   h.<l>.ln1.g [D], h.<l>.ln1.b [D], h.<l>.attn.<layer tensor> (wq, wk, wv, wo [D, D], dyn.* and
//   dyn.rho [H] for coupled/uncoupled layers, lq1 lk1 lq2 lk2 [d] and subln [2d] for Differential),
//   h.<l>.ln2.g, h.<l>.ln2.b, h.<l>.mlp.fc.w [D, 4D], h.<l>.mlp.fc.b [4D], h.<l>.mlp.proj.w [4D, D],
//   h.<l>.mlp.proj.b [D], ln_f.g [D], ln_f.b [D].
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../attention.hpp"
#include "attention_op.hpp"
#include "../autodiff/ops.hpp"
#include "../autodiff/tape.hpp"
#include "../core/error.hpp"
#include "../core/parameters.hpp"
#include "../core/random.hpp"
#include "../core/types.hpp"
#include "../io/quote.hpp"
#include "../registry.hpp"

namespace coupledqk {

/// Where a GPT's positions come from: a learned table wpe added to the embeddings (GPT-2), rotary
/// embeddings in every attention layer, or nowhere.
enum class GptPositions { learned, rope, none };

inline const char* to_string(GptPositions p) {
  return p == GptPositions::rope ? "rope" : p == GptPositions::none ? "none" : "learned";
}

/// "learned", "rope" or "none"; anything else throws invalid_argument naming `what` and the value.
inline GptPositions parse_gpt_positions(const std::string& name, const char* what = "positions") {
  if (name == "learned") return GptPositions::learned;
  if (name == "rope") return GptPositions::rope;
  if (name == "none") return GptPositions::none;
  throw invalid_argument(std::string(what) + " is \"" + io::detail::quote(name) +
                         "\"; expected learned, rope or none");
}

/// Sizes and initialisation of a GPT. Defaults follow GPT-2 and the method spec.
struct GptConfig {
  Index vocab = 0;    ///< V, vocabulary size
  Index dim = 0;      ///< D, model width
  Index layers = 0;   ///< L, number of blocks
  Index heads = 0;    ///< H, query/key pairs per token in each attention layer
  Index context = 0;  ///< maximum sequence length (rows of wpe); a batch may use any T <= context
  Index hidden = 0;   ///< m, dynamics hidden width; 0 means m = D/H
  /// variant name (registry.hpp: attention_names()); default: the table's first entry without
  /// dynamics (standard attention)
  std::string attention = builtin_variants.first_without_dynamics();
  int steps = 1;                       ///< integration sub-steps N, 1..max_steps
  double init_std = 0.02;              ///< std of every weight matrix and embedding (GPT-2)
  double dynamics_init_scale = 0.0;    ///< AttentionConfig::dynamics_init_scale (0: standard at init)
  double init_time = 1.0;              ///< AttentionConfig::init_time (tau at init)
  DynamicsMemory memory = DynamicsMemory::store;  ///< AttentionConfig::memory
  bool reference_kernels = false;                 ///< AttentionConfig::reference_kernels
  GptPositions positions = GptPositions::learned;  ///< learned wpe (default), rope or none
  double rope_base = default_rope_base;            ///< AttentionConfig::rope_base (positions = rope)
  RopeOrder rope_order = RopeOrder::dynamics_then_rotate;  ///< AttentionConfig::rope_order
  Index window = 0;  ///< every layer's causal sliding window (AttentionConfig::window; 0: none)

  Index mlp_dim() const { return 4 * dim; }

  /// The attention layer of block `layer`.
  AttentionConfig attention_config(int layer) const {
    AttentionConfig c;
    c.dim = dim;
    c.heads = heads;
    c.hidden = hidden;
    c.layer_index = layer;
    c.init_std = init_std;
    c.dynamics_init_scale = dynamics_init_scale;
    c.init_time = init_time;
    c.memory = memory;
    c.reference_kernels = reference_kernels;
    c.window = window;
    if (positions == GptPositions::rope) {
      c.positions = Positions::rope;
      c.rope_base = rope_base;
      c.rope_order = rope_order;
    }
    return c;
  }
};

/// Throws a descriptive coupledqk::invalid_argument unless the sizes are usable. (The variant name
/// and step count are checked by make_gpt through with_variant; the attention layers check what is
/// specific to their policies, e.g. an even head count for Differential.)
inline void validate(const GptConfig& c) {
  require(c.vocab > 0, "gpt: vocab (V) must be positive; got ", c.vocab);
  require(c.vocab <= INT32_MAX, "gpt: vocab (V) must fit token ids of type int32; got ", c.vocab);
  require(c.dim > 0, "gpt: dim (D) must be positive; got ", c.dim);
  require(c.layers > 0, "gpt: layers (L) must be positive; got ", c.layers);
  require(c.heads > 0, "gpt: heads (H) must be positive; got ", c.heads);
  require(c.dim % c.heads == 0, "gpt: dim (D) must be divisible by heads (H); got D = ", c.dim, ", H = ",
          c.heads, " (D/H = ", static_cast<double>(c.dim) / static_cast<double>(c.heads), ")");
  require(c.context > 0, "gpt: context (maximum sequence length T) must be positive; got ", c.context);
  require(c.hidden >= 0, "gpt: hidden (m) must be >= 0 (0 means m = D/H); got ", c.hidden);
  require(c.steps >= 1, "gpt: steps must be >= 1; got ", c.steps);
  require(std::isfinite(c.init_std) && c.init_std >= 0, "gpt: init_std must be finite and >= 0; got ",
          c.init_std);
  require(c.window >= 0, "gpt: window must be >= 0 (0 means no window); got ", c.window);
  if (c.positions == GptPositions::rope) {
    require((c.dim / c.heads) % 2 == 0, "gpt: positions = rope needs an even head width D/H; got D/H = ",
            c.dim / c.heads, " (D = ", c.dim, ", H = ", c.heads, ")");
    require(std::isfinite(c.rope_base) && c.rope_base > 1, "gpt: rope_base must be finite and > 1; got ",
            c.rope_base);
  }
}

/// Parameter counts: all, and the dynamics alone (dyn.* and dyn.rho of every layer).
struct ParameterReport {
  Index total = 0;
  Index dynamics = 0;
  double dynamics_percent = 0;  ///< 100 * dynamics / total
};

/// A read-only run of token ids (int32), from a pointer and a length or from a std::vector.
struct TokenSpan {
  const std::int32_t* data = nullptr;
  Index size = 0;
  TokenSpan() = default;
  TokenSpan(const std::int32_t* d, Index n) : data(d), size(n) {}
  TokenSpan(const std::vector<std::int32_t>& v) : data(v.data()), size(static_cast<Index>(v.size())) {}
};

/// Checks a run of token ids for a batch of B = batch sequences of a model with this config and
/// returns T: B*T ids, T <= context, every id in [0, vocab). `what` names the run in messages.
/// (The CPU and the CUDA models share it, so their messages are the same.)
inline Index check_tokens(const GptConfig& config, TokenSpan ids, Index batch, const char* what) {
  require(batch > 0, "gpt: batch (B) must be positive; got ", batch);
  require(ids.size > 0 && ids.data != nullptr, "gpt: no ", what, "; expected B*T > 0 ids");
  require(ids.size % batch == 0, "gpt: ", ids.size, " ", what, " is not a multiple of batch B = ", batch,
          " (expected B*T ids, rows ordered (b, t))");
  const Index T = ids.size / batch;
  require(T <= config.context, "gpt: sequence length T = ", T, " (", ids.size, " ", what, " / B = ", batch,
          ") exceeds the context of ", config.context);
  for (Index i = 0; i < ids.size; ++i)
    require(ids.data[i] >= 0 && ids.data[i] < config.vocab, "gpt: ", what, " id ", ids.data[i], " at position ", i,
            " is outside the vocabulary [0, ", config.vocab, ")");
  return T;
}

/// The non-attention tensors of one block.
template <class S>
struct GptBlock {
  Vector<S> ln1_g, ln1_b;  // [D]
  Vector<S> ln2_g, ln2_b;  // [D]
  Matrix<S> fc_w;          // [D, 4D], stored [in, out]
  Vector<S> fc_b;          // [4D]
  Matrix<S> proj_w;        // [4D, D]
  Vector<S> proj_b;        // [D]
};

/// Every tensor of the model except the attention layers' (those live in the layers).
template <class S>
struct GptTensors {
  Matrix<S> wte;  // [V, D], also the output projection (tied)
  Matrix<S> wpe;  // [context, D]; empty unless positions = learned
  std::vector<GptBlock<S>> h;
  Vector<S> lnf_g, lnf_b;  // [D]
};

/// The GPT's own tensors, one id each (the attention layers' come from their Parameters).
enum class GptTensor { wte, wpe, ln1_g, ln1_b, ln2_g, ln2_b, fc_w, fc_b, proj_w, proj_b, lnf_g, lnf_b };

/// How a tensor starts (GPT-2): N(0, init_std^2), N(0, (init_std / sqrt(2L))^2) for the residual
/// projections, ones (LayerNorm gains) or zeros (biases).
enum class GptInit { normal, residual_normal, ones, zeros };

/// A tensor's shape: [rows] (rank 1) or [rows, cols] (rank 2).
struct GptShape {
  int rank = 1;
  Index rows = 0, cols = 1;
  Index size() const { return rows * cols; }
  std::vector<Index> dims() const { return rank == 1 ? std::vector<Index>{rows} : std::vector<Index>{rows, cols}; }
};

/// THE list of the model's tensors, in file order (see the names at the top of this file). For
/// every tensor of the model's own it calls
///
///     f(block, id, name, shape, init, tensor)      block: -1 outside the blocks; name without the
///                                                   "h.<block>." prefix; tensor: Matrix<S>* or
///                                                   Vector<S>* into `t` (null when t is null)
///
/// and attention(block) where block l's attention layer's tensors go (between ln1 and ln2).
/// Construction, zeroing, counting, named views, checkpoint names and the CUDA layout all walk it;
/// with t = null it describes the shapes alone. Allocates nothing.
template <class Tensors, class F, class A>
void visit_gpt_tensors(const GptConfig& c, Tensors* t, F&& f, A&& attention) {
  const Index V = c.vocab, D = c.dim, C = c.context, M = c.mlp_dim();
  const GptShape vec_d{1, D, 1}, mat_dd_m{2, D, M}, mat_m_d{2, M, D}, vec_m{1, M, 1};
  f(Index(-1), GptTensor::wte, "wte", GptShape{2, V, D}, GptInit::normal, t ? &t->wte : nullptr);
  if (c.positions == GptPositions::learned)
    f(Index(-1), GptTensor::wpe, "wpe", GptShape{2, C, D}, GptInit::normal, t ? &t->wpe : nullptr);
  for (Index l = 0; l < c.layers; ++l) {
    auto* b = t ? &t->h[static_cast<std::size_t>(l)] : nullptr;
    f(l, GptTensor::ln1_g, "ln1.g", vec_d, GptInit::ones, b ? &b->ln1_g : nullptr);
    f(l, GptTensor::ln1_b, "ln1.b", vec_d, GptInit::zeros, b ? &b->ln1_b : nullptr);
    attention(l);
    f(l, GptTensor::ln2_g, "ln2.g", vec_d, GptInit::ones, b ? &b->ln2_g : nullptr);
    f(l, GptTensor::ln2_b, "ln2.b", vec_d, GptInit::zeros, b ? &b->ln2_b : nullptr);
    f(l, GptTensor::fc_w, "mlp.fc.w", mat_dd_m, GptInit::normal, b ? &b->fc_w : nullptr);
    f(l, GptTensor::fc_b, "mlp.fc.b", vec_m, GptInit::zeros, b ? &b->fc_b : nullptr);
    f(l, GptTensor::proj_w, "mlp.proj.w", mat_m_d, GptInit::residual_normal, b ? &b->proj_w : nullptr);
    f(l, GptTensor::proj_b, "mlp.proj.b", vec_d, GptInit::zeros, b ? &b->proj_b : nullptr);
  }
  f(Index(-1), GptTensor::lnf_g, "ln_f.g", vec_d, GptInit::ones, t ? &t->lnf_g : nullptr);
  f(Index(-1), GptTensor::lnf_b, "ln_f.b", vec_d, GptInit::zeros, t ? &t->lnf_b : nullptr);
}

/// "h.<block>.<name>", or name outside the blocks.
inline std::string gpt_tensor_name(Index block, const char* name) {
  return block < 0 ? std::string(name) : "h." + std::to_string(block) + "." + name;
}


/// A GPT whose attention variant is fixed by the derived Gpt<S, Integrator, Scoring> (make_gpt picks
/// it at run time). Everything that does not depend on the attention policies is here, compiled
/// once per scalar type; the derived class supplies the attention layers through six hooks. (So
/// the registry's variants cost little more to compile than the layers themselves.)
template <class S>
class Decoder;  // model/decoder.hpp (included at the end of this file)

template <class S>
class AnyGpt {
 public:
  virtual ~AnyGpt() = default;
  /// A KV-cache decoder over this model (which must outlive it): the compiled model knows its own
  /// policies, so no variant table is needed (model/decoder.hpp: GptDecoder).
  virtual std::unique_ptr<Decoder<S>> make_decoder() = 0;
  AnyGpt(const AnyGpt&) = delete;
  AnyGpt& operator=(const AnyGpt&) = delete;

  /// The configuration, with `attention` and `steps` naming the compiled variant.
  const GptConfig& config() const { return config_; }
  Index layers() const { return config_.layers; }

  // ---- training and evaluation -------------------------------------------------------------

  /// Mean cross-entropy of next-token prediction on a batch, with gradients: clears the tape, builds
  /// the forward on it, runs the backward and clears it again (its buffers are kept for the next
  /// call). Gradients are ACCUMULATED (+=) into the model's gradient buffer: call zero_grad()
  /// between optimiser steps. tokens, targets: B*T ids each, rows ordered (b, t); batch = B;
  /// T <= context.
  S loss(Tape<S>& t, TokenSpan tokens, TokenSpan targets, Index batch) {
    t.clear();
    const Var l = forward_loss(t, tokens, targets, batch, true);
    const S value = t.scalar(l);
    t.backward(l);
    t.clear();
    return value;
  }

  /// The same loss without gradients (nothing is kept for a backward; the model is not modified).
  S evaluate(Tape<S>& t, TokenSpan tokens, TokenSpan targets, Index batch) const {
    t.clear();
    const S value = t.scalar(mutable_self().forward_loss(t, tokens, targets, batch, false));
    t.clear();
    return value;
  }

  /// Logits [B*T, V] without gradients.
  Matrix<S> logits(Tape<S>& t, TokenSpan tokens, Index batch) const {
    t.clear();
    Matrix<S> out = t.value(mutable_self().forward(t, tokens, batch, false));
    t.clear();
    return out;
  }

  // ---- building graphs ---------------------------------------------------------------------

  /// Appends the forward to the tape (without clearing it) and returns the logits node [B*T, V].
  /// with_gradients: whether a later tape.backward() accumulates into the model's gradient buffer;
  /// false binds every parameter as a constant (nothing is kept for a backward).
  Var forward(Tape<S>& t, TokenSpan tokens, Index batch, bool with_gradients) {
    return forward_probed(t, tokens, batch, with_gradients, nullptr);
  }

  /// Per block: how far the attention layer's dynamics move its queries and keys on these tokens,
  /// and its integration times (Attention::dynamics_diagnostics on the layer's actual input, ln1(x)).
  /// Clears the tape; modifies nothing.
  std::vector<LayerDynamics> dynamics_diagnostics(Tape<S>& t, TokenSpan tokens, Index batch) const {
    std::vector<LayerDynamics> out;
    t.clear();
    mutable_self().forward_probed(t, tokens, batch, false, &out);
    t.clear();
    return out;
  }

  /// forward(); with a probe, also each block's dynamics diagnostics (see dynamics_diagnostics).
  Var forward_probed(Tape<S>& t, TokenSpan tokens, Index batch, bool with_gradients, std::vector<LayerDynamics>* probe) {
    const Index T = check_tokens(tokens, batch, "tokens");
    const Index N = tokens.size;
    auto bind = [&](const auto& value, auto& grad) { return t.parameter(value, with_gradients ? &grad : nullptr); };

    // x = wte[tokens] (+ wpe[t], row (b, t) -> position t, with learned positions): [B*T, D]
    const Var wte = bind(params_.wte, grads_.wte);
    Var x = ops::embedding(t, wte, tokens.data, N);
    if (config_.positions == GptPositions::learned)
      x = ops::add(t, x, ops::position_embedding(t, bind(params_.wpe, grads_.wpe), N, T));

    for (Index l = 0; l < config_.layers; ++l) {
      const GptBlock<S>& p = params_.h[static_cast<std::size_t>(l)];
      GptBlock<S>& g = grads_.h[static_cast<std::size_t>(l)];
      // x += attn(ln1(x))
      Var a = ops::layer_norm(t, x, bind(p.ln1_g, g.ln1_g), bind(p.ln1_b, g.ln1_b));
      if (probe) probe->push_back(attention_dynamics(l, t.value(a), batch));
      a = attention_node(t, l, a, batch, with_gradients);
      x = ops::add(t, x, a);
      // x += proj(gelu(fc(ln2(x))))
      Var m = ops::layer_norm(t, x, bind(p.ln2_g, g.ln2_g), bind(p.ln2_b, g.ln2_b));
      m = ops::linear(t, m, bind(p.fc_w, g.fc_w), bind(p.fc_b, g.fc_b));  // [B*T, 4D]
      m = ops::gelu(t, m);
      m = ops::linear(t, m, bind(p.proj_w, g.proj_w), bind(p.proj_b, g.proj_b));  // [B*T, D]
      x = ops::add(t, x, m);
    }
    x = ops::layer_norm(t, x, bind(params_.lnf_g, grads_.lnf_g), bind(params_.lnf_b, grads_.lnf_b));
    return ops::matmul_transposed(t, x, wte);  // tied: wte's gradient sums both uses
  }

  /// forward() followed by the mean cross-entropy against `targets`: a [1, 1] node.
  Var forward_loss(Tape<S>& t, TokenSpan tokens, TokenSpan targets, Index batch, bool with_gradients) {
    check_tokens(tokens, batch, "tokens");
    require(targets.size == tokens.size, "gpt: ", targets.size, " targets for ", tokens.size,
            " tokens; expected one target per token (B*T each)");
    check_tokens(targets, batch, "targets");
    return ops::cross_entropy(t, forward(t, tokens, batch, with_gradients), targets.data, targets.size);
  }

  // ---- parameters --------------------------------------------------------------------------

  /// Sets the gradient buffer to zero (allocates nothing).
  void zero_grad() {
    visit_gpt_tensors(
        config_, &grads_, [](Index, GptTensor, const char*, const GptShape&, GptInit, auto* t) { t->setZero(); },
        [&](Index l) { zero_attention_gradients(l); });
  }

  /// Named views of every parameter (see the names at the top of this file) and of its gradient:
  /// same order, names and shapes.
  std::vector<TensorView<S>> parameters() { return views(false); }
  std::vector<TensorView<S>> gradients() { return views(true); }

  ParameterReport parameter_report() const {
    ParameterReport r;
    visit_gpt_tensors(
        config_, &params_, [&](Index, GptTensor, const char*, const GptShape&, GptInit, const auto* t) { r.total += t->size(); },
        [&](Index l) {
          r.total += attention_parameter_count(l, false);
          r.dynamics += attention_parameter_count(l, true);
        });
    r.dynamics_percent = 100.0 * static_cast<double>(r.dynamics) / static_cast<double>(r.total);
    return r;
  }

  /// Throws if any parameter is NaN or infinite (e.g. after loading a checkpoint), naming it.
  void check_parameters() const {
    for (const auto& v : mutable_self().parameters())
      for (Index i = 0; i < v.size(); ++i)
        require(std::isfinite(v.data[i]), "parameter '", v.name, "' holds a non-finite value (", v.data[i],
                ") at flat index ", i, "; every parameter must be finite");
  }

  /// The non-attention parameters and their gradients (the attention layers: Gpt::layer(l)).
  GptTensors<S>& tensors() { return params_; }
  const GptTensors<S>& tensors() const { return params_; }
  GptTensors<S>& tensor_gradients() { return grads_; }

  /// Checks a run of ids for a batch of B = batch sequences and returns T. `what` names it.
  Index check_tokens(TokenSpan ids, Index batch, const char* what) const {
    return coupledqk::check_tokens(config_, ids, batch, what);
  }

 protected:
  /// GPT-2 initialisation from one seed (coupledqk::Rng, the same on every platform), drawn in this
  /// order: wte, wpe (learned positions only) ~ N(0, init_std^2); then per block: the attention layer's seed
  /// (layer_seeds()[l]), mlp.fc.w ~ N(0, init_std^2), mlp.proj.w ~ N(0, (init_std / sqrt(2L))^2).
  /// Biases 0, LayerNorm gains 1. The derived class builds the layers from layer_seeds() and
  /// scales their wo by 1 / sqrt(2L) (the other residual projection).
  AnyGpt(const GptConfig& config, std::uint64_t seed) : config_(config) {
    validate(config_);
    Rng rng(seed);
    params_.h.resize(static_cast<std::size_t>(config_.layers));
    visit_gpt_tensors(
        config_, &params_,
        [&](Index, GptTensor, const char*, const GptShape& shape, GptInit init, auto* t) {
          t->resize(shape.rows, shape.cols);
          switch (init) {
            case GptInit::normal: rng.fill_normal(*t, config_.init_std); break;
            case GptInit::residual_normal: rng.fill_normal(*t, config_.init_std * residual_scale()); break;
            case GptInit::ones: t->setOnes(); break;
            case GptInit::zeros: t->setZero(); break;
          }
        },
        [&](Index) { layer_seeds_.push_back(rng.next_u64()); });
    // gradients: same shapes, zeros
    grads_ = params_;
    visit_gpt_tensors(
        config_, &grads_, [](Index, GptTensor, const char*, const GptShape&, GptInit, auto* t) { t->setZero(); },
        [](Index) {});
  }

  /// 1 / sqrt(2L): the init scale of the residual projections (wo, mlp.proj.w).
  double residual_scale() const { return 1.0 / std::sqrt(2.0 * static_cast<double>(config_.layers)); }
  const std::vector<std::uint64_t>& layer_seeds() const { return layer_seeds_; }

  // ---- the hooks: block l's attention layer ----
  /// y = attn_l(x) as one tape node; with_gradients: accumulate the layer's parameter gradients
  /// into the model's buffer on backward.
  virtual Var attention_node(Tape<S>& t, Index l, Var x, Index batch, bool with_gradients) = 0;
  /// Appends the layer's named views (names prefixed) to params and its gradients' to grads.
  virtual void attention_views(Index l, const std::string& prefix, std::vector<TensorView<S>>* params,
                               std::vector<TensorView<S>>* grads) = 0;
  /// Number of parameters of layer l (dynamics_only: dyn.* and dyn.rho only).
  virtual Index attention_parameter_count(Index l, bool dynamics_only) const = 0;
  /// Sets layer l's gradient buffer to zero.
  virtual void zero_attention_gradients(Index l) = 0;
  /// Layer l's Attention::dynamics_diagnostics on its input x [B*T, D].
  virtual LayerDynamics attention_dynamics(Index l, const ConstMatrixRef<S>& x, Index batch) const = 0;

 private:
  AnyGpt& mutable_self() const {
    // Only for the const paths that build graphs without gradients (parameters bound as constants)
    // or list views to read them: they modify nothing (concurrent calls on one model, one tape each, are safe).
    return const_cast<AnyGpt&>(*this);
  }

  std::vector<TensorView<S>> views(bool grads) {
    std::vector<TensorView<S>> out;
    visit_gpt_tensors(
        config_, grads ? &grads_ : &params_,
        [&](Index l, GptTensor, const char* name, const GptShape&, GptInit, auto* t) {
          out.push_back(TensorView<S>{gpt_tensor_name(l, name), shape_of(*t), t->data()});
        },
        [&](Index l) { attention_views(l, gpt_tensor_name(l, "attn."), grads ? nullptr : &out, grads ? &out : nullptr); });
    return out;
  }

  GptConfig config_;
  GptTensors<S> params_, grads_;
  std::vector<std::uint64_t> layer_seeds_;
};

/// The compiled model: AnyGpt<S> with L layers of Attention<S, Integrator, Scoring>.
template <class S, class Integrator, class Scoring>
class Gpt final : public AnyGpt<S> {
 public:
  using scalar = S;
  using Layer = Attention<S, Integrator, Scoring>;
  using LayerParameters = typename Layer::Parameters;

  /// config.steps is set from the integrator and config.attention from the policies' name in the
  /// built-in variant table (e.g. "diff-euler"); for policies outside it, `name` (a consumer's
  /// table name: make_gpt passes it), else "<integrator>+<scoring>".
  explicit Gpt(const GptConfig& config, std::uint64_t seed = 0, const std::string& name = {})
      : AnyGpt<S>(named(config, name), seed) {
    const GptConfig& c = this->config();
    layers_.reserve(static_cast<std::size_t>(c.layers));
    layer_grads_.reserve(static_cast<std::size_t>(c.layers));
    for (Index l = 0; l < c.layers; ++l) {
      Layer& layer = layers_.emplace_back(c.attention_config(static_cast<int>(l)), this->layer_seeds()[static_cast<std::size_t>(l)]);
      layer.params.wo *= S(this->residual_scale());
      layer_grads_.push_back(layer.zero_gradients());
    }
  }

  /// Block l's attention layer and its gradient buffer (per-layer inspection; incremental decoding:
  /// the dynamics act token by token, so cached evolved keys K' and values V stay valid).
  Layer& layer(Index l) { return layers_.at(static_cast<std::size_t>(l)); }
  const Layer& layer(Index l) const { return layers_.at(static_cast<std::size_t>(l)); }
  LayerParameters& layer_gradients(Index l) { return layer_grads_.at(static_cast<std::size_t>(l)); }

  /// GptDecoder<Gpt> over this model (defined in model/decoder.hpp).
  std::unique_ptr<Decoder<S>> make_decoder() override;

 protected:
  Var attention_node(Tape<S>& t, Index l, Var x, Index batch, bool with_gradients) override {
    const auto i = static_cast<std::size_t>(l);
    return ops::attention(t, layers_[i], x, batch, with_gradients ? &layer_grads_[i] : nullptr);
  }
  void attention_views(Index l, const std::string& prefix, std::vector<TensorView<S>>* params,
                       std::vector<TensorView<S>>* grads) override {
    const auto i = static_cast<std::size_t>(l);
    if (params) append_views<S>(layers_[i].params, prefix, *params);
    if (grads) append_views<S>(layer_grads_[i], prefix, *grads);
  }
  void zero_attention_gradients(Index l) override { set_zero(layer_grads_[static_cast<std::size_t>(l)]); }
  LayerDynamics attention_dynamics(Index l, const ConstMatrixRef<S>& x, Index batch) const override {
    return layers_[static_cast<std::size_t>(l)].dynamics_diagnostics(x, batch);
  }
  Index attention_parameter_count(Index l, bool dynamics_only) const override {
    const Layer& layer = layers_[static_cast<std::size_t>(l)];
    return dynamics_only ? layer.dynamics_parameter_count() : layer.parameter_count();
  }

 private:
  /// The name the model was made under (make_gpt passes the one it dispatched on; nothing parses
  /// it back); a model built directly takes its policies' name in the built-in table.
  static GptConfig named(GptConfig c, const std::string& name) {
    c.attention = name.empty() ? variant_name<Integrator, Scoring>() : name;
    if constexpr (Integrator::has_dynamics) c.steps = Integrator::steps;
    return c;
  }

  std::vector<Layer> layers_;
  std::vector<LayerParameters> layer_grads_;  // the layers' share of the gradient buffer
};

/// The GPT whose attention layers are the variant config.attention with config.steps steps, from
/// `table` (default: the built-in variants). Throws coupledqk::invalid_argument for an unknown
/// name or step count (listing what is accepted) and for unusable sizes.
template <class S, class... E>
std::unique_ptr<AnyGpt<S>> make_gpt(const GptConfig& config, std::uint64_t seed, const VariantTable<E...>& table) {
  validate(config);
  return table.dispatch(config.attention, config.steps, [&](auto integrator, auto scoring) -> std::unique_ptr<AnyGpt<S>> {
    using I = typename decltype(integrator)::type;
    using Sc = typename decltype(scoring)::type;
    return std::make_unique<Gpt<S, I, Sc>>(config, seed, config.attention);
  });
}
/// Entry K of the built-in table at scalar S as a GPT (see BuiltinAttention in registry.hpp: one
/// explicit instantiation compiles one entry's models).
template <class S, std::size_t K, class = void>
struct BuiltinGpt {};
template <class S, std::size_t K>
struct BuiltinGpt<S, K, std::enable_if_t<(K < std::decay_t<decltype(builtin_variants)>::size)>> {
  static std::unique_ptr<AnyGpt<S>> make(const GptConfig& config, std::uint64_t seed);
};
template <class S, std::size_t K>
std::unique_ptr<AnyGpt<S>> BuiltinGpt<S, K, std::enable_if_t<(K < std::decay_t<decltype(builtin_variants)>::size)>>::make(
    const GptConfig& config, std::uint64_t seed) {
  return make_gpt<S>(config, seed, builtin_variants.only<K>());
}

/// The GPT of a built-in variant (config.attention, config.steps).
template <class S>
std::unique_ptr<AnyGpt<S>> make_gpt(const GptConfig& config, std::uint64_t seed = 0) {
  validate(config);
  return detail::with_builtin_index(builtin_variants.index_of(config.attention, config.steps), [&](auto k) {
    return BuiltinGpt<S, decltype(k)::value>::make(config, seed);
  });
}

/// Calls f(Gpt<S, I, Sc>&) with the compiled model behind `model` (for code written once for every
/// variant) and returns its result (f must return the same non-void type for every variant). The
/// model's policies are found by type among those `table` compiles (make_gpt's), never by its name;
/// a model of policies outside the table is an error.
template <class S, class F, class... E>
auto visit_gpt(AnyGpt<S>& model, F&& f, const VariantTable<E...>& table) {
  using First = std::tuple_element_t<0, typename VariantTable<E...>::entries>;
  using R = decltype(f(std::declval<Gpt<S, typename First::family::template at<1>, typename First::scoring>&>()));
  std::optional<R> out;
  table.for_each_policy([&](auto integrator, auto scoring) {
    using G = Gpt<S, typename decltype(integrator)::type, typename decltype(scoring)::type>;
    if (!out)
      if (auto* g = dynamic_cast<G*>(&model)) out.emplace(f(*g));
  });
  require(out.has_value(), "visit_gpt: the model ('", model.config().attention, "', ", model.config().steps,
          " steps) is not a compiled variant of the table given (", table.names_joined(), ")");
  return std::move(*out);
}
template <class S, class F>
auto visit_gpt(AnyGpt<S>& model, F&& f) {
  return visit_gpt(model, std::forward<F>(f), builtin_variants);
}

}  // namespace coupledqk

// The decoder of a compiled model is part of the model (Gpt::make_decoder): its definition follows.
#include "decoder.hpp"
