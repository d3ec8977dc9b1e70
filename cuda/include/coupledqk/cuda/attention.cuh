// The attention layer on the GPU: the same policies, the same parameters, the same maths as the
// CPU template coupledqk::Attention<float, Integrator, Scoring> (include/coupledqk/attention.hpp):
//
//     Q, K, V  = X Wq, X Wk, X Wv          one strided-batched cuBLAS GEMM
//     (Q', K') = Phi(Q, K)                 dynamics.cuh: one fused kernel, all sub-steps on chip
//     O        = Scoring(Q', K', V)        scoring.cuh: FlashAttention-style kernels under the mask
//     Y        = O Wo                      cuBLAS
//
// The mask (AttentionConfig::causal, ::window) and the rows' layout (forward with a Sequences:
// equal, right-padded or packed) are run-time settings, as on the CPU; padding rows give y = 0 and
// get dx = 0. With AttentionConfig::positions = rope, Q and K are rotated (rope.cuh) before the
// dynamics or after them (rope_order), and the backward applies the inverse rotation to dQ, dK at
// the same place.
//
// A user switches device, not code:
//
//     coupledqk::Attention<float, Leapfrog<1>, Softmax> host(config, seed);     // the CPU layer
//     coupledqk::cuda::Attention<Leapfrog<1>, Softmax, bf16> gpu(config);       // its GPU twin
//     DeviceBuffer<float> p(gpu.parameter_count());
//     upload_parameters(host.params, p.data());                                 // same names, same order
//
// Parameters are one flat float32 array in the visit order of the CPU layer's Parameters (wq, wk,
// wv, wo [D, D] stored [in, out]; dyn.* and dyn.rho for coupled/uncoupled layers; the scoring's
// tensors), so a model keeps all its parameters in one buffer and an optimiser runs over it in one
// pass. With T = bf16 the caller also passes a bf16 shadow of that array (`params_t`) for the GEMMs;
// the masters and every gradient stay float32.
//
// What the forward keeps for the backward (Context): a pointer to x, Q K V before the dynamics
// (the fused dynamics backward recomputes the trajectory from them), Q' K' O, and what the scoring
// saves (log-sum-exps; Differential: its two attention outputs). All buffers grow on the first call
// and are reused.
#pragma once

#include <cstring>
#include <string>
#include <type_traits>

#include <coupledqk/attention.hpp>
#include <coupledqk/core/error.hpp>
#include <coupledqk/core/parameters.hpp>

#include "dynamics.cuh"
#include "rope.cuh"
#include "runtime.cuh"
#include "scoring.cuh"

