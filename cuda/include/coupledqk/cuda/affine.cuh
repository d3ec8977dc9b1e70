// Device dynamics of the invertible affine coupling, Affine<N> (method spec section 3b; the CPU
// policy is include/coupledqk/integrators/affine.hpp, the maths dynamics/affine_coupling.hpp):
//
//     per step, h = softplus(rho_h) / N:
//         k <- k * exp(h s_k(q)) + h t_k(q);      q <- q * exp(h s_q(k)) + h t_q(k)
//     conditioner (reads c [d]):  u = tanh(A c + a) [m];  s = 2 tanh((S u + s0) / 2);  t = T u + t0
//
// Reached through dynamics_forward / dynamics_backward (dynamics.cuh) for Affine<N> and any policy
// derived from it: same arguments, same contract, through the DeviceDynamics specialisation at the
// end of this file (a family with its own kernels: one header like this one).
//
// ---- Memory layout --------------------------------------------------------------------------
// q, k: [P, d] row-major, storage T (float or bf16, converted to float on load, rounded on store;
// every computation is float32). dq, dk: float32 [P, d]. params / dparams: float32, the tensors in
// visit() order: k.A [m, d], k.a [m], k.S [d, m], k.s [d], k.T [d, m], k.t [d], then q.* the same
// (2 (3 m d + m + 2 d) floats). rho, drho: float32 [H].
//
// ---- Kernels --------------------------------------------------------------------------------
// 256 threads per block; each block loops over tiles of R consecutive pairs (R <= 32, the largest
// power of two whose tile fits in 48 KB of shared memory: 16 for d = m = 64, 8 for d = m = 128),
// so no opt-in shared memory is needed. Per half-step two passes, each a barrier apart:
//     u = tanh(c A^T + a)                     [R, m]   one thread per element
//     x = x exp(h s(u)) + h t(u)              [R, d]   one thread per element (s, t in registers)
// Forward: q, k stay in shared memory for all N steps; written once per tile.
// Backward: recomputes the forward of the tile from (q_in, k_in), then walks back step by step
// with the closed-form inverse x = (x' - h t) exp(-h s) -- the recompute backward of the CPU's
// DynamicsMemory::recompute, memory flat in N: nothing but the tile's current q, k is kept. Per
// half-step: u; then per element the undo, E = exp(h s), dtau += dx (x E s + t) (shared atomics),
// G = [dx x E h (1 - s^2/4) | dx h] [R, 2d], dx *= E; then zbar = (G [S | T]) * (1 - u^2) [R, m];
// then the parameter gradients (dS, dT += G^T u; dA += zbar^T c; ds0, dt0, da: column sums) into
// the block's own float32 slice of a global scratch buffer (each element owned by one thread: no
// atomics), and dc += zbar A. At the end each block adds its slice to dparams with one atomicAdd
// per element, and dtau * sigmoid(rho) goes to drho with one atomicAdd per pair. Float atomics
// make dparams and drho not bitwise reproducible from run to run (the forward, dq and dk are).
//
// FLOPs per pair and half-step: forward 2 m d (u) + 4 m d (s, t); backward recompute 6 m d,
// again 6 m d, then 4 m d (zbar) + 6 m d (dS, dT, dA) + 2 m d (dc).
// This is a first, plain version: weights are read from global memory (L1 / L2 resident), not
// staged in shared memory, and no register tiling; it has not been timed on a GPU.
// Limits: 1 <= d <= 128, 1 <= m <= 128 (checked by DeviceDynamics<Affine<N>>::validate below).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

#include <coupledqk/integrators/affine.hpp>

#include "dynamics.cuh"

