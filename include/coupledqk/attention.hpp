// Multi-head self-attention with coupled query-key dynamics (method spec section 1):
//
//     Q, K, V  = X Wq, X Wk, X Wv           X: [B*T, D]; weights stored [in, out]
//     (Q', K') = Phi(Q, K)                  every (token, head) pair, integration time softplus(rho_h)
//     O        = Scoring(Q', K', V)         Softmax or Differential, under the layer's mask
//     Y        = O Wo
//
// The mask (AttentionConfig::causal, ::window; causal by default) and the rows' layout (equal,
// right-padded or packed sequences: forward(x, Sequences, ...)) are run-time settings, see
// scoring/mask.hpp; the dynamics are position-wise and never see them.
//
// Attention<Scalar, Integrator, Scoring>: the integrator and the scoring are compile-time policies
// (integrators/policy.hpp, scoring/policy.hpp). Forward and backward are side by side below.
#pragma once

#include <cmath>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.hpp"
#include "core/gemm.hpp"
#include "core/parallel.hpp"
#include "core/parameters.hpp"
#include "core/random.hpp"
#include "core/types.hpp"
#include "integrators/policy.hpp"
#include "io/quote.hpp"
#include "positions/rope.hpp"
#include "scoring/policy.hpp"

namespace coupledqk {

/// Where positions enter a layer: nowhere (the default, and what a model with learned absolute
/// positions uses: they are added to x before the layer), or rotary embeddings of q and k.
enum class Positions { none, rope };
/// With rotary positions, where the rotation sits relative to the dynamics: after them (the
/// dynamics see position-free q, k; the default) or before them.
enum class RopeOrder { dynamics_then_rotate, rotate_then_dynamics };

inline const char* to_string(Positions p) { return p == Positions::rope ? "rope" : "none"; }
inline const char* to_string(RopeOrder o) {
  return o == RopeOrder::rotate_then_dynamics ? "rotate-then-dynamics" : "dynamics-then-rotate";
}
/// "dynamics-then-rotate" or "rotate-then-dynamics" (to_string's names); anything else throws
/// invalid_argument naming `what` and the value.
inline RopeOrder parse_rope_order(const std::string& name, const char* what = "rope_order") {
  if (name == "dynamics-then-rotate") return RopeOrder::dynamics_then_rotate;
  if (name == "rotate-then-dynamics") return RopeOrder::rotate_then_dynamics;
  throw invalid_argument(std::string(what) + " is \"" + io::detail::quote(name) +
                         "\"; expected dynamics-then-rotate or rotate-then-dynamics");
}

/// Sizes and initialisation of one attention layer. Defaults follow the method spec.
struct AttentionConfig {
  Index dim = 0;                 ///< D, model width
  Index heads = 0;               ///< H, query/key pairs per token (H/2 heads for Differential)
  Index hidden = 0;              ///< m, dynamics hidden width; 0 means m = d = D/H
  int layer_index = 0;           ///< 0-based, used by Differential's lambda_init
  double init_std = 0.02;        ///< std of Wq, Wk, Wv, Wo at init (GPT-2)
  double dynamics_init_scale = 0.0;  ///< std of a, c (P*2 for Uncoupled); 0 = exactly standard at init
  double init_time = 1.0;        ///< integration time tau at init: rho = softplus^-1(init_time)
  DynamicsMemory memory = DynamicsMemory::store;  ///< what the dynamics' backward keeps
  /// Scoring kernels: false = tiled causal softmax that never forms T x T (scoring/flash_softmax.hpp);
  /// true = the plain reference path that stores every probability (scoring/masked_softmax.hpp).
  bool reference_kernels = false;
  /// Rotary positions of q and k (positions/rope.hpp): none (default) or rope, with its base and
  /// its order relative to the dynamics.
  Positions positions = Positions::none;
  double rope_base = default_rope_base;
  RopeOrder rope_order = RopeOrder::dynamics_then_rotate;
  /// The mask (scoring/mask.hpp): causal (default) or bidirectional, and a sliding window of
  /// `window` keys (0: none; causal t - w < t' <= t, bidirectional |t - t'| < w).
  bool causal = true;
  Index window = 0;

