// The scoring policies on the device: the same maths as include/coupledqk/scoring/softmax.hpp and
// differential.hpp, on top of the flash kernels of flash.cuh, under the run-time mask and sequences
// of ScoringDims::mask (causal over B sequences of T rows by default; padding rows give o = 0 and
// zero gradients, as on the CPU).
//
//     DeviceScoring<coupledqk::Softmax>       one flash attention, scale 1/sqrt(d)
//     DeviceScoring<coupledqk::Differential>  two flash attentions per differential head, lambda,
//                                             RMSNorm over the 2d channels, (1 - lambda_init) subln
//
// Tensors: q, k, v, o are [B*T, D] row-major ([rows, D] for packed sequences), D = H*d; (token r, head h) is columns h*d..h*d+d-1
// of row r. Cotangents are float. Parameters are one flat float block, in the CPU visit order
// (Differential: lq1, lk1, lq2, lk2 [d] each, then subln [2d]); their gradient is accumulated (+=).
// Everything is asynchronous on the given stream: lambda is computed on the device, nothing syncs.
//
// Reductions over rows (Differential: d subln and d lambda) are deterministic two-pass: each block
// of the norm's backward writes its partial sums, one more block adds them in a fixed order.
// With the flash kernels (no atomics) every result is bitwise reproducible run to run.
//
// Scratch (thread_local, grown on demand and reused; so calls from one host thread on different
// streams must not overlap in time):
//   * Differential forward with saved == nullptr (inference): a Saved<T> for O1, O2, lse, ...;
//   * Differential backward: dA, -lambda dA [B*T, D] (float) and the reduction partials;
//   * flash_backward's D (see flash.cuh).
#pragma once

#include <cmath>
#include <stdexcept>
#include <string>

#include <coupledqk/scoring/differential.hpp>
#include <coupledqk/scoring/softmax.hpp>

#include "flash.cuh"
#include "runtime.cuh"

namespace coupledqk::cuda {

/// heads = H query/key pairs per token (Differential: H/2 differential heads); head_dim = d;
/// mask: which keys a query reads and the rows' layout (flash.cuh; seq is the longest sequence
/// when packed).
struct ScoringDims {
  Index batch = 0, seq = 0, heads = 0, head_dim = 0;
  int layer_index = 0;
  FlashMask mask{};

