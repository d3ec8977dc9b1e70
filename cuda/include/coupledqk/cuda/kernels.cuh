// CUDA kernels of the GPT's non-attention layers and of the optimiser, the device counterparts of
// include/coupledqk/autodiff/kernels.hpp, autodiff/ops.hpp (embedding) and optim/adamw.hpp:
//
//   embedding          x = wte[tok] + wpe[t] (x = wte[tok] without wpe: rotary or no positions);
//                      backward: dwte[tok] += dx (atomics), dwpe[t] += sum_b dx
//   LayerNorm          per row, biased variance, eps 1e-5; saves (mean, 1/std); backward dx (= or +=),
//                      dg, db (+=) through fixed row-chunk partial sums (deterministic)
//   GELU (tanh form)   fused with the fc bias in the forward; backward in place
//   bias + residual    out = resid + (y + bias); residual add; bias gradient = column sums (+=)
//   cross-entropy      fused softmax over the vocabulary per row: row losses and, for the backward,
//                      dlogits = scale * (softmax - onehot) written in place of the logits
//   row-loss sum       in double, one block, fixed order
//   gradient norm      sum of squares in double: fixed grid of block partials, then one block
//   AdamW              the update of optim/adamw.hpp over a flat buffer, decay mask per element,
//                      optionally refreshing a bf16 shadow of the parameters
//
// Conventions (runtime.cuh): activations row-major [rows, cols] stored as T (float or bf16), every
// sum accumulated in float (double where the CPU uses double), parameters and cotangents float.
// Every function takes the stream it launches on; none synchronises.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "runtime.cuh"