  Index head_dim() const { return heads > 0 ? dim / heads : 0; }
  Mask mask() const { return Mask{causal, window}; }
  Index hidden_width() const { return hidden > 0 ? hidden : head_dim(); }
};

/// How far a layer's dynamics move its queries and keys on some input (Attention::dynamics_diagnostics):
/// whether the learned map left the identity. Empty tau and zero displacements for Identity.
struct LayerDynamics {
  std::vector<double> tau;    ///< integration time per head, softplus(rho_h)
  double q_displacement = 0;  ///< mean over (token, head) pairs of |q' - q| / |q|
  double k_displacement = 0;  ///< the same for the keys
  Index pairs = 0;            ///< pairs averaged over (pairs with q = 0 or k = 0 are skipped for that mean)
};

/// Throws a descriptive coupledqk::invalid_argument unless the config is usable.
inline void validate(const AttentionConfig& c) {
  require(c.dim > 0, "attention: dim (D) must be positive; got ", c.dim);
  require(c.heads > 0, "attention: heads (H) must be positive; got ", c.heads);
  require(c.dim % c.heads == 0, "attention: dim (D) must be divisible by heads (H); got D = ", c.dim,
          ", H = ", c.heads, " (D/H = ", static_cast<double>(c.dim) / c.heads, ")");
  require(c.hidden >= 0, "attention: hidden (m) must be >= 0 (0 means m = D/H); got ", c.hidden);
  require(c.layer_index >= 0, "attention: layer_index must be >= 0; got ", c.layer_index);
  require(std::isfinite(c.init_std) && c.init_std >= 0, "attention: init_std must be finite and >= 0; got ",
          c.init_std);
  require(std::isfinite(c.dynamics_init_scale) && c.dynamics_init_scale >= 0,
          "attention: dynamics_init_scale must be finite and >= 0; got ", c.dynamics_init_scale);
  require(std::isfinite(c.init_time) && c.init_time > 0,
          "attention: init_time (tau at init) must be finite and > 0; got ", c.init_time);
  require(c.window >= 0, "attention: window must be >= 0 (0 means no window); got ", c.window);
  if (c.positions == Positions::rope) {
    require(c.head_dim() % 2 == 0, "attention: positions = rope needs an even head width D/H; got D/H = ",
            c.head_dim(), " (D = ", c.dim, ", H = ", c.heads, ")");
    require(std::isfinite(c.rope_base) && c.rope_base > 1, "attention: rope_base must be finite and > 1; got ",
            c.rope_base);
  }
}

/// softplus(x) = log(1 + e^x), stable; its inverse; and its derivative sigmoid(x).
template <class S>
S softplus(S x) {
  return x > S(0) ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
}
inline double softplus_inverse(double y) { return y > 20 ? y : std::log(std::expm1(y)); }
template <class S>
S sigmoid(S x) {
  return S(1) / (S(1) + std::exp(-x));
}

template <class S, class Integrator, class Scoring>
class Attention {
  static_assert(std::is_floating_point_v<S>, "Attention: Scalar must be float or double");
  static_assert(CheckIntegrator<Integrator>::value, "Attention: the integrator policy is incomplete");
  static_assert(CheckScoring<Scoring>::value, "Attention: the scoring policy is incomplete");

 public:
  using scalar = S;
  using integrator = Integrator;
  using scoring = Scoring;
  using DynamicsParameters = typename Integrator::template parameters<S>;
  using ScoringParameters = typename Scoring::template parameters<S>;

  /// Every learned tensor of the layer. Names as in files: wq, wk, wv, wo, dyn.*, and the scoring's.
  struct Parameters : NamedTensors<Parameters> {
    Matrix<S> wq, wk, wv, wo;  // [D, D], stored [in, out]
    Vector<S> rho;             // [H] integration time tau_h = softplus(rho_h); empty for Identity
    DynamicsParameters dyn;
    ScoringParameters score;

    template <class Self, class F>
    static void fields(Self& s, F& f) {
      f("wq", s.wq);
      f("wk", s.wk);
      f("wv", s.wv);
      f("wo", s.wo);
      if constexpr (Integrator::has_dynamics) {
        s.dyn.visit([&](const char* name, auto& t) { f((std::string("dyn.") + name).c_str(), t); });
        f("dyn.rho", s.rho);
      }
      s.score.visit(f);
    }
  };