  /// Rows of q, k, v, o: B*T, or the packed sequences' rows.
  Index rows() const { return mask.offsets ? mask.rows : batch * seq; }
};

/// The device kernels of scoring policy Sc: the primary template, "none" (cuda::variant_supported
/// says false and cuda::make_gpt refuses such a variant at run time). A scoring with kernels
/// specialises it with supported = true, parameter_count, Saved<T>, forward and backward (below).
template <class Scoring>
struct DeviceScoring {
  static constexpr bool supported = false;
};

namespace scoring_detail {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxChannelsPerLane = 8;  // 2d <= 256 channels over 32 lanes
constexpr int kMaxNormBlocks = 1024;    // partial sums of the Differential backward

[[noreturn]] inline void fail(const char* who, const std::string& what) {
  throw ::coupledqk::invalid_argument(std::string("coupledqk::cuda::") + who + ": " + what);
}

inline void validate_dims(const ScoringDims& d, const char* who) {
  if (d.batch < 0 || d.seq < 0 || d.heads < 0)
    fail(who, "batch, seq and heads must be >= 0; got batch = " + std::to_string(d.batch) +
                  ", seq = " + std::to_string(d.seq) + ", heads = " + std::to_string(d.heads));
  if (d.head_dim < 1 || d.head_dim > flash_max_dqk)
    fail(who, "head_dim = " + std::to_string(d.head_dim) + " is not supported; accepted: 1 <= head_dim <= " +
                  std::to_string(flash_max_dqk));
}

inline bool empty(const ScoringDims& d) { return d.batch == 0 || d.seq == 0 || d.heads == 0; }

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

// ---- Differential kernels --------------------------------------------------------------------------

// out = {lambda, exp(lq1 . lk1), exp(lq2 . lk2)}; one warp. (Templates, here and below, only so
// that the header can be included by several translation units.)
template <class = void>
__global__ void __launch_bounds__(32) diff_lambda_kernel(const float* __restrict__ params, int d, float lambda_init,
                                                         float* __restrict__ out) {
  const int lane = static_cast<int>(threadIdx.x);
  const float *lq1 = params, *lk1 = params + d, *lq2 = params + 2 * d, *lk2 = params + 3 * d;
  float s1 = 0.0f, s2 = 0.0f;
  for (int i = lane; i < d; i += 32) {
    s1 = fmaf(lq1[i], lk1[i], s1);
    s2 = fmaf(lq2[i], lk2[i], s2);
  }
  s1 = warp_sum(s1);
  s2 = warp_sum(s2);
  if (lane == 0) {
    const float e1 = expf(s1), e2 = expf(s2);
    out[0] = e1 - e2 + lambda_init;
    out[1] = e1;
    out[2] = e2;
  }
}

// One warp per (row, differential head g): A = O1 - lambda O2 over the W = 2d channels,
// r = (mean(A^2) + eps)^(-1/2), out = (out_scale r) A subln; inv_rms [rows, G] = r.
template <class E>
__global__ void __launch_bounds__(kThreads)
    diff_norm_forward_kernel(const E* __restrict__ o1, const E* __restrict__ o2, const float* __restrict__ lam,
                             const float* __restrict__ subln, float out_scale, float eps, E* __restrict__ out,
                             float* __restrict__ inv_rms, Index rows, int groups, int d) {
  const int lane = static_cast<int>(threadIdx.x) % 32, W = 2 * d;
  const Index width = Index(groups) * W, items = rows * groups;
  const Index warps = Index(gridDim.x) * kWarps;
  const float lambda = lam[0];
  for (Index w = Index(blockIdx.x) * kWarps + threadIdx.x / 32; w < items; w += warps) {
    const Index row = w / groups;
    const Index base = row * width + (w % groups) * W;
    float a[kMaxChannelsPerLane];
    float ss = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kMaxChannelsPerLane; ++kk) {
      const int c = lane + 32 * kk;
      a[kk] = 0.0f;
      if (c < W) {
        a[kk] = to_float(o1[base + c]) - lambda * to_float(o2[base + c]);
        ss = fmaf(a[kk], a[kk], ss);
      }
    }
    ss = warp_sum(ss);
    const float r = 1.0f / sqrtf(ss / static_cast<float>(W) + eps);
    const float f = out_scale * r;
#pragma unroll
    for (int kk = 0; kk < kMaxChannelsPerLane; ++kk) {
      const int c = lane + 32 * kk;
      if (c < W) out[base + c] = from_float<E>(f * a[kk] * subln[c]);
    }
    if (lane == 0) inv_rms[w] = r;
  }
}

// Backward of the norm, one warp per (row, g): with gi = out_scale d_o subln,
//     dA = r (gi - A r^2 mean(gi A)),   dO1 = dA,   dO2 = -lambda dA,
//     d subln += out_scale r A d_o,     d lambda -= dA . O2.
// Block partials -> partial[blockIdx.x][0..W) (d subln) and [W] (d lambda).
template <class E>
__global__ void __launch_bounds__(kThreads)
    diff_norm_backward_kernel(const E* __restrict__ o1, const E* __restrict__ o2, const float* __restrict__ lam,
                              const float* __restrict__ inv_rms, const float* __restrict__ d_o,
                              const float* __restrict__ subln, float out_scale, float* __restrict__ dav,
                              float* __restrict__ dav2, float* __restrict__ partial, Index rows, int groups, int d) {
  __shared__ float red[kWarps][32 * kMaxChannelsPerLane + 1];
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32, W = 2 * d;
  const Index width = Index(groups) * W, items = rows * groups;
  const Index warps = Index(gridDim.x) * kWarps;
  const float lambda = lam[0];
  float dsub[kMaxChannelsPerLane];
#pragma unroll
  for (int kk = 0; kk < kMaxChannelsPerLane; ++kk) dsub[kk] = 0.0f;
  float dlam = 0.0f;
  for (Index w = Index(blockIdx.x) * kWarps + warp; w < items; w += warps) {
    const Index row = w / groups;
    const Index base = row * width + (w % groups) * W;
    const float r = inv_rms[w];
    float a[kMaxChannelsPerLane], x2[kMaxChannelsPerLane], gi[kMaxChannelsPerLane];
    float dot = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kMaxChannelsPerLane; ++kk) {
      const int c = lane + 32 * kk;
      a[kk] = x2[kk] = gi[kk] = 0.0f;
      if (c < W) {
        x2[kk] = to_float(o2[base + c]);
        a[kk] = to_float(o1[base + c]) - lambda * x2[kk];
        const float g = d_o[base + c];
        gi[kk] = out_scale * g * subln[c];
        dot = fmaf(gi[kk], a[kk], dot);
        dsub[kk] = fmaf(out_scale * r, a[kk] * g, dsub[kk]);
      }
    }
    const float mean_go = warp_sum(dot) / static_cast<float>(W);
    const float rr = r * r * mean_go;
#pragma unroll
    for (int kk = 0; kk < kMaxChannelsPerLane; ++kk) {
      const int c = lane + 32 * kk;
      if (c < W) {
        const float da = r * (gi[kk] - a[kk] * rr);
        dav[base + c] = da;
        dav2[base + c] = -lambda * da;
        dlam = fmaf(-da, x2[kk], dlam);
      }
    }
  }
  // block partials, in a fixed order
#pragma unroll
  for (int kk = 0; kk < kMaxChannelsPerLane; ++kk) {
    const int c = lane + 32 * kk;
    if (c < W) red[warp][c] = dsub[kk];
  }
  dlam = warp_sum(dlam);
  if (lane == 0) red[warp][W] = dlam;
  __syncthreads();
  for (int c = static_cast<int>(threadIdx.x); c <= W; c += kThreads) {
    float s = 0.0f;
#pragma unroll
    for (int wi = 0; wi < kWarps; ++wi) s += red[wi][c];
    partial[Index(blockIdx.x) * (W + 1) + c] = s;
  }
}