namespace coupledqk::cuda::kernels {

/// LayerNorm epsilon (GPT-2, PyTorch default; the CPU kernels' layer_norm_eps).
inline constexpr float layer_norm_eps = 1e-5f;

/// Rows per chunk of the column reductions (LayerNorm dg/db, bias gradients): partial sums per
/// chunk, then the chunks in order, so the result does not depend on scheduling.
inline constexpr Index column_chunk_rows = 128;

/// Blocks of the gradient-norm reduction (fixed, so the summation order is too).
inline constexpr int norm_blocks = 256;

/// Number of row chunks of a column reduction over N rows, and the partials it needs per column.
inline Index column_chunks(Index rows) { return std::max<Index>(1, (rows + column_chunk_rows - 1) / column_chunk_rows); }

namespace detail {

constexpr int warp = 32;
constexpr int rows_per_block = 8;  // warp-per-row kernels: 8 warps per block
constexpr unsigned full_mask = 0xffffffffu;

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(full_mask, v, o);
  return v;
}

/// Blocks for a grid-stride loop over n elements.
inline unsigned blocks_for(Index n, int threads = 256) { return grid_for(n, threads); }

/// Blocks for a warp-per-row kernel over `rows` rows.
inline unsigned row_blocks(Index rows) {
  const Index b = (rows + rows_per_block - 1) / rows_per_block;
  return static_cast<unsigned>(std::max<Index>(1, b));
}

__device__ inline float gelu(float x) {
  const float c = 0.7978845608028654f, k = 0.044715f;
  return 0.5f * x * (1.f + tanhf(c * (x + k * x * x * x)));
}

__device__ inline float gelu_grad(float x) {
  const float c = 0.7978845608028654f, k = 0.044715f;
  const float t = tanhf(c * (x + k * x * x * x));
  return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * c * (1.f + 3.f * k * x * x);
}

/// (m, s) <- the running (max, sum of exp(z - max)) of two partial sets merged. NaN in s propagates.
__device__ inline void merge_max_sum(float& m, float& s, float m2, float s2) {
  if (m2 > m) {
    s = s * expf(m - m2) + s2;  // m = -inf: s is 0 and exp(-inf) = 0
    m = m2;
  } else if (m2 != -INFINITY) {
    s += s2 * expf(m2 - m);
  }
}

// ---- kernels --------------------------------------------------------------------------------------
// (Kernels without a storage type are templates over an unused int, so that every translation unit
// that includes this header may define them.)

template <class T>
__global__ void embedding_forward_kernel(const std::int32_t* __restrict__ tokens, const float* __restrict__ wte,
                                         const float* __restrict__ wpe, T* __restrict__ x, Index N, Index seq,
                                         Index D) {
  const Index n = N * D;
  for (Index i = blockIdx.x * Index(blockDim.x) + threadIdx.x; i < n; i += Index(gridDim.x) * blockDim.x) {
    const Index r = i / D, c = i - r * D;
    const Index t = r % seq;
    x[i] = from_float<T>(wpe ? wte[Index(tokens[r]) * D + c] + wpe[t * D + c] : wte[Index(tokens[r]) * D + c]);
  }
}

template <int = 0>
__global__ void embedding_backward_tokens_kernel(const std::int32_t* __restrict__ tokens, const float* __restrict__ dx,
                                                 float* __restrict__ dwte, Index N, Index D) {
  const Index n = N * D;
  for (Index i = blockIdx.x * Index(blockDim.x) + threadIdx.x; i < n; i += Index(gridDim.x) * blockDim.x) {
    const Index r = i / D, c = i - r * D;
    atomicAdd(dwte + Index(tokens[r]) * D + c, dx[i]);
  }
}

/// One thread per (t, c): the batch's rows at position t summed in order (no atomics).
template <int = 0>
__global__ void embedding_backward_positions_kernel(const float* __restrict__ dx, float* __restrict__ dwpe, Index batch,
                                                    Index seq, Index D) {
  const Index n = seq * D;
  for (Index i = blockIdx.x * Index(blockDim.x) + threadIdx.x; i < n; i += Index(gridDim.x) * blockDim.x) {
    float s = 0.f;
    for (Index b = 0; b < batch; ++b) s += dx[b * n + i];  // row (b, t) is b*seq + t: offset b*seq*D + t*D + c
    dwpe[i] += s;
  }
}

/// One warp per row.
template <class T>
__global__ void layer_norm_forward_kernel(const T* __restrict__ x, const float* __restrict__ g,
                                          const float* __restrict__ b, T* __restrict__ y, float* __restrict__ mean,
                                          float* __restrict__ rstd, Index N, Index D, float eps) {
  const Index row = Index(blockIdx.x) * rows_per_block + threadIdx.x / warp;
  const int lane = threadIdx.x % warp;
  if (row >= N) return;  // whole warps leave together
  const T* xr = x + row * D;
  float s = 0.f;
  for (Index c = lane; c < D; c += warp) s += to_float(xr[c]);
  const float mu = warp_sum(s) / float(D);
  float v = 0.f;
  for (Index c = lane; c < D; c += warp) {
    const float d = to_float(xr[c]) - mu;
    v += d * d;
  }
  const float var = warp_sum(v) / float(D);
  const float r = 1.f / sqrtf(var + eps);
  T* yr = y + row * D;
  for (Index c = lane; c < D; c += warp) yr[c] = from_float<T>((to_float(xr[c]) - mu) * r * g[c] + b[c]);
  if (lane == 0 && mean) {
    mean[row] = mu;
    rstd[row] = r;
  }
}

/// One warp per row: dx (=, or += when accumulate) = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)).
template <class T>
__global__ void layer_norm_backward_kernel(const T* __restrict__ x, const float* __restrict__ g,
                                           const float* __restrict__ mean, const float* __restrict__ rstd,
                                           const float* __restrict__ dy, float* __restrict__ dx, bool accumulate,
                                           Index N, Index D) {
  const Index row = Index(blockIdx.x) * rows_per_block + threadIdx.x / warp;
  const int lane = threadIdx.x % warp;
  if (row >= N) return;
  const T* xr = x + row * D;
  const float* dyr = dy + row * D;
  const float mu = mean[row], r = rstd[row];
  float s1 = 0.f, s2 = 0.f;
  for (Index c = lane; c < D; c += warp) {
    const float xhat = (to_float(xr[c]) - mu) * r;
    const float dxhat = dyr[c] * g[c];
    s1 += dxhat;
    s2 += dxhat * xhat;
  }
  const float mean_dxhat = warp_sum(s1) / float(D);
  const float mean_dxhat_xhat = warp_sum(s2) / float(D);
  float* dxr = dx + row * D;
  for (Index c = lane; c < D; c += warp) {
    const float xhat = (to_float(xr[c]) - mu) * r;
    const float dxhat = dyr[c] * g[c];
    const float v = r * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
    dxr[c] = accumulate ? dxr[c] + v : v;
  }
}

/// Block (32, 8): 32 columns x one chunk of rows; partial sums of dy * xhat and dy per column.
template <class T>
__global__ void layer_norm_param_partials_kernel(const T* __restrict__ x, const float* __restrict__ mean,
                                                 const float* __restrict__ rstd, const float* __restrict__ dy,
                                                 float* __restrict__ part_g, float* __restrict__ part_b, Index N,
                                                 Index D, Index chunk_rows) {
  __shared__ float sg[rows_per_block][warp + 1];
  __shared__ float sb[rows_per_block][warp + 1];
  const Index c = Index(blockIdx.x) * warp + threadIdx.x;
  const Index chunk = blockIdx.y;
  const Index r0 = chunk * chunk_rows, r1 = r0 + chunk_rows < N ? r0 + chunk_rows : N;
  float ag = 0.f, ab = 0.f;
  if (c < D) {
    for (Index r = r0 + threadIdx.y; r < r1; r += rows_per_block) {
      const float d = dy[r * D + c];
      ag += d * ((to_float(x[r * D + c]) - mean[r]) * rstd[r]);
      ab += d;
    }
  }
  sg[threadIdx.y][threadIdx.x] = ag;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && c < D) {
    float tg = 0.f, tb = 0.f;
    for (int k = 0; k < rows_per_block; ++k) {
      tg += sg[k][threadIdx.x];
      tb += sb[k][threadIdx.x];
    }
    part_g[chunk * D + c] = tg;
    part_b[chunk * D + c] = tb;
  }
}