  /// What forward keeps for backward (see backward for what each is used for), and the backward's
  /// workspace. Every buffer keeps its size from one call to the next: a context reused step after
  /// step (as the tape's attention node and AnyAttention do) makes forward and backward allocate
  /// nothing after the first step.
  struct Context {
    Index batch = 0, seq = 0;
    Sequences sequences;          // the rows' layout (B sequences of T rows unless padded or packed)
    std::vector<Index> positions;  // rope over packed sequences: each row's position in its sequence
    Matrix<S> x;        // [B*T, D] input                       -> grads of Wq, Wk, Wv
    Matrix<S> q, k, v;  // [B*T, D] evolved Q', K' and V          -> scoring backward, recompute mode
    Matrix<S> o;        // [B*T, D] scoring output                -> grad of Wo
    Vector<S> tau;      // [B*T*H] integration time of each pair
    std::vector<Vector<S>> chunk_tau;     // tau of each chunk of pairs (dynamics_chunk pairs)
    std::vector<trace_of<Integrator, S>> dynamics;  // per chunk of pairs: per-sub-step states (empty in recompute
                                          // mode) and the integrator's scratch
    typename Scoring::template saved<S> scoring;
    // backward's workspace (mutable: not part of what the forward kept)
    mutable Matrix<S> d_o, dq, dk, dv;          // [B*T, D]
    mutable Vector<S> dtau;                     // [B*T*H]
    mutable Matrix<S> q_free, k_free;           // rope after the dynamics: Q', K' before the rotation
    mutable std::vector<Vector<S>> chunk_dtau;  // per chunk
    mutable std::vector<DynamicsParameters> partial;  // per chunk: its parameter gradient
  };

  explicit Attention(const AttentionConfig& config, std::uint64_t seed = 0) : config_(config) {
    check_config(config_);
    Rng rng(seed);
    const Index D = config_.dim;
    for (Matrix<S>* w : {&params.wq, &params.wk, &params.wv, &params.wo}) {
      w->resize(D, D);
      rng.fill_normal(*w, config_.init_std);
    }
    if constexpr (Integrator::has_dynamics) {
      params.dyn = Integrator::template make_parameters<S>(dynamics_shape(config_), rng);
      params.rho = Vector<S>::Constant(config_.heads, S(softplus_inverse(config_.init_time)));
    }
    params.score = Scoring::template make_parameters<S>(scoring_shape(config_, 1, 1), rng);
  }

  /// Throws a descriptive coupledqk::invalid_argument unless this layer can take `config` (its
  /// sizes, the scoring's shape rules, recompute only for reversible integrators).
  static void check_config(const AttentionConfig& config) {
    validate(config);
    Scoring::validate(scoring_shape(config, 1, 1));
    require(config.memory == DynamicsMemory::store || Integrator::is_reversible,
            "attention: DynamicsMemory::recompute needs a reversible integrator; '", Integrator::name,
            "' is not (reversible: leapfrog and other splitting methods, affine)");
    require(config.mask().is_default() || supports_masks_v<Scoring>, "attention: the mask '",
            to_string(config.mask()), "' needs a scoring that reads masks; '", Scoring::name,
            "' does not (it declares no supports_masks = true); it takes only the default causal mask");
  }

  /// How many scalars each part of the parameters holds, in visit order: wq wk wv wo, dyn.*,
  /// dyn.rho, the scoring's.
  struct ParameterLayout {
    Index projections = 0, dynamics = 0, rho = 0, scoring = 0;
    Index total() const { return projections + dynamics + rho + scoring; }
  };

  /// The layout and the tensors' names and shapes for `config`, from the shapes alone: no layer is
  /// built and no projection weight is drawn (the device code lays out its flat buffers with it).
  static ParameterLayout parameter_layout(const AttentionConfig& config) {
    const Parameters p = shaped_parameters(config);
    ParameterLayout l;
    l.projections = 4 * config.dim * config.dim;
    if constexpr (Integrator::has_dynamics) {
      l.dynamics = count_parameters(p.dyn);
      l.rho = p.rho.size();
    }
    l.scoring = count_parameters(p.score);
    return l;
  }
  static std::vector<TensorSpec> parameter_specs(const AttentionConfig& config) {
    const Parameters p = shaped_parameters(config);
    std::vector<TensorSpec> out;
    p.visit([&](const char* name, const auto& t) { out.push_back(TensorSpec{name, shape_of(t)}); });
    return out;
  }