namespace coupledqk::cuda {
namespace affine_detail {

constexpr int kThreads = 256;
constexpr int kMaxRows = 32;
constexpr Index kSharedFloats = 48 * 1024 / 4;

/// Float offsets of one conditioner's tensors from its start; `size` floats in all.
struct Conditioner {
  Index A, a, S, s, T, t, size;
};
__host__ __device__ inline Conditioner conditioner_offsets(Index d, Index m) {
  Conditioner c{};
  c.A = 0;
  c.a = m * d;
  c.S = c.a + m;
  c.s = c.S + d * m;
  c.T = c.s + d;
  c.t = c.T + d * m;
  c.size = c.t + d;
  return c;
}

/// Shared floats of a tile of R rows: forward q, k [R, d], h [R], u [R, m]; backward also dq, dk,
/// G [R, 2d], zbar [R, m], dtau [R].
inline Index shared_floats(int rows, Index d, Index m, bool backward) {
  const Index R = rows;
  return backward ? R * (6 * d + 2 * m + 2) : R * (2 * d + m + 1);
}

inline int tile_rows(Index d, Index m) {
  int R = kMaxRows;
  while (R > 1 && shared_floats(R, d, m, true) > kSharedFloats) R /= 2;
  return R;
}

template <class T>
struct Args {
  Index pairs, heads;
  int d, m, steps, rows;
  const float* params;
  const float* rho;
  const T* q_in;
  const T* k_in;
  T* q_out;    // forward only
  T* k_out;
  float* dq;   // backward only
  float* dk;
  float* dparams;
  float* drho;
  float* scratch;  // [gridDim.x, 2 * conditioner size]: each block's gradient accumulator
};

__device__ inline float softplus_f(float x) { return x > 0.f ? x + log1pf(expf(-x)) : log1pf(expf(x)); }
__device__ inline float sigmoid_f(float x) { return 1.f / (1.f + expf(-x)); }

/// Loads rows [r0, r0 + R) of q, k (zeros past P) and their sub-step h (0 past P).
template <class T>
__device__ void load_tile(const Args<T>& a, Index r0, float* q, float* k, float* h) {
  const int R = a.rows, d = a.d;
  for (int e = threadIdx.x; e < R * d; e += kThreads) {
    const Index r = r0 + e / d;
    const bool in = r < a.pairs;
    q[e] = in ? to_float(a.q_in[r * d + e % d]) : 0.f;
    k[e] = in ? to_float(a.k_in[r * d + e % d]) : 0.f;
  }
  for (int r = threadIdx.x; r < R; r += kThreads)
    h[r] = r0 + r < a.pairs ? softplus_f(a.rho[(r0 + r) % a.heads]) / static_cast<float>(a.steps) : 0.f;
}

/// u = tanh(c A^T + a) for the tile. Ends with a barrier.
__device__ inline void hidden(const float* p, const Conditioner& o, int R, int d, int m, const float* c, float* u) {
  for (int e = threadIdx.x; e < R * m; e += kThreads) {
    const int r = e / m, j = e % m;
    const float* A = p + o.A + j * d;
    const float* x = c + r * d;
    float z = p[o.a + j];
    for (int i = 0; i < d; ++i) z += x[i] * A[i];
    u[e] = tanhf(z);
  }
  __syncthreads();
}

/// s (soft-clamped) and t of element (r, i) from the tile's u.
__device__ inline void scale_shift(const float* p, const Conditioner& o, int m, const float* u_row, int i, float& s,
                                   float& t) {
  const float* S = p + o.S + i * m;
  const float* Tm = p + o.T + i * m;
  float sp = p[o.s + i], tt = p[o.t + i];
  for (int j = 0; j < m; ++j) {
    sp += u_row[j] * S[j];
    tt += u_row[j] * Tm[j];
  }
  s = 2.f * tanhf(0.5f * sp);
  t = tt;
}

/// x <- x exp(h s(c)) + h t(c) for the tile. Ends with a barrier.
__device__ inline void update(const float* p, const Conditioner& o, int R, int d, int m, const float* c, float* x,
                              const float* h, float* u) {
  hidden(p, o, R, d, m, c, u);
  for (int e = threadIdx.x; e < R * d; e += kThreads) {
    const int r = e / d;
    float s, t;
    scale_shift(p, o, m, u + r * m, e % d, s, t);
    x[e] = x[e] * expf(h[r] * s) + h[r] * t;
  }
  __syncthreads();
}

template <class T>
__global__ void __launch_bounds__(kThreads) affine_forward_kernel(const Args<T> a) {
  COUPLEDQK_DYNAMIC_SHARED(16, float4, affine_smem);
  float* const sm = reinterpret_cast<float*>(affine_smem);
  const int R = a.rows, d = a.d, m = a.m;
  float* const q = sm;
  float* const k = q + R * d;
  float* const h = k + R * d;
  float* const u = h + R;
  const Conditioner o = conditioner_offsets(d, m);
  const float* const pk = a.params;
  const float* const pq = a.params + o.size;
  const Index tiles = (a.pairs + R - 1) / R;
  for (Index tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const Index r0 = tile * R;
    load_tile(a, r0, q, k, h);
    __syncthreads();
    for (int step = 0; step < a.steps; ++step) {
      update(pk, o, R, d, m, q, k, h, u);  // the key update reads q
      update(pq, o, R, d, m, k, q, h, u);  // the query update reads the updated k
    }
    for (int e = threadIdx.x; e < R * d; e += kThreads) {
      const Index r = r0 + e / d;
      if (r < a.pairs) {
        a.q_out[r * d + e % d] = from_float<T>(q[e]);
        a.k_out[r * d + e % d] = from_float<T>(k[e]);
      }
    }
    __syncthreads();
  }
}

/// Backward of one update x_out = x exp(h s(c)) + h t(c), given x_out in `x` (undone in place to x),
/// c, and dx = the cotangent of x_out (replaced by that of x). dc (+=); the conditioner's gradient
/// (+=) into its slice g of the block's accumulator; dtau (+=). Ends with a barrier.
__device__ inline void update_vjp(const float* p, const Conditioner& o, int R, int d, int m, const float* c, float* x,
                                  const float* h, float* dx, float* dc, float* g, float* dtau, float* u, float* G,
                                  float* zbar) {
  hidden(p, o, R, d, m, c, u);
  for (int e = threadIdx.x; e < R * d; e += kThreads) {
    const int r = e / d, i = e % d;
    float s, t;
    scale_shift(p, o, m, u + r * m, i, s, t);
    const float hr = h[r];
    const float xi = (x[e] - hr * t) * expf(-hr * s);  // the closed-form inverse
    const float E = expf(hr * s);
    const float gx = dx[e];
    x[e] = xi;
    atomicAdd(dtau + r, gx * (xi * E * s + t));  // d x_out / d h
    G[r * 2 * d + i] = gx * xi * E * hr * (1.f - 0.25f * s * s);
    G[r * 2 * d + d + i] = gx * hr;
    dx[e] = gx * E;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < R * m; e += kThreads) {
    const int r = e / m, j = e % m;
    const float* Gr = G + r * 2 * d;
    float ub = 0.f;
    for (int i = 0; i < d; ++i) ub += Gr[i] * p[o.S + i * m + j] + Gr[d + i] * p[o.T + i * m + j];
    zbar[e] = ub * (1.f - u[e] * u[e]);
  }
  __syncthreads();
  // parameter gradients: each element by one thread of this block
  for (int e = threadIdx.x; e < d * m; e += kThreads) {
    const int i = e / m, j = e % m;  // S, T [d, m]
    float gs = 0.f, gt = 0.f;
    for (int r = 0; r < R; ++r) {
      gs += G[r * 2 * d + i] * u[r * m + j];
      gt += G[r * 2 * d + d + i] * u[r * m + j];
    }
    g[o.S + e] += gs;
    g[o.T + e] += gt;
  }
  for (int e = threadIdx.x; e < m * d; e += kThreads) {
    const int j = e / d, i = e % d;  // A [m, d]
    float ga = 0.f;
    for (int r = 0; r < R; ++r) ga += zbar[r * m + j] * c[r * d + i];
    g[o.A + e] += ga;
  }
  for (int i = threadIdx.x; i < d; i += kThreads) {
    float gs = 0.f, gt = 0.f;
    for (int r = 0; r < R; ++r) {
      gs += G[r * 2 * d + i];
      gt += G[r * 2 * d + d + i];
    }
    g[o.s + i] += gs;
    g[o.t + i] += gt;
  }
  for (int j = threadIdx.x; j < m; j += kThreads) {
    float ga = 0.f;
    for (int r = 0; r < R; ++r) ga += zbar[r * m + j];
    g[o.a + j] += ga;
  }
  for (int e = threadIdx.x; e < R * d; e += kThreads) {
    const int r = e / d, i = e % d;
    float acc = 0.f;
    for (int j = 0; j < m; ++j) acc += zbar[r * m + j] * p[o.A + j * d + i];
    dc[e] += acc;
  }
  __syncthreads();
}

template <class T>
__global__ void __launch_bounds__(kThreads) affine_backward_kernel(const Args<T> a) {
  COUPLEDQK_DYNAMIC_SHARED(16, float4, affine_smem);
  float* const sm = reinterpret_cast<float*>(affine_smem);
  const int R = a.rows, d = a.d, m = a.m;
  float* const q = sm;
  float* const k = q + R * d;
  float* const dq = k + R * d;
  float* const dk = dq + R * d;
  float* const G = dk + R * d;
  float* const u = G + 2 * R * d;
  float* const zbar = u + R * m;
  float* const h = zbar + R * m;
  float* const dtau = h + R;
  const Conditioner o = conditioner_offsets(d, m);
  const float* const pk = a.params;
  const float* const pq = a.params + o.size;
  float* const gk = a.scratch + static_cast<Index>(blockIdx.x) * 2 * o.size;
  float* const gq = gk + o.size;
  for (Index e = threadIdx.x; e < 2 * o.size; e += kThreads) gk[e] = 0.f;
  const Index tiles = (a.pairs + R - 1) / R;
  for (Index tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const Index r0 = tile * R;
    load_tile(a, r0, q, k, h);
    for (int e = threadIdx.x; e < R * d; e += kThreads) {
      const Index r = r0 + e / d;
      const bool in = r < a.pairs;
      dq[e] = in ? a.dq[r * d + e % d] : 0.f;
      dk[e] = in ? a.dk[r * d + e % d] : 0.f;
    }
    for (int r = threadIdx.x; r < R; r += kThreads) dtau[r] = 0.f;
    __syncthreads();
    for (int step = 0; step < a.steps; ++step) {  // recompute (q_out, k_out)
      update(pk, o, R, d, m, q, k, h, u);
      update(pq, o, R, d, m, k, q, h, u);
    }
    for (int step = a.steps - 1; step >= 0; --step) {
      update_vjp(pq, o, R, d, m, k, q, h, dq, dk, gq, dtau, u, G, zbar);  // q_{s+1} from q_s and k_{s+1}
      update_vjp(pk, o, R, d, m, q, k, h, dk, dq, gk, dtau, u, G, zbar);  // k_{s+1} from k_s and q_s
    }
    for (int e = threadIdx.x; e < R * d; e += kThreads) {
      const Index r = r0 + e / d;
      if (r < a.pairs) {
        a.dq[r * d + e % d] = dq[e];
        a.dk[r * d + e % d] = dk[e];
      }
    }
    for (int r = threadIdx.x; r < R; r += kThreads) {
      const Index pair = r0 + r;
      if (pair < a.pairs) {
        const Index head = pair % a.heads;
        atomicAdd(a.drho + head, dtau[r] * sigmoid_f(a.rho[head]) / static_cast<float>(a.steps));
      }
    }
    __syncthreads();
  }
  for (Index e = threadIdx.x; e < 2 * o.size; e += kThreads) atomicAdd(a.dparams + e, gk[e]);
}

inline unsigned blocks_for(Index tiles) {
  int dev = 0, sms = 1;
  COUPLEDQK_CUDA_CHECK(cudaGetDevice(&dev));
  COUPLEDQK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const Index resident = Index(4) * std::max(sms, 1);  // 4 blocks of <= 48 KB per SM
  return static_cast<unsigned>(std::max<Index>(1, std::min(tiles, resident)));
}

template <class T>
void forward(const DynamicsDims& dims, int steps, const float* params, const float* rho, const T* q_in, const T* k_in,
             T* q_out, T* k_out, cudaStream_t stream) {
  const int d = static_cast<int>(dims.head_dim), m = static_cast<int>(dims.hidden);
  const int R = tile_rows(d, m);
  const Index tiles = (dims.pairs + R - 1) / R;
  const Args<T> a{dims.pairs, dims.heads, d, m, steps, R, params, rho, q_in, k_in, q_out, k_out,
                  nullptr,    nullptr,    nullptr, nullptr, nullptr};
  const std::size_t bytes = static_cast<std::size_t>(shared_floats(R, d, m, false)) * sizeof(float);
  launch(affine_forward_kernel<T>, blocks_for(tiles), kThreads, bytes, stream, a);
}

// dq, dk: the dtau of a pair is d loss / d tau = (1 / N) sum over updates of dx . (x E s + t); the
// kernel sums dx . (x E s + t) and applies 1 / N with sigmoid(rho) when adding to drho.
template <class T>
void backward(const DynamicsDims& dims, int steps, const float* params, const float* rho, const T* q_in, const T* k_in,
              float* dq, float* dk, float* dparams, float* drho, cudaStream_t stream) {
  const int d = static_cast<int>(dims.head_dim), m = static_cast<int>(dims.hidden);
  const int R = tile_rows(d, m);
  const Index tiles = (dims.pairs + R - 1) / R;
  const unsigned blocks = blocks_for(tiles);
  const Conditioner o = conditioner_offsets(d, m);
  const dynamics_detail::Scratch scratch(static_cast<std::size_t>(2 * o.size) * blocks * sizeof(float), stream,
                                         dynamics_detail::device_limits().pools != 0);
  const Args<T> a{dims.pairs, dims.heads, d,  m,  steps,   R,    params,       rho, q_in,
                  k_in,       nullptr,    nullptr, dq, dk, dparams, drho, scratch.get()};
  const std::size_t bytes = static_cast<std::size_t>(shared_floats(R, d, m, true)) * sizeof(float);
  launch(affine_backward_kernel<T>, blocks, kThreads, bytes, stream, a);
}

}  // namespace affine_detail

/// Affine<N> and the policies derived from it: the kernels above.
template <class I>
struct DeviceDynamics<I, std::enable_if_t<dynamics_detail::derives_from_steps<::coupledqk::Affine, I>()>> {
  static constexpr bool supported = true;

  static void validate(const DynamicsDims& dims, const char* fn) {
    dynamics_detail::validate_head_dim(dims, fn, dynamics_detail::kMaxDim);
    dynamics_detail::validate_hidden(dims, fn);
  }

  template <class T>
  static void forward(const DynamicsDims& dims, const float* params, const float* rho, const T* q_in, const T* k_in,
                      T* q_out, T* k_out, cudaStream_t stream) {
    affine_detail::forward<T>(dims, I::steps, params, rho, q_in, k_in, q_out, k_out, stream);
  }

  template <class T>
  static void backward(const DynamicsDims& dims, const float* params, const float* rho, const T* q_in, const T* k_in,
                       float* dq, float* dk, float* dparams, float* drho, cudaStream_t stream) {
    affine_detail::backward<T>(dims, I::steps, params, rho, q_in, k_in, dq, dk, dparams, drho, stream);
  }
};

}  // namespace coupledqk::cuda