// One block: sums the partials in block order, then dparams (+=):
//     d subln += sum,  d lq1 += dl e1 lk1,  d lk1 += dl e1 lq1,  d lq2 -= dl e2 lk2,  d lk2 -= dl e2 lq2.
template <class = void>
__global__ void __launch_bounds__(kThreads)
    diff_param_grad_kernel(const float* __restrict__ partial, int blocks, const float* __restrict__ params,
                           const float* __restrict__ lam, int d, float* __restrict__ dparams) {
  __shared__ float dlambda;
  const int W = 2 * d;
  for (int c = static_cast<int>(threadIdx.x); c <= W; c += kThreads) {
    float s = 0.0f;
    for (int bi = 0; bi < blocks; ++bi) s += partial[Index(bi) * (W + 1) + c];
    if (c < W)
      dparams[4 * d + c] += s;
    else
      dlambda = s;
  }
  __syncthreads();
  const float dl = dlambda, e1 = lam[1], e2 = lam[2];
  for (int i = static_cast<int>(threadIdx.x); i < d; i += kThreads) {
    dparams[i] += dl * e1 * params[d + i];              // lq1
    dparams[d + i] += dl * e1 * params[i];              // lk1
    dparams[2 * d + i] -= dl * e2 * params[3 * d + i];  // lq2
    dparams[3 * d + i] -= dl * e2 * params[2 * d + i];  // lk2
  }
}

}  // namespace scoring_detail

// ---- Softmax ------------------------------------------------------------------------------------------

template <>
struct DeviceScoring<coupledqk::Softmax> {
  static constexpr bool supported = true;
  static Index parameter_count(Index) { return 0; }

  /// lse [B, H, T] of the forward (the output o itself is passed back to backward).
  template <class T>
  struct Saved {
    DeviceBuffer<float> lse;
  };

  static void validate(const ScoringDims& d) { scoring_detail::validate_dims(d, "DeviceScoring<Softmax>"); }

  /// One attention over the H heads of [B*T, H*d] tensors.
  static FlashLayout layout(const ScoringDims& d) {
    const Index D = d.heads * d.head_dim;
    FlashLayout l;
    l.batch = d.batch, l.seq = d.seq, l.heads = d.heads, l.dqk = d.head_dim, l.dv = d.head_dim;
    l.q_row = l.k_row = l.v_row = l.o_row = D;
    l.q_head = l.k_head = l.v_head = l.o_head = d.head_dim;
    l.scale = 1.0f / std::sqrt(static_cast<float>(d.head_dim));
    l.mask = d.mask;
    return l;
  }