  const AttentionConfig& config() const { return config_; }

  /// Number of scalars in all parameters, and in the dynamics alone (dyn.*, including rho).
  Index parameter_count() const { return count_parameters(params); }
  Index dynamics_parameter_count() const {
    return Integrator::has_dynamics ? count_parameters(params.dyn) + params.rho.size() : 0;
  }

  /// A zero gradient buffer shaped like the parameters.
  Parameters zero_gradients() const { return zeros_like(params); }

  /// y = layer(x). x: [B*T, D] with rows ordered (b, t); batch = B. When ctx is given it receives
  /// what backward needs.
  Matrix<S> forward(const ConstMatrixRef<S>& x, Index batch, Context* ctx = nullptr) const {
    Matrix<S> y;
    forward_into(x, batch, ctx, y);
    return y;
  }
  /// y = layer(x) over sequences of their own lengths: x [seqs.rows(), D], right-padded
  /// (Sequences::padded: padding rows of y are zero and get zero gradient) or packed end to end
  /// (Sequences::packed, offsets as flash-attention's cu_seqlens).
  Matrix<S> forward(const ConstMatrixRef<S>& x, const Sequences& seqs, Context* ctx = nullptr) const {
    Matrix<S> y;
    forward_into(x, seqs, ctx, y);
    return y;
  }

  /// The dynamics' displacement of the queries and keys of input x [B*T, D] (rows ordered (b, t),
  /// batch = B) and the integration times: see LayerDynamics. Runs the forward once.
  LayerDynamics dynamics_diagnostics(const ConstMatrixRef<S>& x, Index batch) const {
    LayerDynamics out;
    if constexpr (Integrator::has_dynamics) {
      for (Index h = 0; h < params.rho.size(); ++h) out.tau.push_back(static_cast<double>(softplus(params.rho(h))));
      Context c;
      Matrix<S> y;
      forward_into(x, batch, &c, y);  // c.q, c.k: the evolved Q', K' (rotated, with rope)
      const Index N = x.rows(), D = config_.dim, d = config_.head_dim(), P = N * config_.heads;
      Matrix<S> q0(N, D), k0(N, D);
      gemm<S>(x, false, params.wq, false, q0);
      gemm<S>(x, false, params.wk, false, k0);
      if (config_.positions == Positions::rope) {  // what the dynamics saw going in and coming out
        const Rope<S> rope = rope_for(c.seq);
        if (config_.rope_order == RopeOrder::rotate_then_dynamics) {
          rope.rotate(q0, c.seq);
          rope.rotate(k0, c.seq);
        } else {
          rope.rotate(c.q, c.seq, true);
          rope.rotate(c.k, c.seq, true);
        }
      }
      auto mean_relative = [&](const Matrix<S>& before, const Matrix<S>& after) {
        const ConstMatrixMap<S> b(before.data(), P, d), a(after.data(), P, d);
        double sum = 0;
        Index n = 0;
        for (Index r = 0; r < P; ++r) {
          const double norm = static_cast<double>(b.row(r).norm());
          if (norm > 0) {
            sum += static_cast<double>((a.row(r) - b.row(r)).norm()) / norm;
            ++n;
          }
        }
        return n ? sum / static_cast<double>(n) : 0.0;
      };
      out.q_displacement = mean_relative(q0, c.q);
      out.k_displacement = mean_relative(k0, c.k);
      out.pairs = P;
    } else {
      require(x.cols() == config_.dim, "attention dynamics_diagnostics: x has ", x.cols(), " columns; expected D = ",
              config_.dim);
      (void)batch;
    }
    return out;
  }