namespace coupledqk::cuda {

/// Copies every tensor of a CPU parameter set (anything with visit(): a layer's Parameters, a
/// dynamics or scoring parameter struct), in visit order, into the flat float device array `dst`.
template <class Params>
void upload_parameters(const Params& p, float* dst, cudaStream_t stream = nullptr) {
  Index off = 0;
  p.visit([&](const char*, const auto& t) {
    static_assert(std::is_same_v<typename std::decay_t<decltype(t)>::Scalar, float>,
                  "upload_parameters: the CPU parameters must be float (the device masters are float32)");
    if (t.size() > 0)
      COUPLEDQK_CUDA_CHECK(cudaMemcpyAsync(dst + off, t.data(), sizeof(float) * t.size(), cudaMemcpyHostToDevice, stream));
    off += t.size();
  });
  COUPLEDQK_CUDA_CHECK(cudaStreamSynchronize(stream));
}

/// The inverse of upload_parameters: the flat device array into the CPU tensors (shapes kept).
template <class Params>
void download_parameters(const float* src, Params& p, cudaStream_t stream = nullptr) {
  COUPLEDQK_CUDA_CHECK(cudaStreamSynchronize(stream));
  Index off = 0;
  p.visit([&](const char*, auto& t) {
    if (t.size() > 0)
      COUPLEDQK_CUDA_CHECK(cudaMemcpy(t.data(), src + off, sizeof(float) * t.size(), cudaMemcpyDeviceToHost));
    off += t.size();
  });
}

namespace detail {

/// C_i = alpha op(A_i) op(B_i) + beta C_i for i < count, row-major, consecutive operands `stride_*`
/// elements apart (a stride of 0 shares one operand): Q, K, V from one X, and their weight gradients.
template <class TA, class TC>
void gemm_strided_batched(const Blas& blas, bool trans_a, bool trans_b, Index M, Index N, Index K, float alpha,
                          const TA* A, Index lda, Index stride_a, const TA* B, Index ldb, Index stride_b, float beta,
                          TC* C, Index ldc, Index stride_c, int count) {
  if (M == 0 || N == 0 || count == 0) return;
  COUPLEDQK_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      blas.handle(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(N),
      static_cast<int>(M), static_cast<int>(K), &alpha, B, cuda_data_type<TA>(), static_cast<int>(ldb),
      static_cast<long long>(stride_b), A, cuda_data_type<TA>(), static_cast<int>(lda), static_cast<long long>(stride_a),
      &beta, C, cuda_data_type<TC>(), static_cast<int>(ldc), static_cast<long long>(stride_c), count,
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

/// `in` in storage T: a view of `in` itself when T is float, else a converted copy in `buf`.
template <class T>
const T* as_storage(const float* in, Index n, DeviceBuffer<T>& buf, cudaStream_t s) {
  if constexpr (std::is_same_v<T, float>) {
    (void)n, (void)buf, (void)s;
    return in;
  } else {
    buf.reserve(static_cast<std::size_t>(n));
    convert<T, float>(in, buf.data(), n, s);
    return buf.data();
  }
}

}  // namespace detail

template <class Integrator, class Scoring, class T = float>
class Attention {
  static_assert(is_storage<T>::value, "coupledqk::cuda::Attention: storage T must be float or bf16");
  static_assert(CheckIntegrator<Integrator>::value, "coupledqk::cuda::Attention: the integrator policy is incomplete");
  static_assert(has_device_dynamics<Integrator>,
                "coupledqk::cuda::Attention: this integrator has no device implementation (DeviceDynamics<I>, "
                "dynamics.cuh)");
  static_assert(DeviceScoring<Scoring>::supported,
                "coupledqk::cuda::Attention: this scoring has no device implementation (DeviceScoring<Sc>, scoring.cuh)");

 public:
  using Host = coupledqk::Attention<float, Integrator, Scoring>;
  using HostParameters = typename Host::Parameters;
  using storage = T;
  using integrator = Integrator;
  using scoring = Scoring;

  /// Validates the configuration exactly as the CPU layer does (same messages) and lays out the
  /// flat parameter array from the CPU layer's layout (its visit order, from the shapes alone): wq wk
  /// wv consecutive (one batched GEMM), then wo, then the dynamics block followed by rho, then the
  /// scoring's block.
  explicit Attention(const AttentionConfig& config) : config_(config) {
    const typename Host::ParameterLayout layout = Host::parameter_layout(config_);
    const Index D = config_.dim;
    off_wq_ = 0;
    off_wk_ = D * D;
    off_wv_ = 2 * D * D;
    off_wo_ = 3 * D * D;
    off_dyn_ = layout.projections;
    off_rho_ = off_dyn_ + layout.dynamics;
    off_score_ = off_rho_ + layout.rho;
    count_ = layout.total();
    require(layout.scoring == DeviceScoring<Scoring>::parameter_count(config_.head_dim()),
            "cuda::Attention: the scoring '", Scoring::name, "' holds ", layout.scoring,
            " parameters on the CPU; the device scoring expects ", DeviceScoring<Scoring>::parameter_count(config_.head_dim()));
  }

  const AttentionConfig& config() const { return config_; }
  /// Scalars in the flat parameter array (equals the CPU layer's parameter_count()).
  Index parameter_count() const { return count_; }

  /// Device workspaces of one forward/backward, grown on first use and reused.
  struct Context {
    Index batch = 0, seq = 0, rows = 0;  // seq: T, the longest sequence when packed; rows: of x
    DeviceSequences sequences;         // the rows' layout (lengths or offsets on the device)
    DeviceRope rope;                   // positions = rope: the rotation's tables
    const T* x = nullptr;              // the forward's input (owned by the caller)
    DeviceBuffer<T> qkv;               // [3, B*T, D]: Q, K before the dynamics, V
    DeviceBuffer<T> qk;                // [2, B*T, D]: Q', K' (coupled/uncoupled layers only)
    DeviceBuffer<T> o;                 // [B*T, D]: scoring output
    typename DeviceScoring<Scoring>::template Saved<T> saved;
    DeviceBuffer<float> d_o, dqkv;     // [B*T, D], [3, B*T, D]
    DeviceBuffer<T> dy_t, dqkv_t;      // bf16 copies of cotangents for the GEMMs (T = bf16 only)
    bool has_forward = false;
  };

  /// y = layer(x). x: [B*T, D] storage T, rows ordered (b, t); y: [B*T, D] written. When
  /// for_backward, x must stay alive and unchanged until backward().
  void forward(const Blas& blas, const float* params, const T* params_t, const T* x, Index batch, Index seq, T* y,
               Context& ctx, bool for_backward) const {
    require(batch > 0 && seq > 0, "cuda::Attention forward: batch (B) and seq (T) must be positive; got B = ", batch,
            ", T = ", seq);
    forward(blas, params, params_t, x, Sequences::equal(batch, seq), y, ctx, for_backward);
  }

  /// The same over rows laid out as `seqs` (include/coupledqk/scoring/mask.hpp): x, y [seqs.rows(), D];
  /// right-padded sequences' padding rows of y are 0.
  void forward(const Blas& blas, const float* params, const T* params_t, const T* x, const Sequences& seqs, T* y,
               Context& ctx, bool for_backward) const {
    require(seqs.batch() > 0, "cuda::Attention forward: the sequences are empty (make them with Sequences::equal, ",
            "padded or packed)");
    const Index D = config_.dim, N = seqs.rows();
    require(params != nullptr && params_t != nullptr && x != nullptr && y != nullptr,
            "cuda::Attention forward: null device pointer (params, params_t, x or y)");
    const cudaStream_t s = blas.stream();
    ctx.batch = seqs.batch();
    ctx.seq = seqs.seq();
    ctx.rows = N;
    ctx.sequences.set(seqs, s);
    ctx.x = x;
    ctx.has_forward = for_backward;
    const std::size_t ND = static_cast<std::size_t>(N * D);
    ctx.qkv.reserve(3 * ND);
    T* q = ctx.qkv.data();
    T* k = q + ND;
    T* v = k + ND;
    // [Q | K | V] = X [Wq | Wk | Wv]: three products sharing X, one call.
    detail::gemm_strided_batched<T, T>(blas, false, false, N, D, D, 1.0f, x, D, 0, params_t + off_wq_, D, D * D, 0.0f,
                                       q, D, static_cast<Index>(ND), 3);
    const bool rope = config_.positions == Positions::rope;
    const bool rotate_first = rope && config_.rope_order == RopeOrder::rotate_then_dynamics;
    if (rope) ctx.rope.prepare(config_.head_dim(), ctx.seq, config_.rope_base, s);
    if (rotate_first) rotate(ctx, q, k, false, s);  // the dynamics (and their backward) see rotated Q, K
    T* qe = q;
    T* ke = k;
    if constexpr (Integrator::has_dynamics) {
      ctx.qk.reserve(2 * ND);
      T* q2 = ctx.qk.data();
      T* k2 = q2 + ND;
      dynamics_forward<Integrator, T>(dims(N), params + off_dyn_, params + off_rho_, q, k, q2, k2, s);
      qe = q2;
      ke = k2;
    }
    if (rope && !rotate_first) rotate(ctx, qe, ke, false, s);  // what the scoring reads; Q, K stay position-free
    ctx.o.reserve(ND);
    DeviceScoring<Scoring>::template forward<T>(scoring_dims(ctx), params + off_score_, qe, ke, v, ctx.o.data(),
                                                for_backward ? &ctx.saved : nullptr, s);
    gemm<T, T>(blas, false, false, N, D, D, 1.0f, ctx.o.data(), D, params_t + off_wo_, D, 0.0f, y, D);
  }

  /// Given dy = dLoss/dy (float [B*T, D]) and the forward's context: dx (float [B*T, D]) is
  /// written, the parameter gradients are accumulated (+=) into the flat float array dparams.
  void backward(const Blas& blas, const float* params, const T* params_t, Context& ctx, const float* dy, float* dx,
                float* dparams) const {
    require(ctx.has_forward && ctx.x != nullptr,
            "cuda::Attention backward: the context holds no forward pass (call forward with for_backward = true)");
    require(dy != nullptr && dx != nullptr && dparams != nullptr,
            "cuda::Attention backward: null device pointer (dy, dx or dparams)");
    const Index D = config_.dim, N = ctx.rows;
    const std::size_t ND = static_cast<std::size_t>(N * D);
    const cudaStream_t s = blas.stream();
    const T* q = ctx.qkv.data();
    const T* k = q + ND;
    const T* v = k + ND;
    const T* qe = q;
    const T* ke = k;
    if constexpr (Integrator::has_dynamics) {
      qe = ctx.qk.data();
      ke = qe + ND;
    }
    // Y = O Wo:  dWo += O^T dY,  dO = dY Wo^T
    const T* dy_t = detail::as_storage<T>(dy, static_cast<Index>(ND), ctx.dy_t, s);
    gemm<T, float>(blas, true, false, D, D, N, 1.0f, ctx.o.data(), D, dy_t, D, 1.0f, dparams + off_wo_, D);
    ctx.d_o.reserve(ND);
    gemm<T, float>(blas, false, true, N, D, D, 1.0f, dy_t, D, params_t + off_wo_, D, 0.0f, ctx.d_o.data(), D);
    // scoring: cotangents of Q', K', V (written)
    ctx.dqkv.reserve(3 * ND);
    float* dq = ctx.dqkv.data();
    float* dk = dq + ND;
    float* dv = dk + ND;
    DeviceScoring<Scoring>::template backward<T>(scoring_dims(ctx), params + off_score_, qe, ke, v, ctx.o.data(),
                                                 ctx.saved, ctx.d_o.data(), dq, dk, dv, dparams + off_score_, s);
    // the rotations' backward, R^T, where the forward rotated; the dynamics recompute their
    // trajectory from Q, K as they saw them (rotated when rotate_then_dynamics)
    const bool rope = config_.positions == Positions::rope;
    const bool rotate_first = rope && config_.rope_order == RopeOrder::rotate_then_dynamics;
    if (rope && !rotate_first) rotate(ctx, dq, dk, true, s);
    // dynamics: cotangents of Q', K' -> of Q, K (in place); dyn.* and dyn.rho gradients
    if constexpr (Integrator::has_dynamics)
      dynamics_backward<Integrator, T>(dims(N), params + off_dyn_, params + off_rho_, q, k, dq, dk,
                                       dparams + off_dyn_, dparams + off_rho_, s);
    if (rotate_first) rotate(ctx, dq, dk, true, s);
    // [dWq | dWk | dWv] += X^T [dQ | dK | dV]
    const T* dqkv_t = detail::as_storage<T>(ctx.dqkv.data(), static_cast<Index>(3 * ND), ctx.dqkv_t, s);
    detail::gemm_strided_batched<T, float>(blas, true, false, D, D, N, 1.0f, ctx.x, D, 0, dqkv_t, D,
                                           static_cast<Index>(ND), 1.0f, dparams + off_wq_, D, D * D, 3);
    // dX = dQ Wq^T + dK Wk^T + dV Wv^T
    for (int i = 0; i < 3; ++i)
      gemm<T, float>(blas, false, true, N, D, D, 1.0f, dqkv_t + i * ND, D, params_t + off_wq_ + i * D * D, D,
                     i == 0 ? 0.0f : 1.0f, dx, D);
  }

  /// Offsets of the blocks of the flat parameter array (for tests and tools).
  Index offset_dynamics() const { return off_dyn_; }
  Index offset_rho() const { return off_rho_; }
  Index offset_scoring() const { return off_score_; }

 private:
  DynamicsDims dims(Index rows) const {
    return DynamicsDims{rows * config_.heads, config_.heads, config_.head_dim(), config_.hidden_width()};
  }
  ScoringDims scoring_dims(const Context& ctx) const {
    ScoringDims d{ctx.batch, ctx.seq, config_.heads, config_.head_dim(), config_.layer_index};
    d.mask = ctx.sequences.mask(config_.mask());
    return d;
  }
  /// Rotary positions of x0, x1 [rows, D] (Q and K, or inverse: their cotangents) at each row's
  /// position in its sequence.
  template <class E>
  void rotate(const Context& ctx, E* x0, E* x1, bool inverse, cudaStream_t s) const {
    ctx.rope.rotate(x0, x1, ctx.rows, config_.heads, ctx.batch, ctx.seq, ctx.sequences.mask(config_.mask()), inverse, s);
  }

  AttentionConfig config_;
  Index count_ = 0;
  Index off_wq_ = 0, off_wk_ = 0, off_wv_ = 0, off_wo_ = 0, off_dyn_ = 0, off_rho_ = 0, off_score_ = 0;
};

}  // namespace coupledqk::cuda