/// Block (32, 8): partial column sums of a float matrix [N, C] over one chunk of rows.
template <int = 0>
__global__ void column_sum_partials_kernel(const float* __restrict__ a, float* __restrict__ part, Index N, Index C,
                                           Index chunk_rows) {
  __shared__ float s[rows_per_block][warp + 1];
  const Index c = Index(blockIdx.x) * warp + threadIdx.x;
  const Index chunk = blockIdx.y;
  const Index r0 = chunk * chunk_rows, r1 = r0 + chunk_rows < N ? r0 + chunk_rows : N;
  float acc = 0.f;
  if (c < C)
    for (Index r = r0 + threadIdx.y; r < r1; r += rows_per_block) acc += a[r * C + c];
  s[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float t = 0.f;
    for (int k = 0; k < rows_per_block; ++k) t += s[k][threadIdx.x];
    part[chunk * C + c] = t;
  }
}

/// out[c] += sum over chunks (in order) of part[chunk, c].
template <int = 0>
__global__ void add_partials_kernel(const float* __restrict__ part, Index chunks, Index C, float* __restrict__ out) {
  for (Index c = blockIdx.x * Index(blockDim.x) + threadIdx.x; c < C; c += Index(gridDim.x) * blockDim.x) {
    float t = 0.f;
    for (Index k = 0; k < chunks; ++k) t += part[k * C + c];
    out[c] += t;
  }
}

/// pre = in + bias (stored as T), out = gelu(pre) (from the float value).
template <class T>
__global__ void bias_gelu_forward_kernel(const float* __restrict__ in, const float* __restrict__ bias,
                                         T* __restrict__ pre, T* __restrict__ out, Index N, Index C) {
  const Index n = N * C;
  for (Index i = blockIdx.x * Index(blockDim.x) + threadIdx.x; i < n; i += Index(gridDim.x) * blockDim.x) {
    const float v = in[i] + bias[i % C];
    pre[i] = from_float<T>(v);
    out[i] = from_float<T>(gelu(v));
  }
}