  /// forward() writing y [B*T, D] into a given matrix (resized if needed; no allocation when it
  /// already has that size and ctx is a context used before with the same shapes).
  void forward_into(const ConstMatrixRef<S>& x, Index batch, Context* ctx, Matrix<S>& y) const {
    require(batch > 0, "attention forward: batch (B) must be positive; got ", batch);
    require(x.rows() > 0, "attention forward: x has no rows; expected [B*T, D] with B*T > 0");
    require(x.cols() == config_.dim, "attention forward: x has ", x.cols(), " columns; expected D = ", config_.dim,
            " (x is [B*T, D])");
    require(x.rows() % batch == 0, "attention forward: x has ", x.rows(),
            " rows, which is not a multiple of batch B = ", batch, " (x is [B*T, D])");
    forward_into(x, Sequences::equal(batch, x.rows() / batch), ctx, y);
  }
  void forward_into(const ConstMatrixRef<S>& x, const Sequences& seqs, Context* ctx, Matrix<S>& y) const {
    const Index D = config_.dim, H = config_.heads, d = config_.head_dim();
    require(seqs.batch() > 0, "attention forward: the sequences are empty (make them with Sequences::equal, ",
            "padded or packed)");
    require(x.cols() == D, "attention forward: x has ", x.cols(), " columns; expected D = ", D,
            " (x is [rows, D])");
    require(x.rows() == seqs.rows(), "attention forward: x has ", x.rows(), " rows; the ", to_string(seqs.layout()),
            " sequences hold ", seqs.rows(), " (", seqs.batch(), " sequences",
            seqs.strided() ? " of " + std::to_string(seqs.seq()) + " rows" : std::string(), ")");
    require_finite(x, "attention forward: input x");
    const Index T = seqs.seq();
    Context local;
    Context& c = ctx ? *ctx : local;
    c.batch = seqs.batch();
    c.seq = T;
    c.sequences = seqs;
    if (ctx) c.x = x;
    const Index N = x.rows();
    c.q.resize(N, D);
    c.k.resize(N, D);
    c.v.resize(N, D);
    gemm<S>(x, false, params.wq, false, c.q);  // core/gemm.hpp: no allocation, same bits on any thread count
    gemm<S>(x, false, params.wk, false, c.k);
    gemm<S>(x, false, params.wv, false, c.v);
    const bool rope = config_.positions == Positions::rope;
    const bool rotate_first = rope && config_.rope_order == RopeOrder::rotate_then_dynamics;
    const std::optional<Rope<S>> rotation = rope ? std::optional<Rope<S>>(rope_for(T)) : std::nullopt;
    if (rope && !seqs.strided()) seqs.positions_into(c.positions);
    if (rotate_first) rotate_qk(*rotation, c, c.q, c.k, false);
    if constexpr (Integrator::has_dynamics) {
      // The pairs are cut into fixed chunks, each integrated over all its sub-steps while it is in
      // cache, in parallel. The chunk size does not depend on the thread count, so neither do the
      // results.
      pair_times_into(N, c.tau);
      const Index P = N * H, chunks = (P + dynamics_chunk - 1) / dynamics_chunk;
      const DynamicsMemory memory = ctx ? config_.memory : DynamicsMemory::store;
      if (ctx) c.dynamics.resize(static_cast<std::size_t>(chunks));  // kept: states and scratch are reused
      c.chunk_tau.resize(static_cast<std::size_t>(chunks));
      MatrixMap<S> qp(c.q.data(), P, d), kp(c.k.data(), P, d);
      parallel_for(chunks, [&](Index ch) {
        const Index r0 = ch * dynamics_chunk, n = std::min(dynamics_chunk, P - r0);
        const auto i = static_cast<std::size_t>(ch);
        c.chunk_tau[i] = c.tau.segment(r0, n);
        Integrator::template forward<S>(params.dyn, c.chunk_tau[i], qp.middleRows(r0, n), kp.middleRows(r0, n),
                                        ctx ? &c.dynamics[i] : nullptr, memory);
      });
    }
    if (rope && !rotate_first) rotate_qk(*rotation, c, c.q, c.k, false);  // c.q, c.k: what the scoring reads
    Scoring::template forward<S>(params.score, scoring_shape(c.sequences), c.q, c.k, c.v, c.o,
                                 ctx ? &c.scoring : nullptr);
    y.resize(N, D);
    gemm<S>(c.o, false, params.wo, false, y);
  }