  /// o (=). saved may be null (inference: lse is not kept).
  template <class T>
  static void forward(const ScoringDims& d, const float*, const T* q, const T* k, const T* v, T* o,
                      Saved<T>* saved, cudaStream_t stream) {
    validate(d);
    if (scoring_detail::empty(d)) return;
    float* lse = nullptr;
    if (saved) {
      saved->lse.reserve(static_cast<std::size_t>(d.batch * d.heads * d.seq));
      lse = saved->lse.data();
    }
    flash_forward<T>(layout(d), q, k, v, o, lse, stream);
  }

  /// dq, dk, dv (=); no parameters, dparams untouched.
  template <class T>
  static void backward(const ScoringDims& d, const float*, const T* q, const T* k, const T* v, const T* o,
                       const Saved<T>& saved, const float* d_o, float* dq, float* dk, float* dv, float*,
                       cudaStream_t stream) {
    validate(d);
    if (scoring_detail::empty(d)) return;
    if (saved.lse.size() < static_cast<std::size_t>(d.batch * d.heads * d.seq))
      scoring_detail::fail("DeviceScoring<Softmax>::backward",
                           "saved holds no lse of this shape: run forward with a Saved first");
    flash_backward<T>(layout(d), q, k, v, o, d_o, saved.lse.data(), dq, dk, dv, stream);
  }
};

// ---- Differential -------------------------------------------------------------------------------------

template <>
struct DeviceScoring<coupledqk::Differential> {
  static constexpr bool supported = true;
  /// lq1, lk1, lq2, lk2 [d], subln [2d].
  static Index parameter_count(Index head_dim) { return 6 * head_dim; }

  /// What the backward needs, reused across calls (buffers only grow).
  template <class T>
  struct Saved {
    DeviceBuffer<T> o1, o2;          ///< [B*T, D]: P1 V and P2 V of every differential head
    DeviceBuffer<float> lse1, lse2;  ///< [B, H/2, T]
    DeviceBuffer<float> inv_rms;     ///< [B*T, H/2]
    DeviceBuffer<float> lambda;      ///< [3]: lambda, exp(lq1 . lk1), exp(lq2 . lk2)
  };

  static void validate(const ScoringDims& d) {
    const char* who = "DeviceScoring<Differential>";
    scoring_detail::validate_dims(d, who);
    if (d.heads < 2 || d.heads % 2 != 0)
      scoring_detail::fail(who, "the heads are paired (sub-heads 2g and 2g+1 form differential head g), so "
                                "heads must be even and >= 2; got heads = " + std::to_string(d.heads));
    if (d.layer_index < 0)
      scoring_detail::fail(who, "layer_index must be >= 0; got " + std::to_string(d.layer_index));
  }

  /// Sub-heads 2g (q, k as given) or 2g+1 (q + d, k + d): head stride 2d; values of width 2d.
  static FlashLayout layout(const ScoringDims& d) {
    const Index D = d.heads * d.head_dim, W = 2 * d.head_dim;
    FlashLayout l;
    l.batch = d.batch, l.seq = d.seq, l.heads = d.heads / 2, l.dqk = d.head_dim, l.dv = W;
    l.q_row = l.k_row = l.v_row = l.o_row = D;
    l.q_head = l.k_head = l.v_head = l.o_head = W;
    l.scale = 1.0f / std::sqrt(static_cast<float>(d.head_dim));
    l.mask = d.mask;
    return l;
  }