template <class T>
__global__ void gelu_backward_kernel(const T* __restrict__ pre, float* d, Index n) {
  for (Index i = blockIdx.x * Index(blockDim.x) + threadIdx.x; i < n; i += Index(gridDim.x) * blockDim.x)
    d[i] = d[i] * gelu_grad(to_float(pre[i]));
}

template <class T>
__global__ void gelu_forward_kernel(const T* __restrict__ x, T* __restrict__ y, Index n) {
  for (Index i = blockIdx.x * Index(blockDim.x) + threadIdx.x; i < n; i += Index(gridDim.x) * blockDim.x)
    y[i] = from_float<T>(gelu(to_float(x[i])));
}

/// out = resid + (y + bias[c]); out may alias resid.
template <class T>
__global__ void bias_residual_kernel(const T* resid, const float* __restrict__ y, const float* __restrict__ bias,
                                     T* out, Index N, Index C) {
  const Index n = N * C;
  for (Index i = blockIdx.x * Index(blockDim.x) + threadIdx.x; i < n; i += Index(gridDim.x) * blockDim.x) {
    const float m = bias ? y[i] + bias[i % C] : y[i];
    out[i] = from_float<T>(to_float(resid[i]) + m);
  }
}

/// out = a + b; out may alias a or b.
template <class T>
__global__ void add_kernel(const T* a, const T* b, T* out, Index n) {
  for (Index i = blockIdx.x * Index(blockDim.x) + threadIdx.x; i < n; i += Index(gridDim.x) * blockDim.x)
    out[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
}

constexpr int ce_threads = 256;

/// One block per row: online max and sum of exp, row loss = max + log(sum) - z[target]; with
/// write_grad, z <- scale * (softmax(z) - onehot(target)) in place.
template <int = 0>
__global__ void cross_entropy_kernel(float* logits, const std::int32_t* __restrict__ targets,
                                     float* __restrict__ row_loss, Index N, Index V, float scale, bool write_grad) {
  __shared__ float sm[ce_threads / warp], ss[ce_threads / warp];
  __shared__ float row_max, row_sum;
  const Index r = blockIdx.x;
  if (r >= N) return;
  float* z = logits + r * V;
  float m = -INFINITY, s = 0.f;
  for (Index c = threadIdx.x; c < V; c += blockDim.x) {
    const float v = z[c];
    if (v > m) {
      s = s * expf(m - v) + 1.f;
      m = v;
    } else {
      s += expf(v - m);
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(full_mask, m, o), s2 = __shfl_xor_sync(full_mask, s, o);
    merge_max_sum(m, s, m2, s2);
  }
  const int w = threadIdx.x / warp, lane = threadIdx.x % warp;
  if (lane == 0) {
    sm[w] = m;
    ss[w] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float M = sm[0], S = ss[0];
    for (int k = 1; k < int(blockDim.x) / warp; ++k) merge_max_sum(M, S, sm[k], ss[k]);
    row_max = M;
    row_sum = S;
    const std::int32_t t = targets[r];
    row_loss[r] = M + logf(S) - z[t];
  }
  __syncthreads();
  if (!write_grad) return;
  const float M = row_max, inv = 1.f / row_sum;
  const std::int32_t t = targets[r];
  for (Index c = threadIdx.x; c < V; c += blockDim.x) {
    const float p = expf(z[c] - M) * inv;
    z[c] = (c == t ? p - 1.f : p) * scale;
  }
}

constexpr int reduce_threads = 256;

/// *out = sum of v[0..n) in double (one block; fixed order).
/// The sum of every thread's `acc` over a block of reduce_threads threads, in a fixed order
/// (a shared-memory tree); the result is valid in thread 0.
__device__ __forceinline__ double block_sum(double acc) {
  __shared__ double s[reduce_threads];
  s[threadIdx.x] = acc;
  __syncthreads();
  for (int k = reduce_threads / 2; k > 0; k >>= 1) {
    if (int(threadIdx.x) < k) s[threadIdx.x] += s[threadIdx.x + k];
    __syncthreads();
  }
  return s[0];
}

/// *out = sum of v[0..n) in double (one block, fixed order); v is float or double.
template <class In>
__global__ void sum_to_double_kernel(const In* __restrict__ v, Index n, double* __restrict__ out) {
  double acc = 0;
  for (Index i = threadIdx.x; i < n; i += blockDim.x) acc += static_cast<double>(v[i]);
  const double total = block_sum(acc);
  if (threadIdx.x == 0) *out = total;
}

/// partials[block] = sum of g^2 (in double) over the block's grid-stride share.
template <int = 0>
__global__ void sum_squares_partials_kernel(const float* __restrict__ g, Index n, double* __restrict__ partials) {
  double acc = 0;
  for (Index i = blockIdx.x * Index(blockDim.x) + threadIdx.x; i < n; i += Index(gridDim.x) * blockDim.x) {
    const double x = static_cast<double>(g[i]);
    acc += x * x;
  }
  const double total = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

}  // namespace detail

// ---- host wrappers ----------------------------------------------------------------------------------

/// x[r, :] = wte[tokens[r], :] + wpe[r % seq, :]. tokens: N ids (device); wte [V, D], wpe [>= seq, D]
/// float, or null (a model without learned positions: x = wte[tokens]); x [N, D] written.
template <class T>
void embedding_forward(const std::int32_t* tokens, const float* wte, const float* wpe, T* x, Index N, Index seq,
                       Index D, cudaStream_t s) {
  if (N * D == 0) return;
  launch(detail::embedding_forward_kernel<T>, detail::blocks_for(N * D), 256, 0, s, tokens, wte, wpe, x, N, seq, D);
}

/// dwte[tokens[r], :] += dx[r, :] (atomics: the order of the additions varies); dwpe[t, :] += the
/// sum over the batch of dx[(b, t), :] (fixed order), unless dwpe is null. dx: [N = batch*seq, D] float.
inline void embedding_backward(const std::int32_t* tokens, const float* dx, float* dwte, float* dwpe, Index batch,
                               Index seq, Index D, cudaStream_t s) {
  const Index N = batch * seq;
  if (N * D == 0) return;
  launch(detail::embedding_backward_tokens_kernel<>, detail::blocks_for(N * D), 256, 0, s, tokens, dx, dwte, N, D);
  if (dwpe)
    launch(detail::embedding_backward_positions_kernel<>, detail::blocks_for(seq * D), 256, 0, s, dx, dwpe, batch,
           seq, D);
}

/// y = LayerNorm(x) g + b per row; mean, rstd: [N] written (may be null together).
template <class T>
void layer_norm_forward(const T* x, const float* g, const float* b, T* y, float* mean, float* rstd, Index N, Index D,
                        cudaStream_t s, float eps = layer_norm_eps) {
  if (N == 0) return;
  launch(detail::layer_norm_forward_kernel<T>, detail::row_blocks(N), detail::warp * detail::rows_per_block, 0, s, x, g,
         b, y, mean, rstd, N, D, eps);
}

/// LayerNorm backward. dx [N, D]: written (=), or added to (+=) with accumulate; dg, db [D]: +=
/// (both null: not computed). partials: scratch of at least 2 * column_chunks(N) * D floats.
template <class T>
void layer_norm_backward(const T* x, const float* g, const float* mean, const float* rstd, const float* dy, float* dx,
                         bool accumulate, float* dg, float* db, float* partials, Index N, Index D, cudaStream_t s) {
  if (N == 0) return;
  launch(detail::layer_norm_backward_kernel<T>, detail::row_blocks(N), detail::warp * detail::rows_per_block, 0, s, x,
         g, mean, rstd, dy, dx, accumulate, N, D);
  if (!dg && !db) return;
  const Index chunks = column_chunks(N);
  float* part_g = partials;
  float* part_b = partials + chunks * D;
  const dim3 grid(static_cast<unsigned>((D + detail::warp - 1) / detail::warp), static_cast<unsigned>(chunks));
  const dim3 block(detail::warp, detail::rows_per_block);
  launch(detail::layer_norm_param_partials_kernel<T>, grid, block, 0, s, x, mean, rstd, dy, part_g, part_b, N, D,
         column_chunk_rows);
  if (dg) {
    launch(detail::add_partials_kernel<>, detail::blocks_for(D), 256, 0, s, part_g, chunks, D, dg);
  }
  if (db) {
    launch(detail::add_partials_kernel<>, detail::blocks_for(D), 256, 0, s, part_b, chunks, D, db);
  }
}

/// out[c] += sum over rows of a[r, c]; a: [N, C] float. partials: column_chunks(N) * C floats.
inline void column_sums(const float* a, Index N, Index C, float* out, float* partials, cudaStream_t s) {
  if (N == 0 || C == 0) return;
  const Index chunks = column_chunks(N);
  const dim3 grid(static_cast<unsigned>((C + detail::warp - 1) / detail::warp), static_cast<unsigned>(chunks));
  const dim3 block(detail::warp, detail::rows_per_block);
  launch(detail::column_sum_partials_kernel<>, grid, block, 0, s, a, partials, N, C, column_chunk_rows);
  launch(detail::add_partials_kernel<>, detail::blocks_for(C), 256, 0, s, partials, chunks, C, out);
}

/// pre = in + bias (per column), out = gelu(pre); in: [N, C] float (a GEMM's output); pre, out: T.
template <class T>
void bias_gelu_forward(const float* in, const float* bias, T* pre, T* out, Index N, Index C, cudaStream_t s) {
  if (N * C == 0) return;
  launch(detail::bias_gelu_forward_kernel<T>, detail::blocks_for(N * C), 256, 0, s, in, bias, pre, out, N, C);
}

/// y = gelu(x) (tanh form), n elements.
template <class T>
void gelu_forward(const T* x, T* y, Index n, cudaStream_t s) {
  if (n == 0) return;
  launch(detail::gelu_forward_kernel<T>, detail::blocks_for(n), 256, 0, s, x, y, n);
}

/// d <- d * gelu'(pre), in place; n elements.
template <class T>
void gelu_backward(const T* pre, float* d, Index n, cudaStream_t s) {
  if (n == 0) return;
  launch(detail::gelu_backward_kernel<T>, detail::blocks_for(n), 256, 0, s, pre, d, n);
}

/// out = resid + (y + bias) with y [N, C] float and bias [C] float (null: no bias); out may alias resid.
template <class T>
void bias_residual(const T* resid, const float* y, const float* bias, T* out, Index N, Index C, cudaStream_t s) {
  if (N * C == 0) return;
  launch(detail::bias_residual_kernel<T>, detail::blocks_for(N * C), 256, 0, s, resid, y, bias, out, N, C);
}

/// out = a + b (n elements); out may alias a or b.
template <class T>
void residual_add(const T* a, const T* b, T* out, Index n, cudaStream_t s) {
  if (n == 0) return;
  launch(detail::add_kernel<T>, detail::blocks_for(n), 256, 0, s, a, b, out, n);
}

/// Softmax cross-entropy per row of logits [N, V] (float, device) against targets (device ids in
/// [0, V), checked by the caller): row_loss[r] = logsumexp(z_r) - z_r[t_r] (float, [N]); *loss_sum =
/// their sum in double. With write_grad, logits <- grad_scale * (softmax - onehot) in place
/// (grad_scale = 1/N for the mean loss).
inline void cross_entropy(float* logits, const std::int32_t* targets, float* row_loss, double* loss_sum, Index N,
                          Index V, bool write_grad, float grad_scale, cudaStream_t s) {
  if (N == 0) return;
  launch(detail::cross_entropy_kernel<>, static_cast<unsigned>(N), detail::ce_threads, 0, s, logits, targets, row_loss,
         N, V, grad_scale, write_grad);
  if (loss_sum) {
    launch(detail::sum_to_double_kernel<float>, 1, detail::reduce_threads, 0, s, row_loss, N, loss_sum);
  }
}

/// *out = sum of g[i]^2 over n floats, in double. partials: norm_blocks doubles of scratch.
inline void sum_squares(const float* g, Index n, double* partials, double* out, cudaStream_t s) {
  launch(detail::sum_squares_partials_kernel<>, norm_blocks, detail::reduce_threads, 0, s, g, n, partials);
  launch(detail::sum_to_double_kernel<double>, 1, detail::reduce_threads, 0, s, partials, norm_blocks, out);
}

// ---- AdamW ------------------------------------------------------------------------------------------

/// The per-step constants of optim/adamw.hpp's update, rounded to float exactly as AdamW<float>::step
/// rounds them.
struct AdamWStepConstants {
  float b1, b2, one_b1, one_b2;
  float step_size;     ///< lr / (1 - beta1^t)
  float inv_sqrt_bc2;  ///< 1 / sqrt(1 - beta2^t)
  float eps;
  float decay;         ///< 1 - lr * weight_decay
  float clip;          ///< clipping factor (1: none)
};

/// Fills the constants from the configuration's numbers, the update number t (1-based), its
/// learning rate and the clipping factor -- the same expressions as AdamW<float>::step.
inline AdamWStepConstants adamw_constants(double beta1, double beta2, double eps, double weight_decay, double lr,
                                          double clip_scale, Index t) {
  AdamWStepConstants k;
  k.b1 = float(beta1);
  k.b2 = float(beta2);
  k.one_b1 = float(1 - beta1);
  k.one_b2 = float(1 - beta2);
  const double bc1 = 1 - std::pow(beta1, static_cast<double>(t));
  const double bc2 = 1 - std::pow(beta2, static_cast<double>(t));
  k.step_size = float(lr / bc1);
  k.inv_sqrt_bc2 = float(1 / std::sqrt(bc2));
  k.eps = float(eps);
  k.decay = float(1 - lr * weight_decay);
  k.clip = float(clip_scale);
  return k;
}

namespace detail {
template <int = 0>
__global__ void adamw_kernel(float* __restrict__ p, const float* __restrict__ grad, float* __restrict__ m,
                             float* __restrict__ v, const std::uint8_t* __restrict__ decay_mask,
                             bf16* __restrict__ shadow, Index n, AdamWStepConstants k) {
  for (Index i = blockIdx.x * Index(blockDim.x) + threadIdx.x; i < n; i += Index(gridDim.x) * blockDim.x) {
    const float g = grad[i] * k.clip;
    const float mi = k.b1 * m[i] + k.one_b1 * g;
    const float vi = k.b2 * v[i] + k.one_b2 * g * g;
    float pi = p[i];
    if (decay_mask[i]) pi *= k.decay;
    pi -= k.step_size * mi / (sqrtf(vi) * k.inv_sqrt_bc2 + k.eps);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if (shadow) shadow[i] = __float2bfloat16_rn(pi);
  }
}
}  // namespace detail

/// One AdamW update of n parameters (float masters p, gradients grad, moments m, v) with a decay
/// flag per element (1: decoupled weight decay applies). shadow (may be null): a bf16 copy of p,
/// refreshed with the new values.
inline void adamw_update(float* p, const float* grad, float* m, float* v, const std::uint8_t* decay_mask, bf16* shadow,
                         Index n, const AdamWStepConstants& k, cudaStream_t s) {
  if (n == 0) return;
  launch(detail::adamw_kernel<>, detail::blocks_for(n), 256, 0, s, p, grad, m, v, decay_mask, shadow, n, k);
}

/// shadow = bf16(p) for n parameters (after an upload or any direct write to the masters).
inline void refresh_shadow(const float* p, bf16* shadow, Index n, cudaStream_t s) { convert<bf16, float>(p, shadow, n, s); }

}  // namespace coupledqk::cuda::kernels