  /// Given dy = dLoss/dy [B*T, D] and the forward's context, accumulates (+=) the parameter
  /// gradients into `grad` and returns dLoss/dx (=).
  Matrix<S> backward(const Context& c, const ConstMatrixRef<S>& dy, Parameters& grad) const {
    Matrix<S> dx;
    backward_into(c, dy, grad, dx);
    return dx;
  }

  /// backward() writing dx [B*T, D] (=) into a given matrix. Its intermediates live in the
  /// context's workspace, so a context reused step after step allocates nothing.
  void backward_into(const Context& c, const ConstMatrixRef<S>& dy, Parameters& grad, Matrix<S>& dx) const {
    const Index D = config_.dim, H = config_.heads, d = config_.head_dim();
    require(c.batch > 0 && c.x.rows() == c.sequences.rows(),
            "attention backward: the context holds no forward pass (call forward with a context first)");
    require(dy.rows() == c.x.rows() && dy.cols() == D, "attention backward: dy is [", dy.rows(), ", ",
            dy.cols(), "]; expected [", c.x.rows(), ", ", D, "], the shape of the forward's output");
    require_finite(dy, "attention backward: upstream gradient dy");
    require(grad.wq.rows() == D && grad.wq.cols() == D,
            "attention backward: the gradient buffer is not shaped like the parameters (use zero_gradients())");
    // Y = O Wo
    gemm<S>(c.o, true, dy, false, grad.wo, S(1), true);  // grad.wo += o^T dy
    Matrix<S>& d_o = c.d_o;
    d_o.resize(dy.rows(), D);
    gemm<S>(dy, false, params.wo, true, d_o);  // d_o = dy wo^T
    // scoring: dq, dk are the cotangents of the evolved Q', K'
    Matrix<S>&dq = c.dq, &dk = c.dk, &dv = c.dv;
    Scoring::template backward<S>(params.score, scoring_shape(c.sequences), c.q, c.k, c.v, c.o,
                                  c.scoring, d_o, dq, dk, dv, grad.score);
    const bool rope = config_.positions == Positions::rope;
    const bool rotate_first = rope && config_.rope_order == RopeOrder::rotate_then_dynamics;
    // The dynamics' end states: Q', K' as the scoring read them, or before the rotation after them.
    const Matrix<S>* q_end = &c.q;
    const Matrix<S>* k_end = &c.k;
    const std::optional<Rope<S>> rotation = rope ? std::optional<Rope<S>>(rope_for(c.seq)) : std::nullopt;
    if (rope && !rotate_first) {
      rotate_qk(*rotation, c, dq, dk, true);  // the rotation's backward: R^T
      if constexpr (Integrator::has_dynamics) {
        c.q_free = c.q;
        c.k_free = c.k;
        rotate_qk(*rotation, c, c.q_free, c.k_free, true);
        q_end = &c.q_free;
        k_end = &c.k_free;
      }
    }
    if constexpr (Integrator::has_dynamics) {
      // Chunk by chunk as in forward; each chunk's parameter gradient goes to its own buffer and
      // the buffers are added in chunk order (deterministic for any thread count).
      const Index P = c.x.rows() * H, chunks = (P + dynamics_chunk - 1) / dynamics_chunk;
      require(static_cast<Index>(c.dynamics.size()) == chunks && static_cast<Index>(c.chunk_tau.size()) == chunks,
              "attention backward: the context holds ", c.dynamics.size(), " dynamics traces, expected ", chunks);
      if (static_cast<Index>(c.partial.size()) != chunks)
        c.partial.assign(static_cast<std::size_t>(chunks), zeros_like(params.dyn));
      c.chunk_dtau.resize(static_cast<std::size_t>(chunks));
      c.dtau.resize(P);
      MatrixMap<S> dqp(dq.data(), P, d), dkp(dk.data(), P, d);
      const ConstMatrixMap<S> qp(q_end->data(), P, d), kp(k_end->data(), P, d);
      parallel_for(chunks, [&](Index ch) {
        const Index r0 = ch * dynamics_chunk, n = std::min(dynamics_chunk, P - r0);
        const auto i = static_cast<std::size_t>(ch);
        set_zero(c.partial[i]);
        Vector<S>& dtau_chunk = c.chunk_dtau[i];
        dtau_chunk.setZero(n);
        Integrator::template backward<S>(params.dyn, c.chunk_tau[i], c.dynamics[i], qp.middleRows(r0, n),
                                         kp.middleRows(r0, n), dqp.middleRows(r0, n), dkp.middleRows(r0, n),
                                         c.partial[i], dtau_chunk, config_.memory);
        c.dtau.segment(r0, n) = dtau_chunk;
      });
      for (const auto& g : c.partial) add_into(grad.dyn, g);
      // tau_h = softplus(rho_h): d tau / d rho = sigmoid(rho)
      for (Index r = 0; r < P; ++r) grad.rho[r % H] += c.dtau[r] * sigmoid(params.rho[r % H]);
    }
    if (rotate_first) rotate_qk(*rotation, c, dq, dk, true);
    gemm<S>(c.x, true, dq, false, grad.wq, S(1), true);  // grad.w* += x^T d*
    gemm<S>(c.x, true, dk, false, grad.wk, S(1), true);
    gemm<S>(c.x, true, dv, false, grad.wv, S(1), true);
    dx.resize(dq.rows(), D);
    gemm<S>(dq, false, params.wq, true, dx);  // dx = dq wq^T + dk wk^T + dv wv^T
    gemm<S>(dk, false, params.wk, true, dx, S(1), true);
    gemm<S>(dv, false, params.wv, true, dx, S(1), true);
  }