  /// o (=). saved may be null (inference: a thread_local Saved is used as scratch).
  template <class T>
  static void forward(const ScoringDims& d, const float* params, const T* q, const T* k, const T* v, T* o,
                      Saved<T>* saved, cudaStream_t stream) {
    using namespace scoring_detail;
    validate(d);
    if (empty(d)) return;
    if (!params) fail("DeviceScoring<Differential>::forward", "params is null");
    Saved<T>& s = saved ? *saved : inference_scratch<T>();
    const Index hd = d.head_dim, G = d.heads / 2, rows = d.rows(), n = rows * d.heads * hd;
    s.o1.reserve(static_cast<std::size_t>(n));
    s.o2.reserve(static_cast<std::size_t>(n));
    s.lse1.reserve(static_cast<std::size_t>(d.batch * G * d.seq));
    s.lse2.reserve(static_cast<std::size_t>(d.batch * G * d.seq));
    s.inv_rms.reserve(static_cast<std::size_t>(rows * G));
    s.lambda.reserve(3);

    const float lambda_init = static_cast<float>(coupledqk::Differential::lambda_init(d.layer_index));
    launch(diff_lambda_kernel<>, 1, 32, 0, stream, params, static_cast<int>(hd), lambda_init, s.lambda.data());

    const FlashLayout l = layout(d);
    flash_forward<T>(l, q, k, v, s.o1.data(), s.lse1.data(), stream);
    flash_forward<T>(l, q + hd, k + hd, v, s.o2.data(), s.lse2.data(), stream);

    launch(diff_norm_forward_kernel<T>, grid_for(rows * G, kWarps), kThreads, 0, stream, s.o1.data(), s.o2.data(),
           s.lambda.data(), params + 4 * hd, 1.0f - lambda_init, static_cast<float>(coupledqk::Differential::rms_eps),
           o, s.inv_rms.data(), rows, static_cast<int>(G), static_cast<int>(hd));
  }

  /// dq, dk, dv (=); dparams (+=). o is not needed (what is, is in saved).
  template <class T>
  static void backward(const ScoringDims& d, const float* params, const T* q, const T* k, const T* v, const T*,
                       const Saved<T>& s, const float* d_o, float* dq, float* dk, float* dv, float* dparams,
                       cudaStream_t stream) {
    using namespace scoring_detail;
    const char* who = "DeviceScoring<Differential>::backward";
    validate(d);
    if (empty(d)) return;
    if (!params || !dparams) fail(who, "params and dparams must not be null");
    const Index hd = d.head_dim, G = d.heads / 2, rows = d.rows(), n = rows * d.heads * hd;
    if (s.o1.size() < static_cast<std::size_t>(n) || s.inv_rms.size() < static_cast<std::size_t>(rows * G) ||
        s.lse1.size() < static_cast<std::size_t>(d.batch * G * d.seq) || s.lambda.size() < 3)
      fail(who, "saved holds nothing of this shape: run forward with a Saved first");

    Workspace& ws = workspace();
    ws.dav.reserve(static_cast<std::size_t>(n));
    ws.dav2.reserve(static_cast<std::size_t>(n));
    const Index items = rows * G;
    const Index want = (items + kWarps - 1) / kWarps;
    const int blocks = static_cast<int>(want < kMaxNormBlocks ? want : kMaxNormBlocks);
    ws.partial.reserve(static_cast<std::size_t>(blocks) * static_cast<std::size_t>(2 * hd + 1));

    const float out_scale = 1.0f - static_cast<float>(coupledqk::Differential::lambda_init(d.layer_index));
    launch(diff_norm_backward_kernel<T>, blocks, kThreads, 0, stream, s.o1.data(), s.o2.data(), s.lambda.data(),
           s.inv_rms.data(), d_o, params + 4 * hd, out_scale, ws.dav.data(), ws.dav2.data(), ws.partial.data(), rows,
           static_cast<int>(G), static_cast<int>(hd));
    launch(diff_param_grad_kernel<>, 1, kThreads, 0, stream, ws.partial.data(), blocks, params, s.lambda.data(),
           static_cast<int>(hd), dparams);

    // O1 gets dA, O2 gets -lambda dA; both attentions read the same values, so the second
    // accumulates into dv.
    const FlashLayout l = layout(d);
    flash_detail::backward<T>(l, q, k, v, s.o1.data(), ws.dav.data(), s.lse1.data(), dq, dk, dv,
                              /*accumulate_dv=*/false, flash_detail::Kernels::automatic, stream);
    flash_detail::backward<T>(l, q + hd, k + hd, v, s.o2.data(), ws.dav2.data(), s.lse2.data(), dq + hd,
                              dk + hd, dv, /*accumulate_dv=*/true, flash_detail::Kernels::automatic, stream);
  }

 private:
  struct Workspace {
    DeviceBuffer<float> dav, dav2, partial;
  };
  static Workspace& workspace() {
    thread_local Workspace w;
    return w;
  }
  template <class T>
  static Saved<T>& inference_scratch() {
    thread_local Saved<T> s;
    return s;
  }
};

}  // namespace coupledqk::cuda