  /// Keys and values of the tokens decoded so far, one [capacity, D] block per sequence. The keys
  /// are the evolved K' (what the scoring reads), so the dynamics run once per token.
  struct KVCache {
    Index batch = 0, capacity = 0, length = 0;
    Matrix<S> keys, values;  // [batch * capacity, D], sequence b at rows [b*capacity, (b+1)*capacity)
  };

  KVCache make_cache(Index batch, Index capacity) const {
    require(batch > 0 && capacity > 0, "attention make_cache: batch and capacity must be positive; got batch = ",
            batch, ", capacity = ", capacity);
    KVCache c;
    c.batch = batch;
    c.capacity = capacity;
    c.keys.setZero(batch * capacity, config_.dim);
    c.values.setZero(batch * capacity, config_.dim);
    return c;
  }

  /// Incremental decoding: x holds the newest token of each sequence [B, D]; returns its output
  /// [B, D] and appends its evolved key and its value to the cache. Matches forward() on the
  /// whole prefix, row for row, to round-off. Causal masks only (with a window, the newest token
  /// reads the last `window` keys of the cache); a bidirectional layer has no incremental form.
  Matrix<S> decode(const ConstMatrixRef<S>& x, KVCache& cache) const {
    const Index D = config_.dim, H = config_.heads, d = config_.head_dim(), B = cache.batch;
    require(config_.causal, "attention decode: the layer is bidirectional (mask '", to_string(config_.mask()),
            "'): a token attends to later tokens, so it cannot be decoded one token at a time; run forward() ",
            "on the whole sequence");
    require(x.rows() == B && x.cols() == D, "attention decode: x is [", x.rows(), ", ", x.cols(),
            "]; expected [", B, ", ", D, "] (one token per cached sequence)");
    require(cache.length < cache.capacity, "attention decode: the cache is full (capacity ", cache.capacity,
            " tokens); make a larger cache");
    require_finite(x, "attention decode: input x");
    Matrix<S> q = x * params.wq, k = x * params.wk;
    const Matrix<S> v = x * params.wv;
    const Index t = cache.length;
    const bool rope = config_.positions == Positions::rope;
    const bool rotate_first = rope && config_.rope_order == RopeOrder::rotate_then_dynamics;
    const std::vector<Index> at(static_cast<std::size_t>(B), t);  // every sequence's newest token is at t
    auto rotate_new = [&] {
      const Rope<S> r(d, 1, config_.rope_base, t);  // the table of position t alone
      r.rotate_at(q, at);
      r.rotate_at(k, at);
    };
    if (rotate_first) rotate_new();
    if constexpr (Integrator::has_dynamics) {
      const Vector<S> tau = pair_times(B);
      MatrixMap<S> qp(q.data(), B * H, d), kp(k.data(), B * H, d);
      Integrator::template forward<S>(params.dyn, tau, qp, kp, nullptr, DynamicsMemory::store);
    }
    if (rope && !rotate_first) rotate_new();  // the cache keeps keys as the scoring reads them
    ++cache.length;
    // the keys the newest token sees: all so far, or the last `window` of them
    const Index first = config_.mask().begin(t), n = t + 1 - first;
    Matrix<S> o(B, D);
    for (Index b = 0; b < B; ++b) {
      cache.keys.row(b * cache.capacity + t) = k.row(b);
      cache.values.row(b * cache.capacity + t) = v.row(b);
      Scoring::template decode<S>(params.score, scoring_shape(config_, 1, n), q.row(b),
                                  cache.keys.block(b * cache.capacity + first, 0, n, D),
                                  cache.values.block(b * cache.capacity + first, 0, n, D), o.row(b));
    }
    return o * params.wo;
  }

  /// Integration time of every (token, head) pair, rows ordered (b, t, h): [rows * H].
  Vector<S> pair_times(Index rows) const {
    Vector<S> tau;
    pair_times_into(rows, tau);
    return tau;
  }
  void pair_times_into(Index rows, Vector<S>& tau) const {
    const Index H = config_.heads;
    tau.resize(rows * H);
    for (Index h = 0; h < H; ++h) {
      const S t = softplus(params.rho[h]);
      for (Index r = 0; r < rows; ++r) tau[r * H + h] = t;
    }
  }

  Parameters params;

  /// Pairs per dynamics task (see forward): fixed, so results do not depend on the thread count.
  static constexpr Index dynamics_chunk = 256;

 private:
  /// The rotation of this layer's heads for positions 0..seq-1.
  Rope<S> rope_for(Index seq) const { return Rope<S>(config_.head_dim(), seq, config_.rope_base); }
  /// Rotary positions of q and k [rows, D] at each row's position in its sequence (the context's
  /// layout), or the rotation's backward (inverse).
  static void rotate_qk(const Rope<S>& rope, const Context& c, Matrix<S>& q, Matrix<S>& k, bool inverse) {
    if (c.sequences.strided()) {
      rope.rotate(q, c.seq, inverse);
      rope.rotate(k, c.seq, inverse);
    } else {
      rope.rotate_at(q, c.positions, inverse);
      rope.rotate_at(k, c.positions, inverse);
    }
  }

  /// The scoring's shape for rows laid out as `seqs` (kept alive by the caller: the shape points to it).
  ScoringShape scoring_shape(const Sequences& seqs) const {
    ScoringShape sh = scoring_shape(config_, seqs.batch(), seqs.seq());
    if (seqs.layout() != SequenceLayout::equal) sh.sequences = &seqs;
    return sh;
  }
  static ScoringShape scoring_shape(const AttentionConfig& c, Index batch, Index seq) {
    return ScoringShape{batch, seq, c.heads, c.head_dim(), c.layer_index, c.reference_kernels, c.mask()};
  }

  /// Parameters with every shape of `config`; the projections are left unset (uninitialised),
  /// the small dynamics and scoring tensors drawn from a fixed seed.
  static Parameters shaped_parameters(const AttentionConfig& config) {
    check_config(config);
    Parameters p;
    for (Matrix<S>* w : {&p.wq, &p.wk, &p.wv, &p.wo}) w->resize(config.dim, config.dim);
    Rng rng(0);
    if constexpr (Integrator::has_dynamics) {
      p.dyn = Integrator::template make_parameters<S>(dynamics_shape(config), rng);
      p.rho.resize(config.heads);
    }
    p.score = Scoring::template make_parameters<S>(scoring_shape(config, 1, 1), rng);
    return p;
  }
  static DynamicsShape dynamics_shape(const AttentionConfig& c) {
    return DynamicsShape{c.head_dim(), c.hidden_width(), c.dynamics_init_scale};
  }

  AttentionConfig config_;
};

}  // namespace coupledqk
