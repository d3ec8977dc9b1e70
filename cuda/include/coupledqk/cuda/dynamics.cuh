// Fused coupled query-key dynamics on the GPU: the device contract of an integrator policy, and the
// kernels of the families lowered to tanh ops, forward and backward.
//
// The same maths as the CPU policies (include/coupledqk/integrators/*.hpp, method spec sections
// 2-3), applied to P (query, key) pairs, each a row of two [P, d] matrices q and k; pair r belongs to
// head r % H and is integrated for tau_h = softplus(rho_h) in N sub-steps of size h = tau_h / N.
//
//     dynamics_forward<I, T>(dims, params, rho, q_in, k_in, q_out, k_out, stream)
//     dynamics_backward<I, T>(dims, params, rho, q_in, k_in, dq, dk, dparams, drho, stream)
//
// ---- Families: DeviceDynamics<I> -------------------------------------------------------------
// What a policy runs on the device is the specialisation DeviceDynamics<I> of its family (as
// DeviceScoring<Sc> is a scoring's, scoring.cuh); the primary template means "no device kernels"
// (supported = false; has_device_dynamics<I>, variant_supported and make_gpt read it). Each
// specialisation is selected by a trait of the CPU policy, never by its name (the second template
// parameter: `template <class I> struct DeviceDynamics<I, std::enable_if_t<trait<I>>>`), and holds
//
//     static constexpr bool supported;                            // within the kernels' limits
//     static void validate(const DynamicsDims&, const char* fn);  // d, m; throws invalid_argument
//     template <class T> static void forward(dims, params, rho, q_in, k_in, q_out, k_out, stream);
//     template <class T> static void backward(dims, params, rho, q_in, k_in, dq, dk, dparams, drho,
//                                             stream);
//     template <class T> static LaunchPlan launch_plan(dims, backward);   // optional (reports)
//
// with the arguments of dynamics_forward / dynamics_backward, already checked (P >= 1, H >= 1, no
// null pointer; params and rho only for policies with dynamics). The built-in families:
//   Identity           any policy without dynamics (has_dynamics false)      this file
//   splitting          a `plan` member (SymplecticSplitting: Leapfrog<N>,    this file (tanh ops)
//                      examples/forest_ruth.hpp, any scheme) and `hamiltonian` = TanhHamiltonian
//   Euler              HamiltonianEuler<N, TanhHamiltonian> and derived      this file (tanh ops)
//   Uncoupled          Uncoupled<N> and derived                              this file (tanh ops)
//   Affine             Affine<N> and derived                                 affine.cuh (own kernels)
// A family whose maths is a sequence of tanh ops (below) needs only its op list, its parameter
// offsets and its validation (derive from dynamics_detail::TanhOpsDynamics); one with other maths
// brings its kernels in its own header, as affine.cuh does (docs/design.md, "Adding an integrator
// family's GPU kernels").
//
// ---- The maths of the tanh-op families ----------------------------------------------------------
// Each of these policies is a sequence of "ops" built from one nonlinearity (dynamics/tanh_map.hpp),
//
//     y_f(x) = (s_f * tanh(x A_f^T + beta_f)) B_f          x: [d]   A_f, B_f: [r, d]   s_f, beta_f: [r]
//     op (f, c):   moved += c h y_f(arg)                     c: signed coefficient in units of h
//
// with two "fields" f: f = 0 acts on q (arg = q), f = 1 acts on k (arg = k).
//   * SymplecticSplitting<Scheme, N> (Leapfrog<N>, examples/forest_ruth.hpp, any scheme): one op
//     per stage of the policy's merged `plan` (N steps, adjacent stages of a kind merged):
//         kick  (coef w): f = 0, A = B = W, beta = b, s = a: k <- k - w h grad V(q)   (c = -w)
//         drift (coef w): f = 1, A = B = U, beta = e, s = c: q <- q + w h grad T(k)   (c = +w)
//     r = m. Stages run one after the other (a "group" of one op).
//   * Euler<N>: per step the group {drift c = +1, kick c = -1}, both reading the step's input
//     (simultaneous: q, k <- q + h grad T(k), k - h grad V(q)).
//   * Uncoupled<N>: per step the group {f = 0: q <- q + h Pq2 tanh(Pq1 q + pq),
//     f = 1: k <- k + h Pk2 tanh(Pk1 k + pk)}: A = P*1, B = P*2^T, beta = p*, s = 1, r = m / 2,
//     moved = arg (no coupling).
//   * Identity: q' = q, k' = k (forward copies when out != in; backward does nothing).
//   * Affine<N> (the invertible affine coupling) is not a sum of tanh ops: its own kernels live in
//     affine.cuh (included at the end of this file) and are reached through the same two functions.
// The step count and the op list (field bit + float coefficient per op, at most 64 ops) are RUNTIME
// kernel arguments; kernels are templated only on the family's OpForm (tied weights, ops per group,
// which state a field moves: three forms for splitting / Euler / Uncoupled) and the storage type T,
// so the whole policy registry instantiates at most 6 forward + 6 backward kernels.
//
// Backward of one op (cf. splitting_stage_vjp, Euler::backward, Uncoupled::branch_vjp), with
// x = the op's argument at its input, dm = the cotangent of the moved state (the op's output),
// act = tanh(x A^T + beta), V = dm B^T, all per row:
//     dtau   += (c / N) sum_j V_j s_j act_j                   (= (c / N) dm . y(x))
//     L_j     = c h s_j act_j,  zbar_j = c h V_j s_j (1 - act_j^2)
//     dB     += L^T dm,  dA += zbar^T x                        (one product when A = B is tied)
//     ds_j   += sum_rows c h V_j act_j,  dbeta_j += sum_rows zbar_j
//     darg   += zbar A                                         (after every op of the group has
//                                                              read the group's output cotangents)
//     drho_h += sum_{rows of head h} dtau * sigmoid(rho_h)     (tau = softplus(rho))
//
// ---- Memory layout --------------------------------------------------------------------------
// q_in, k_in, q_out, k_out: [P, d] row-major, storage T (float or bf16; bf16 is converted to float
// on load and rounded on store, every computation is float32). dq, dk: float32 [P, d].
// params / dparams: float32, the policy's parameter tensors concatenated in visit() order, each
// row-major (Hamiltonian: W[m,d], U[m,d], b[m], a[m], e[m], c[m]; Uncoupled: Pq1[m/2,d],
// Pk1[m/2,d], pq[m/2], pk[m/2], Pq2[d,m/2], Pk2[d,m/2]). rho, drho: float32 [H].
//
// ---- Tiling ---------------------------------------------------------------------------------
// 256 threads per block; a persistent grid (min(tiles, resident blocks per SM x SMs)) loops over
// tiles of R consecutive pairs (R = 256 / 128 / 64 / 32 / 16 / 8: the largest with R * max(d, r)
// <= 4096 that fits in shared memory; 64 for d = m = 64). Per block, once: the dynamics' weights,
// converted to a float layout (A_f, B_f [r4, ldp] with ldp / 4 odd against bank conflicts, zero
// padding to multiples of 4, B = P2^T for Uncoupled), the biases and scales. Per tile: q, k (and in
// backward dq, dk) as float [R, d4] in shared memory; one op is two small products, each thread
// owning a 4 x 4 register micro-tile with float4 shared loads and float accumulation:
//     activation pass   U = c h s * tanh(X A^T + beta)     [R, r]   (then __syncthreads)
//     propagate pass    moved += U B                        [R, d]   (then __syncthreads)
// The ops of a group read their arguments in the first pass and write distinct states in the
// second, so a group of two costs the same two barriers. q' and k' are written once per tile.
// Rows past P in the last tile are zero with h = 0, so they move nothing and contribute nothing.
//
// Backward recomputes the tile's forward from (q_in, k_in) -- no trace is stored between the two
// calls -- keeping the argument of every op ([ops, R, d4] floats; ops = 2N+1 for Leapfrog<N>, 6N+1
// for Forest-Ruth, 2N for Euler / Uncoupled) in shared memory when it fits, otherwise in a per-block
// slice of a global scratch buffer (stream-ordered cudaMallocAsync / cudaFreeAsync on `stream`;
// cudaMalloc + synchronise + cudaFree where the device has no memory pools). Then it walks the ops
// backwards: an activation pass fused with V = dm B^T (both products share the loads; the element-
// wise part and the dtau / ds / dbeta reductions happen in registers, with shared-memory atomics
// across threads), an outer-product pass dA, dB += [R x r]^T x [R x d] (a block-level product into
// the block's accumulator, no per-element global atomics), and darg += zbar A.
// Parameter gradients accumulate per block in shared memory when they fit (d = m = 64: yes;
// d = m = 128: no, then in the block's slice of the scratch buffer, read-modify-written by the
// owning thread only) and are added to dparams with one atomicAdd per element per block at the
// end. dtau is reduced per block per head in shared memory (H <= 1024; otherwise one global
// atomicAdd per pair) and added to drho. Float atomics make dparams and drho not bitwise
// reproducible from run to run (the forward, dq and dk are); that is accepted on the GPU.
//
// ---- FLOPs per pair (r = m for the coupled policies, m / 2 for Uncoupled) --------------------
// forward: 4 r d per op (+ r tanh); Leapfrog<N>: 4 m d (2N + 1); Euler<N>: 8 m d N;
// Uncoupled<N>: 4 m d N. Backward: 4 r d (ops - 1) to recompute + 10 r d per op.
//
// Sizes (sm_90: 232,448 B opt-in shared memory per block): d = m = 64: forward R = 64, 85,504 B,
// two blocks per SM; backward R = 64 with the gradients in shared memory (and the trajectory for
// Leapfrog<1>: 217,888 B). d = m = 128: forward R = 32, 186,752 B; backward R = 16 with the
// gradients in scratch (Leapfrog<1>: 213,392 B).
// Registers (ptxas, CUDA 13): forward 114-128 (capped at 128 by __launch_bounds__(256, 2)),
// backward 160-168; no spills, no stack frame.
//
// Limits: 1 <= d <= 128, 1 <= m <= 128 (even for Uncoupled), at most 64 ops (Leapfrog N <= 31,
// Forest-Ruth N <= 10, Euler / Uncoupled N <= 32; DeviceDynamics<I>::supported is false beyond). Identity
// launches nothing and accepts any d >= 1. Shapes outside the limits throw coupledqk::invalid_argument
// naming the value and the accepted range; CUDA failures throw cuda_error.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <coupledqk/integrators/affine.hpp>
#include <coupledqk/integrators/euler.hpp>
#include <coupledqk/integrators/identity.hpp>
#include <coupledqk/integrators/splitting.hpp>
#include <coupledqk/integrators/uncoupled.hpp>

#include "runtime.cuh"

namespace coupledqk::cuda {

/// P pairs, H heads, head size d, hidden width m; pair r belongs to head r % H.
struct DynamicsDims {
  Index pairs;
  Index heads;
  Index head_dim;
  Index hidden;
};

/// The device kernels of integrator policy I: the primary template, "none". Families specialise it
/// (see the header comment); `Enable` is the specialisations' selector (void when selected).
template <class I, class Enable = void>
struct DeviceDynamics {
  static constexpr bool supported = false;
};

namespace dynamics_detail {

constexpr int kThreads = 256;
constexpr int kMaxOps = 64;
constexpr int kMaxDim = 128;
constexpr int kMaxSharedHeads = 1024;

/// The compile-time shape of a tanh-op family's program, the kernels' only template parameter
/// besides T:
///   Tied:     B = A with a learned scale s (the gradient fields of a Hamiltonian); false: B = P2^T,
///             s = 1 (Uncoupled's MLP branches)
///   Group:    ops per group: 1 (each op reads the previous one's output: splitting) or 2 (both ops
///             read the group's input: Euler's simultaneous pair, Uncoupled's two branches)
///   OwnState: field f moves state f (no coupling); false: it moves the other state, 1 - f
template <bool Tied, int Group, bool OwnState>
struct OpForm {
  static_assert(Group == 1 || Group == 2, "OpForm: a group holds one or two ops");
  static constexpr bool tied = Tied;
  static constexpr int group = Group;
  static constexpr bool own_state = OwnState;
};

/// The runtime op list: op o acts with field (field_bits >> o) & 1 and coefficient coef[o].
struct OpList {
  int count = 0;
  int steps = 1;
  unsigned long long field_bits = 0;
  float coef[kMaxOps] = {};
};

/// Offsets of each field's tensors in the flat parameter array (-1: absent).
struct ParamOffsets {
  Index A[2], B[2], bias[2], scale[2];
};

/// What one call of a tanh-op family runs: its op list, the width r of each field's hidden layer and
/// where each field's tensors are in params.
struct OpProgram {
  OpList ops;
  Index r = 0;
  ParamOffsets po{};
};

/// TanhHamiltonian's parameters (visit order W [m, d], U [m, d], b, a, e, c [m]) as the two tied
/// fields: f = 0 (A = B = W, beta = b, s = a: grad V), f = 1 (A = B = U, beta = e, s = c: grad T).
inline ParamOffsets tanh_hamiltonian_offsets(Index d, Index m) {
  ParamOffsets p{};
  p.A[0] = p.B[0] = 0;      // W [m, d]
  p.A[1] = p.B[1] = m * d;  // U
  p.bias[0] = 2 * m * d;    // b
  p.scale[0] = 2 * m * d + m;       // a
  p.bias[1] = 2 * m * d + 2 * m;    // e
  p.scale[1] = 2 * m * d + 3 * m;   // c
  return p;
}

/// Where everything lives. Shared-memory offsets are in floats from the start of the dynamic shared
/// memory, each region a multiple of 4 floats (16 bytes); -1 means absent.
struct Layout {
  int d, r, dp, rp, ldp;  // d, r and their multiples of 4; ldp: row stride of A_f, B_f (ldp / 4 odd)
  int rows;               // R: pairs per tile
  int ops, group;         // op count; ops per group (1 splitting, 2 Euler / Uncoupled)
  int A[2], B[2], bias[2], scale[2], coef;
  int q, k, h, buf[3];
  // backward only
  int dq, dk, x, dtau, drho, dbias[2], dscale[2];
  Index gmat[4];  // dA_0, dA_1, dB_0, dB_1 [rp, dp] (dB = dA when tied): shared, or in the block's slice
  Index traj;     // [ops, R, dp]: shared, or in the block's slice
  int grads_shared, traj_shared;
  Index slice;   // scratch floats per block
  Index floats;  // dynamic shared-memory floats
};

inline int round4(Index x) { return static_cast<int>((x + 3) / 4 * 4); }

template <class Form>
Layout make_layout(bool backward, const DynamicsDims& dims, Index r, int ops, int rows, bool grads_shared,
                   bool traj_shared) {
  constexpr bool tied = Form::tied;
  Layout L{};
  L.d = static_cast<int>(dims.head_dim);
  L.r = static_cast<int>(r);
  L.dp = round4(L.d);
  L.rp = round4(L.r);
  L.ldp = (L.dp / 4) % 2 == 1 ? L.dp : L.dp + 4;
  L.rows = rows;
  L.ops = ops;
  L.group = Form::group;
  Index off = 0;
  auto take = [&](Index n) {
    const Index o = off;
    off += round4(n);
    return static_cast<int>(o);
  };
  for (int f = 0; f < 2; ++f) {
    L.A[f] = take(Index(L.rp) * L.ldp);
    L.B[f] = tied ? L.A[f] : take(Index(L.rp) * L.ldp);
  }
  for (int f = 0; f < 2; ++f) {
    L.bias[f] = take(L.rp);
    L.scale[f] = take(L.rp);
  }
  L.coef = take(kMaxOps);
  L.q = take(Index(rows) * L.dp);
  L.k = take(Index(rows) * L.dp);
  L.h = take(rows);
  const int nbuf = backward ? 1 + L.group : L.group;
  for (int i = 0; i < 3; ++i) L.buf[i] = i < nbuf ? take(Index(rows) * L.rp) : -1;
  L.dq = L.dk = L.x = L.dtau = L.drho = -1;
  L.dbias[0] = L.dbias[1] = L.dscale[0] = L.dscale[1] = -1;
  L.gmat[0] = L.gmat[1] = L.gmat[2] = L.gmat[3] = -1;
  L.traj = -1;
  L.grads_shared = L.traj_shared = 0;
  L.slice = 0;
  if (backward) {
    L.dq = take(Index(rows) * L.dp);
    L.dk = take(Index(rows) * L.dp);
    L.dtau = take(rows);
    L.drho = dims.heads <= kMaxSharedHeads ? take(dims.heads) : -1;
    for (int f = 0; f < 2; ++f) {
      L.dbias[f] = take(L.rp);
      L.dscale[f] = take(L.rp);
    }
    L.grads_shared = grads_shared ? 1 : 0;
    L.traj_shared = traj_shared ? 1 : 0;
    Index slice = 0;
    const Index mat = Index(L.rp) * L.dp;
    for (int i = 0; i < (tied ? 2 : 4); ++i) {
      if (grads_shared) {
        L.gmat[i] = take(mat);
      } else {
        L.gmat[i] = slice;
        slice += mat;
      }
    }
    if (tied) {
      L.gmat[2] = L.gmat[0];
      L.gmat[3] = L.gmat[1];
    }
    const Index traj = Index(ops) * rows * L.dp;
    if (traj_shared) {
      L.traj = take(traj);
    } else {
      L.traj = slice;
      slice += traj;
      L.x = take(Index(rows) * L.dp);
    }
    L.slice = slice;
  }
  L.floats = off;
  return L;
}

/// Largest useful tile: enough 4 x 4 micro-tiles for 256 threads in the widest product.
inline int target_rows(const DynamicsDims& dims, Index r) {
  const Index widest = std::max<Index>(round4(dims.head_dim), round4(r));
  int R = 256;
  while (R > 8 && R * widest > 4096) R /= 2;
  return R;
}

// ---- device helpers ---------------------------------------------------------------------------

__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ void add4(float* p, const float (&v)[4]) {
  float4 c = *reinterpret_cast<float4*>(p);
  c.x += v[0];
  c.y += v[1];
  c.z += v[2];
  c.w += v[3];
  *reinterpret_cast<float4*>(p) = c;
}
__device__ __forceinline__ float dot4(float acc, const float4& a, const float4& b) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}
__device__ __forceinline__ void axpy4(float (&acc)[4], float s, const float4& p) {
  acc[0] = fmaf(s, p.x, acc[0]);
  acc[1] = fmaf(s, p.y, acc[1]);
  acc[2] = fmaf(s, p.z, acc[2]);
  acc[3] = fmaf(s, p.w, acc[3]);
}
template <class P>
__device__ __forceinline__ P sel(int f, P p0, P p1) {
  return f ? p1 : p0;
}
__device__ __forceinline__ float softplus_f(float x) {
  return x > 0.f ? x + log1pf(expf(-x)) : log1pf(expf(x));
}
__device__ __forceinline__ float sigmoid_f(float x) { return 1.f / (1.f + expf(-x)); }

/// dst[i, k] (i < rows, k < dp, row stride dp) = src row r0 + i, column k (0 outside valid x d).
template <class T>
__device__ __forceinline__ void load_rows(float* dst, const T* src, Index r0, int valid, int rows, int d, int dp) {
  const int n = rows * dp;
  for (int e = threadIdx.x; e < n; e += kThreads) {
    const int i = e / dp, k = e - i * dp;
    dst[e] = (i < valid && k < d) ? to_float(src[(r0 + i) * d + k]) : 0.f;
  }
}

/// dst rows r0 .. r0 + valid - 1 = src[i, k < d] (row stride dp), rounded to T.
template <class T>
__device__ __forceinline__ void store_rows(T* dst, const float* src, Index r0, int valid, int d, int dp) {
  const int n = valid * d;
  T* out = dst + r0 * d;
  for (int e = threadIdx.x; e < n; e += kThreads) {
    const int i = e / d, k = e - i * d;
    out[e] = from_float<T>(src[i * dp + k]);
  }
}

/// h per row: softplus(rho[head]) / N for the valid rows, 0 past them.
__device__ __forceinline__ void load_steps(float* h, const float* rho, Index heads, Index r0, int valid, int rows,
                                           int steps) {
  for (int i = threadIdx.x; i < rows; i += kThreads)
    h[i] = i < valid ? softplus_f(rho[(r0 + i) % heads]) / static_cast<float>(steps) : 0.f;
}

__device__ __forceinline__ void copy_floats(float* dst, const float* src, int n) {  // n % 4 == 0
  for (int e = 4 * threadIdx.x; e < n; e += 4 * kThreads)
    *reinterpret_cast<float4*>(dst + e) = *reinterpret_cast<const float4*>(src + e);
}

__device__ __forceinline__ void zero_floats(float* dst, Index n) {
  for (Index e = threadIdx.x; e < n; e += kThreads) dst[e] = 0.f;
}

/// One field's tensors into shared memory: A (and B unless tied) [rp, ldp], bias, scale [rp].
template <bool Tied>
__device__ __forceinline__ void load_field(float* sA, float* sB, float* sbias, float* sscale, const float* params,
                                           Index oA, Index oB, Index obias, Index oscale, int r, int d, int rp,
                                           int ldp) {
  const int n = rp * ldp;
  for (int e = threadIdx.x; e < n; e += kThreads) {
    const int j = e / ldp, k = e - j * ldp;
    const bool in = j < r && k < d;
    sA[e] = in ? params[oA + Index(j) * d + k] : 0.f;
    if (!Tied) sB[e] = in ? params[oB + Index(k) * r + j] : 0.f;  // B = P2^T, P2 stored [d, r]
  }
  for (int j = threadIdx.x; j < rp; j += kThreads) {
    sbias[j] = j < r ? params[obias + j] : 0.f;
    sscale[j] = j < r ? (Tied ? params[oscale + j] : 1.f) : 0.f;
  }
}

template <bool Tied>
__device__ __forceinline__ void load_parameters(float* sm, const Layout& L, const ParamOffsets& po,
                                                const float* params) {
  load_field<Tied>(sm + L.A[0], sm + L.B[0], sm + L.bias[0], sm + L.scale[0], params, po.A[0], po.B[0],
                   po.bias[0], po.scale[0], L.r, L.d, L.rp, L.ldp);
  load_field<Tied>(sm + L.A[1], sm + L.B[1], sm + L.bias[1], sm + L.scale[1], params, po.A[1], po.B[1],
                   po.bias[1], po.scale[1], L.r, L.d, L.rp, L.ldp);
}

/// The op coefficients into shared memory (constant indices into the kernel parameter).
__device__ __forceinline__ void store_coefficients(float* dst, const OpList& ops) {
  if (threadIdx.x == 0) {
#pragma unroll
    for (int o = 0; o < kMaxOps; ++o) dst[o] = ops.coef[o];
  }
}

// ---- the three products (4 x 4 register micro-tiles, float4 shared loads) -----------------------

/// U[i, j] = c h[i] s[j] tanh(X[i, :] . A[j, :] + beta[j]).  X: [rows, dp]; A: [rp, ldp]; U: [rows, rp].
/// Thread micro-tile: rows 4ti..4ti+3, columns tj + {0,1,2,3} * (rp / 4) (A rows conflict-free).
__device__ __forceinline__ void activation_pass(const float* X, const float* A, const float* beta, const float* s,
                                                const float* h, float c, float* U, int rows, int dp, int rp,
                                                int ldp) {
  const int TJ = rp >> 2, tiles = (rows >> 2) * TJ, astep = TJ * ldp;
  for (int t = threadIdx.x; t < tiles; t += kThreads) {
    const int ti = t / TJ, tj = t - ti * TJ;
    const float* x = X + 4 * ti * dp;
    const float* a = A + tj * ldp;
    float acc[4][4] = {};
#pragma unroll 2
    for (int k = 0; k < dp; k += 4) {
      float4 xv[4], av[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) xv[i] = ld4(x + i * dp + k);
#pragma unroll
      for (int j = 0; j < 4; ++j) av[j] = ld4(a + j * astep + k);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = dot4(acc[i][j], xv[i], av[j]);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int col = tj + j * TJ;
      const float bj = beta[col], sj = s[col];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = 4 * ti + i;
        U[row * rp + col] = c * h[row] * sj * tanhf(acc[i][j] + bj);
      }
    }
  }
}

/// C[i, k] += sum_j U[i, j] P[j, k].  U: [rows, rp]; P: [rp, ldp]; C: [rows, dp].
__device__ __forceinline__ void propagate_pass(const float* U, const float* P, float* C, int rows, int dp, int rp,
                                               int ldp) {
  const int TK = dp >> 2, tiles = (rows >> 2) * TK;
  for (int t = threadIdx.x; t < tiles; t += kThreads) {
    const int ti = t / TK, tk = t - ti * TK;
    const float* u = U + 4 * ti * rp;
    const float* p = P + 4 * tk;
    float acc[4][4] = {};
#pragma unroll 2
    for (int j = 0; j < rp; j += 4) {
      float4 uv[4], pv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) uv[i] = ld4(u + i * rp + j);
#pragma unroll
      for (int l = 0; l < 4; ++l) pv[l] = ld4(p + (j + l) * ldp);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        axpy4(acc[i], uv[i].x, pv[0]);
        axpy4(acc[i], uv[i].y, pv[1]);
        axpy4(acc[i], uv[i].z, pv[2]);
        axpy4(acc[i], uv[i].w, pv[3]);
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) add4(C + (4 * ti + i) * dp + 4 * tk, acc[i]);
  }
}

/// G[j, k] += sum_i L1[i, j] D1[i, k] (+ sum_i L2[i, j] D2[i, k]).  L*: [rows, rp]; D*: [rows, dp];
/// G: [rp, dp] in shared or global memory (each element read-modified-written by one thread).
template <bool Two>
__device__ __forceinline__ void outer_pass(const float* L1, const float* D1, const float* L2, const float* D2,
                                           float* G, int rows, int dp, int rp) {
  const int TK = dp >> 2, tiles = (rp >> 2) * TK;
  for (int t = threadIdx.x; t < tiles; t += kThreads) {
    const int tj = t / TK, tk = t - tj * TK;
    const float* l1 = L1 + 4 * tj;
    const float* d1 = D1 + 4 * tk;
    const float* l2 = Two ? L2 + 4 * tj : nullptr;
    const float* d2 = Two ? D2 + 4 * tk : nullptr;
    float acc[4][4] = {};
#pragma unroll 4
    for (int i = 0; i < rows; ++i) {
      const float4 lv = ld4(l1 + i * rp), dv = ld4(d1 + i * dp);
      axpy4(acc[0], lv.x, dv);
      axpy4(acc[1], lv.y, dv);
      axpy4(acc[2], lv.z, dv);
      axpy4(acc[3], lv.w, dv);
      if constexpr (Two) {
        const float4 lw = ld4(l2 + i * rp), dw = ld4(d2 + i * dp);
        axpy4(acc[0], lw.x, dw);
        axpy4(acc[1], lw.y, dw);
        axpy4(acc[2], lw.z, dw);
        axpy4(acc[3], lw.w, dw);
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) add4(G + Index(4 * tj + j) * dp + 4 * tk, acc[j]);
  }
}

/// Backward activation pass of one op: Z = X A^T + beta, V = Dm B^T (same micro-tile), then per
/// element act = tanh(Z), Lb = c h s act, Zb = c h V s (1 - act^2), and the reductions
/// dtau[i] += (c / N) sum_j V s act, dbeta[j] += sum_i Zb, ds[j] += sum_i c h V act (when Tied).
template <bool Tied>
__device__ __forceinline__ void vjp_activation_pass(const float* X, const float* Dm, const float* A, const float* B,
                                                    const float* beta, const float* s, const float* h, float c,
                                                    float c_over_n, float* Lb, float* Zb, float* dtau,
                                                    float* dbeta, float* ds, int rows, int dp, int rp, int ldp) {
  const int TJ = rp >> 2, tiles = (rows >> 2) * TJ, astep = TJ * ldp;
  for (int t = threadIdx.x; t < tiles; t += kThreads) {
    const int ti = t / TJ, tj = t - ti * TJ;
    const float* x = X + 4 * ti * dp;
    const float* dm = Dm + 4 * ti * dp;
    const float* a = A + tj * ldp;
    const float* b = B + tj * ldp;
    float z[4][4] = {}, v[4][4] = {};
#pragma unroll 1
    for (int k = 0; k < dp; k += 4) {
      float4 xv[4], dv[4], av[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        xv[i] = ld4(x + i * dp + k);
        dv[i] = ld4(dm + i * dp + k);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) av[j] = ld4(a + j * astep + k);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) z[i][j] = dot4(z[i][j], xv[i], av[j]);
      if constexpr (!Tied) {
#pragma unroll
        for (int j = 0; j < 4; ++j) av[j] = ld4(b + j * astep + k);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) v[i][j] = dot4(v[i][j], dv[i], av[j]);
    }
    float tau_part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int col = tj + j * TJ;
      const float bj = beta[col], sj = s[col];
      float s_part = 0.f, b_part = 0.f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = 4 * ti + i;
        const float hc = c * h[row];
        const float act = tanhf(z[i][j] + bj);
        const float sa = sj * act;
        const float hv = hc * v[i][j];
        const float zb = hv * sj * (1.f - act * act);
        Lb[row * rp + col] = hc * sa;
        Zb[row * rp + col] = zb;
        tau_part[i] = fmaf(v[i][j], sa, tau_part[i]);
        s_part = fmaf(hv, act, s_part);
        b_part += zb;
      }
      atomicAdd(dbeta + col, b_part);
      if constexpr (Tied) atomicAdd(ds + col, s_part);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) atomicAdd(dtau + 4 * ti + i, c_over_n * tau_part[i]);
  }
}

/// dst (flat, row-major [r, d], or [d, r] when Transposed) += G[j, k] (row stride dp), atomically.
template <bool Transposed>
__device__ __forceinline__ void flush_matrix(float* dst, const float* G, int r, int d, int dp) {
  const int n = r * d;
  for (int e = threadIdx.x; e < n; e += kThreads) {
    int j, k;
    if (Transposed) {
      k = e / r;
      j = e - k * r;
    } else {
      j = e / d;
      k = e - j * d;
    }
    atomicAdd(dst + e, G[Index(j) * dp + k]);
  }
}

// ---- kernels ----------------------------------------------------------------------------------

template <class T>
struct ForwardArgs {
  Layout L;
  OpList ops;
  ParamOffsets po;
  Index pairs, heads;
  const float* params;
  const float* rho;
  const T* q_in;
  const T* k_in;
  T* q_out;
  T* k_out;
};

template <class T>
struct BackwardArgs {
  Layout L;
  OpList ops;
  ParamOffsets po;
  Index pairs, heads;
  const float* params;
  const float* rho;
  const T* q_in;
  const T* k_in;
  float* dq;
  float* dk;
  float* dparams;
  float* drho;
  float* scratch;  // grid x L.slice floats, or null when L.slice == 0
};

// field f of op o acts on state f; it moves state 1 - f (coupled) or f (Uncoupled).
template <class Form>
__device__ __forceinline__ int moved_state(int f) {
  return Form::own_state ? f : 1 - f;
}

template <class Form, class T>
__global__ void __launch_bounds__(kThreads, 2) dynamics_forward_kernel(const ForwardArgs<T> a) {
  constexpr bool tied = Form::tied;
  constexpr int group = Form::group;
  COUPLEDQK_DYNAMIC_SHARED(16, float4, dynamics_smem);
  float* const sm = reinterpret_cast<float*>(dynamics_smem);
  const int rows = a.L.rows, dp = a.L.dp, rp = a.L.rp, ldp = a.L.ldp;
  float* const q = sm + a.L.q;
  float* const k = sm + a.L.k;
  float* const h = sm + a.L.h;
  float* const coef = sm + a.L.coef;
  float* const buf0 = sm + a.L.buf[0];
  float* const buf1 = group == 2 ? sm + a.L.buf[1] : buf0;
  const float* const A0 = sm + a.L.A[0];
  const float* const A1 = sm + a.L.A[1];
  const float* const B0 = sm + a.L.B[0];
  const float* const B1 = sm + a.L.B[1];
  const float* const beta0 = sm + a.L.bias[0];
  const float* const beta1 = sm + a.L.bias[1];
  const float* const s0 = sm + a.L.scale[0];
  const float* const s1 = sm + a.L.scale[1];
  load_parameters<tied>(sm, a.L, a.po, a.params);
  store_coefficients(coef, a.ops);
  const unsigned long long bits = a.ops.field_bits;
  const Index tiles = (a.pairs + rows - 1) / rows;
  for (Index tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const Index r0 = tile * rows;
    const int valid = static_cast<int>(a.pairs - r0 < rows ? a.pairs - r0 : rows);
    load_rows(q, a.q_in, r0, valid, rows, a.L.d, dp);
    load_rows(k, a.k_in, r0, valid, rows, a.L.d, dp);
    load_steps(h, a.rho, a.heads, r0, valid, rows, a.ops.steps);
    __syncthreads();
    for (int o = 0; o < a.L.ops; o += group) {
#pragma unroll 1
      for (int i = 0; i < group; ++i) {
        const int f = static_cast<int>((bits >> (o + i)) & 1ull);
        activation_pass(sel(f, q, k), sel(f, A0, A1), sel(f, beta0, beta1), sel(f, s0, s1), h, coef[o + i],
                        sel(i, buf0, buf1), rows, dp, rp, ldp);
      }
      __syncthreads();
#pragma unroll 1
      for (int i = 0; i < group; ++i) {
        const int f = static_cast<int>((bits >> (o + i)) & 1ull);
        propagate_pass(sel(i, buf0, buf1), sel(f, B0, B1), sel(moved_state<Form>(f), q, k), rows, dp, rp, ldp);
      }
      __syncthreads();
    }
    store_rows(a.q_out, q, r0, valid, a.L.d, dp);
    store_rows(a.k_out, k, r0, valid, a.L.d, dp);
    __syncthreads();
  }
}

template <class Form, class T>
__global__ void __launch_bounds__(kThreads, 1) dynamics_backward_kernel(const BackwardArgs<T> a) {
  constexpr bool tied = Form::tied;
  constexpr int group = Form::group;
  COUPLEDQK_DYNAMIC_SHARED(16, float4, dynamics_smem);
  float* const sm = reinterpret_cast<float*>(dynamics_smem);
  const int rows = a.L.rows, dp = a.L.dp, rp = a.L.rp, ldp = a.L.ldp, d = a.L.d;
  const int state = rows * dp;
  float* const q = sm + a.L.q;
  float* const k = sm + a.L.k;
  float* const dq = sm + a.L.dq;
  float* const dk = sm + a.L.dk;
  float* const h = sm + a.L.h;
  float* const dtau = sm + a.L.dtau;
  float* const coef = sm + a.L.coef;
  float* const bufL = sm + a.L.buf[0];
  float* const bufZ0 = sm + a.L.buf[1];
  float* const bufZ1 = group == 2 ? sm + a.L.buf[2] : bufZ0;
  const float* const A0 = sm + a.L.A[0];
  const float* const A1 = sm + a.L.A[1];
  const float* const B0 = sm + a.L.B[0];
  const float* const B1 = sm + a.L.B[1];
  const float* const beta0 = sm + a.L.bias[0];
  const float* const beta1 = sm + a.L.bias[1];
  const float* const s0 = sm + a.L.scale[0];
  const float* const s1 = sm + a.L.scale[1];
  float* const dbeta0 = sm + a.L.dbias[0];
  float* const dbeta1 = sm + a.L.dbias[1];
  float* const ds0 = sm + a.L.dscale[0];
  float* const ds1 = sm + a.L.dscale[1];
  float* const sdrho = a.L.drho >= 0 ? sm + a.L.drho : nullptr;
  // Parameter-gradient matrices and the trajectory: shared memory, or this block's scratch slice.
  float* const slice = a.scratch ? a.scratch + Index(blockIdx.x) * a.L.slice : nullptr;
  float* const gbase = a.L.grads_shared ? sm : slice;
  float* const gA0 = gbase + a.L.gmat[0];
  float* const gA1 = gbase + a.L.gmat[1];
  float* const gB0 = gbase + a.L.gmat[2];
  float* const gB1 = gbase + a.L.gmat[3];
  float* const traj = a.L.traj_shared ? sm + a.L.traj : slice + a.L.traj;

  load_parameters<tied>(sm, a.L, a.po, a.params);
  store_coefficients(coef, a.ops);
  const Index mat = Index(rp) * dp;
  zero_floats(gA0, mat);
  zero_floats(gA1, mat);
  if (!tied) {
    zero_floats(gB0, mat);
    zero_floats(gB1, mat);
  }
  zero_floats(dbeta0, rp);
  zero_floats(dbeta1, rp);
  zero_floats(ds0, rp);
  zero_floats(ds1, rp);
  if (sdrho) zero_floats(sdrho, a.heads);
  const unsigned long long bits = a.ops.field_bits;
  const float inv_steps = 1.f / static_cast<float>(a.ops.steps);
  const int groups = a.L.ops / group;
  const Index tiles = (a.pairs + rows - 1) / rows;
  for (Index tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const Index r0 = tile * rows;
    const int valid = static_cast<int>(a.pairs - r0 < rows ? a.pairs - r0 : rows);
    load_rows(q, a.q_in, r0, valid, rows, d, dp);
    load_rows(k, a.k_in, r0, valid, rows, d, dp);
    load_rows(dq, a.dq, r0, valid, rows, d, dp);
    load_rows(dk, a.dk, r0, valid, rows, d, dp);
    load_steps(h, a.rho, a.heads, r0, valid, rows, a.ops.steps);
    for (int i = threadIdx.x; i < rows; i += kThreads) dtau[i] = 0.f;
    __syncthreads();

    // Recompute the forward, keeping every op's argument (the last group's outputs are not needed).
    for (int g = 0; g < groups; ++g) {
      const int o = g * group;
#pragma unroll 1
      for (int i = 0; i < group; ++i) {
        const int f = static_cast<int>((bits >> (o + i)) & 1ull);
        copy_floats(traj + Index(o + i) * state, sel(f, q, k), state);
      }
      if (g + 1 == groups) break;
#pragma unroll 1
      for (int i = 0; i < group; ++i) {
        const int f = static_cast<int>((bits >> (o + i)) & 1ull);
        activation_pass(sel(f, q, k), sel(f, A0, A1), sel(f, beta0, beta1), sel(f, s0, s1), h, coef[o + i],
                        sel(i, bufZ0, bufZ1), rows, dp, rp, ldp);
      }
      __syncthreads();
#pragma unroll 1
      for (int i = 0; i < group; ++i) {
        const int f = static_cast<int>((bits >> (o + i)) & 1ull);
        propagate_pass(sel(i, bufZ0, bufZ1), sel(f, B0, B1), sel(moved_state<Form>(f), q, k), rows, dp, rp, ldp);
      }
      __syncthreads();
    }
    __syncthreads();

    // Walk the groups backwards. Every op of a group reads the group's output cotangents before
    // any of them adds its argument's cotangent.
    for (int g = groups - 1; g >= 0; --g) {
      const int o = g * group;
#pragma unroll 1
      for (int i = 0; i < group; ++i) {
        const int f = static_cast<int>((bits >> (o + i)) & 1ull);
        const int mv = moved_state<Form>(f);
        const float c = coef[o + i];
        const float* x;
        if (a.L.traj_shared) {
          x = sm + a.L.traj + Index(o + i) * state;
        } else {
          copy_floats(sm + a.L.x, traj + Index(o + i) * state, state);
          __syncthreads();
          x = sm + a.L.x;
        }
        float* const zb = sel(i, bufZ0, bufZ1);
        const float* const dmv = sel(mv, dq, dk);
        vjp_activation_pass<tied>(x, dmv, sel(f, A0, A1), sel(f, B0, B1), sel(f, beta0, beta1), sel(f, s0, s1), h,
                                  c, c * inv_steps, bufL, zb, dtau, sel(f, dbeta0, dbeta1), sel(f, ds0, ds1), rows,
                                  dp, rp, ldp);
        __syncthreads();
        if constexpr (tied) {
          outer_pass<true>(bufL, dmv, zb, x, sel(f, gA0, gA1), rows, dp, rp);
        } else {
          outer_pass<false>(bufL, dmv, nullptr, nullptr, sel(f, gB0, gB1), rows, dp, rp);
          outer_pass<false>(zb, x, nullptr, nullptr, sel(f, gA0, gA1), rows, dp, rp);
        }
        __syncthreads();
      }
#pragma unroll 1
      for (int i = 0; i < group; ++i) {
        const int f = static_cast<int>((bits >> (o + i)) & 1ull);
        propagate_pass(sel(i, bufZ0, bufZ1), sel(f, A0, A1), sel(f, dq, dk), rows, dp, rp, ldp);
      }
      __syncthreads();
    }

    store_rows(a.dq, dq, r0, valid, d, dp);
    store_rows(a.dk, dk, r0, valid, d, dp);
    for (int i = threadIdx.x; i < valid; i += kThreads) {
      const Index head = (r0 + i) % a.heads;
      const float v = dtau[i] * sigmoid_f(a.rho[head]);
      atomicAdd(sdrho ? sdrho + head : a.drho + head, v);
    }
    __syncthreads();
  }

  // One atomicAdd per element per block.
  __syncthreads();
  const int r = a.L.r;
  flush_matrix<false>(a.dparams + a.po.A[0], gA0, r, d, dp);
  flush_matrix<false>(a.dparams + a.po.A[1], gA1, r, d, dp);
  if (!tied) {
    flush_matrix<true>(a.dparams + a.po.B[0], gB0, r, d, dp);
    flush_matrix<true>(a.dparams + a.po.B[1], gB1, r, d, dp);
  }
  for (int j = threadIdx.x; j < r; j += kThreads) {
    atomicAdd(a.dparams + a.po.bias[0] + j, dbeta0[j]);
    atomicAdd(a.dparams + a.po.bias[1] + j, dbeta1[j]);
    if (tied) {
      atomicAdd(a.dparams + a.po.scale[0] + j, ds0[j]);
      atomicAdd(a.dparams + a.po.scale[1] + j, ds1[j]);
    }
  }
  if (sdrho)
    for (Index hh = threadIdx.x; hh < a.heads; hh += kThreads) atomicAdd(a.drho + hh, sdrho[hh]);
}

// ---- host side --------------------------------------------------------------------------------

inline std::string shape_string(const DynamicsDims& dims) {
  return "(P = " + std::to_string(dims.pairs) + ", H = " + std::to_string(dims.heads) +
         ", d = " + std::to_string(dims.head_dim) + ", m = " + std::to_string(dims.hidden) + ")";
}

// Checks that throw coupledqk::invalid_argument naming the value and what is accepted; fn names
// the public function called.
inline std::string where(const char* fn) { return std::string("coupledqk::cuda::") + fn + ": "; }

/// Every family: P >= 0, H >= 1.
inline void validate_pairs_heads(const DynamicsDims& dims, const char* fn) {
  if (dims.pairs < 0)
    throw ::coupledqk::invalid_argument(where(fn) + "pairs P = " + std::to_string(dims.pairs) + " is negative; accepted: P >= 0");
  if (dims.heads < 1)
    throw ::coupledqk::invalid_argument(where(fn) + "heads H = " + std::to_string(dims.heads) + " is not supported; accepted: H >= 1");
}

/// 1 <= d <= max_dim, or d >= 1 when max_dim is 0.
inline void validate_head_dim(const DynamicsDims& dims, const char* fn, Index max_dim) {
  if (max_dim == 0) {
    if (dims.head_dim < 1)
      throw ::coupledqk::invalid_argument(where(fn) + "head_dim d = " + std::to_string(dims.head_dim) +
                                  " is not supported; accepted: d >= 1");
    return;
  }
  if (dims.head_dim < 1 || dims.head_dim > max_dim)
    throw ::coupledqk::invalid_argument(where(fn) + "head_dim d = " + std::to_string(dims.head_dim) +
                                " is not supported; accepted: 1 <= d <= " + std::to_string(max_dim));
}

/// 1 <= m <= kMaxDim.
inline void validate_hidden(const DynamicsDims& dims, const char* fn) {
  if (dims.hidden < 1 || dims.hidden > kMaxDim)
    throw ::coupledqk::invalid_argument(where(fn) + "hidden m = " + std::to_string(dims.hidden) +
                                " is not supported; accepted: 1 <= m <= " + std::to_string(kMaxDim));
}

inline void require_pointer(const void* p, const char* name, const char* fn, const DynamicsDims& dims) {
  if (p == nullptr)
    throw ::coupledqk::invalid_argument(std::string("coupledqk::cuda::") + fn + ": " + name + " is null; shape " +
                                shape_string(dims) + " needs it");
}

struct DeviceLimits {
  int device = 0;
  int sms = 0;
  int smem_optin = 0;
  int pools = 0;
};

inline DeviceLimits device_limits() {
  int dev = 0;
  COUPLEDQK_CUDA_CHECK(cudaGetDevice(&dev));
  DeviceLimits lim;
  lim.device = dev;
  COUPLEDQK_CUDA_CHECK(cudaDeviceGetAttribute(&lim.sms, cudaDevAttrMultiProcessorCount, dev));
  COUPLEDQK_CUDA_CHECK(cudaDeviceGetAttribute(&lim.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  COUPLEDQK_CUDA_CHECK(cudaDeviceGetAttribute(&lim.pools, cudaDevAttrMemoryPoolsSupported, dev));
  return lim;
}

inline std::size_t bytes_of(const Layout& L) { return static_cast<std::size_t>(L.floats) * sizeof(float); }

/// Forward: the largest tile (from target_rows down) whose shared memory fits.
template <class Form>
Layout plan_forward(const DynamicsDims& dims, Index r, int ops, std::size_t limit) {
  for (int R = target_rows(dims, r); R >= 8; R /= 2) {
    const Layout L = make_layout<Form>(false, dims, r, ops, R, false, false);
    if (bytes_of(L) <= limit) return L;
  }
  throw cuda_error("coupledqk::cuda::dynamics_forward: shape " + shape_string(dims) +
                   " does not fit in the device's shared memory (" + std::to_string(limit) + " bytes per block)");
}

/// Backward: parameter gradients in shared memory if any tile allows it, else in global scratch;
/// then the trajectory in shared memory if it still fits.
template <class Form>
Layout plan_backward(const DynamicsDims& dims, Index r, int ops, std::size_t limit) {
  for (int pass = 0; pass < 2; ++pass) {
    const bool grads_shared = pass == 0;
    for (int R = target_rows(dims, r); R >= (grads_shared ? 16 : 8); R /= 2) {
      const Layout L = make_layout<Form>(true, dims, r, ops, R, grads_shared, false);
      if (bytes_of(L) > limit) continue;
      const Layout with_traj = make_layout<Form>(true, dims, r, ops, R, grads_shared, true);
      return bytes_of(with_traj) <= limit ? with_traj : L;
    }
  }
  throw cuda_error("coupledqk::cuda::dynamics_backward: shape " + shape_string(dims) +
                   " does not fit in the device's shared memory (" + std::to_string(limit) + " bytes per block)");
}

/// Sets the kernel's dynamic shared-memory limit and returns its resident blocks per SM. The limit
/// set is the largest any caller has asked for on that device (never lowered, so concurrent callers
/// cannot shrink it under each other's launches); occupancy is cached per (kernel, device, bytes).
template <class Kernel>
int prepare_kernel(Kernel kernel, std::size_t bytes, int device) {
  struct Entry {
    const void* kernel;
    int device;
    std::size_t bytes;  // occupancy entries: the launch size; limit entries: the largest size asked
    int per_sm;         // -1 marks a limit entry
  };
  static std::mutex mutex;
  static std::vector<Entry> table;
  const void* key = reinterpret_cast<const void*>(kernel);
  const std::lock_guard<std::mutex> lock(mutex);
  Entry* limit = nullptr;
  int per_sm = -1;
  for (Entry& e : table) {
    if (e.kernel != key || e.device != device) continue;
    if (e.per_sm < 0)
      limit = &e;
    else if (e.bytes == bytes)
      per_sm = e.per_sm;
  }
  if (limit == nullptr) {
    table.push_back({key, device, bytes, -1});
    limit = &table.back();
  }
  limit->bytes = std::max(limit->bytes, bytes);
  COUPLEDQK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(limit->bytes)));
  if (per_sm >= 0) return per_sm;
  COUPLEDQK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, bytes));
  if (per_sm < 1)
    throw cuda_error("coupledqk::cuda dynamics: a block of " + std::to_string(kThreads) + " threads with " +
                     std::to_string(bytes) + " bytes of shared memory cannot be resident on this device");
  table.push_back({key, device, bytes, per_sm});
  return per_sm;
}

inline unsigned persistent_grid(Index tiles, int per_sm, int sms) {
  const Index resident = Index(per_sm) * std::max(sms, 1);
  return static_cast<unsigned>(std::max<Index>(1, std::min(tiles, resident)));
}

/// Stream-ordered scratch: cudaMallocAsync / cudaFreeAsync where memory pools exist, else
/// cudaMalloc and, on release, synchronise the stream and cudaFree.
class Scratch {
 public:
  Scratch(std::size_t bytes, cudaStream_t stream, bool pools) : stream_(stream), pools_(pools) {
    if (bytes == 0) return;
    if (pools_)
      COUPLEDQK_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&ptr_), bytes, stream_));
    else
      COUPLEDQK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), bytes));
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    if (!ptr_) return;
    if (pools_) {
      (void)cudaFreeAsync(ptr_, stream_);
    } else {
      (void)cudaStreamSynchronize(stream_);
      (void)cudaFree(ptr_);
    }
  }
  float* get() const { return ptr_; }

 private:
  float* ptr_ = nullptr;
  cudaStream_t stream_;
  bool pools_;
};

/// What a launch uses (for benchmarks and reports).
struct LaunchPlan {
  Layout layout{};
  unsigned blocks = 0;
  int blocks_per_sm = 0;
  std::size_t shared_bytes = 0;
  std::size_t scratch_bytes = 0;
  bool memory_pools = true;
};

template <class Form, class T>
LaunchPlan plan_launch(const DynamicsDims& dims, Index r, int ops, bool backward) {
  const DeviceLimits lim = device_limits();
  LaunchPlan p;
  p.layout = backward ? plan_backward<Form>(dims, r, ops, static_cast<std::size_t>(lim.smem_optin))
                      : plan_forward<Form>(dims, r, ops, static_cast<std::size_t>(lim.smem_optin));
  p.shared_bytes = bytes_of(p.layout);
  p.blocks_per_sm = backward ? prepare_kernel(dynamics_backward_kernel<Form, T>, p.shared_bytes, lim.device)
                             : prepare_kernel(dynamics_forward_kernel<Form, T>, p.shared_bytes, lim.device);
  p.memory_pools = lim.pools != 0;
  const Index tiles = (dims.pairs + p.layout.rows - 1) / p.layout.rows;
  p.blocks = persistent_grid(tiles, p.blocks_per_sm, lim.sms);
  p.scratch_bytes = static_cast<std::size_t>(p.layout.slice) * p.blocks * sizeof(float);
  return p;
}

template <class Form, class T>
void launch_forward(const DynamicsDims& dims, const OpProgram& prog, const float* params, const float* rho,
                    const T* q_in, const T* k_in, T* q_out, T* k_out, cudaStream_t stream) {
  const LaunchPlan p = plan_launch<Form, T>(dims, prog.r, prog.ops.count, false);
  ForwardArgs<T> a{p.layout, prog.ops, prog.po, dims.pairs, dims.heads, params, rho, q_in, k_in, q_out, k_out};
  launch(dynamics_forward_kernel<Form, T>, p.blocks, kThreads, p.shared_bytes, stream, a);
}

template <class Form, class T>
void launch_backward(const DynamicsDims& dims, const OpProgram& prog, const float* params, const float* rho,
                     const T* q_in, const T* k_in, float* dq, float* dk, float* dparams, float* drho,
                     cudaStream_t stream) {
  const LaunchPlan p = plan_launch<Form, T>(dims, prog.r, prog.ops.count, true);
  const Scratch scratch(p.scratch_bytes, stream, p.memory_pools);
  BackwardArgs<T> a{p.layout, prog.ops, prog.po, dims.pairs, dims.heads, params, rho, q_in, k_in,
                    dq,       dk,       dparams, drho,       scratch.get()};
  launch(dynamics_backward_kernel<Form, T>, p.blocks, kThreads, p.shared_bytes, stream, a);
}

/// The forward, backward and launch plan of a family lowered to tanh ops: the base of its
/// DeviceDynamics specialisation `Family`, which gives
///     using form = OpForm<...>;                                   // the kernels' compile-time shape
///     static OpProgram program(const DynamicsDims&);              // ops, field width r, offsets
template <class Family>
struct TanhOpsDynamics {
  template <class T>
  static void forward(const DynamicsDims& dims, const float* params, const float* rho, const T* q_in, const T* k_in,
                      T* q_out, T* k_out, cudaStream_t stream) {
    launch_forward<typename Family::form, T>(dims, Family::program(dims), params, rho, q_in, k_in, q_out, k_out,
                                             stream);
  }
  template <class T>
  static void backward(const DynamicsDims& dims, const float* params, const float* rho, const T* q_in, const T* k_in,
                       float* dq, float* dk, float* dparams, float* drho, cudaStream_t stream) {
    launch_backward<typename Family::form, T>(dims, Family::program(dims), params, rho, q_in, k_in, dq, dk, dparams,
                                              drho, stream);
  }
  template <class T>
  static LaunchPlan launch_plan(const DynamicsDims& dims, bool backward) {
    const OpProgram prog = Family::program(dims);
    return plan_launch<typename Family::form, T>(dims, prog.r, prog.ops.count, backward);
  }
};

/// N steps of a group of two ops: op 2s has field `first` and coefficient c_first, op 2s + 1 the
/// other field and c_second.
inline OpList paired_ops(int steps, int first, float c_first, float c_second) {
  OpList ops;
  ops.steps = steps;
  ops.count = 2 * steps;
  for (int s = 0; s < steps; ++s) {
    ops.field_bits |= static_cast<unsigned long long>(first) << (2 * s);
    ops.field_bits |= static_cast<unsigned long long>(1 - first) << (2 * s + 1);
    ops.coef[2 * s] = c_first;
    ops.coef[2 * s + 1] = c_second;
  }
  return ops;
}

template <class D, class T, class = void>
struct has_launch_plan : std::false_type {};
template <class D, class T>
struct has_launch_plan<D, T, std::void_t<decltype(D::template launch_plan<T>(std::declval<const DynamicsDims&>(), false))>>
    : std::true_type {};

// ---- traits of the CPU policies that select a family -------------------------------------------

template <class I, class = void>
struct has_plan : std::false_type {};
template <class I>
struct has_plan<I, std::void_t<decltype(I::plan.size), decltype(I::plan.stage[0].kind)>> : std::true_type {};

template <class I, class = void>
struct has_tanh_hamiltonian : std::false_type {};
template <class I>
struct has_tanh_hamiltonian<I, std::void_t<typename I::hamiltonian>>
    : std::is_same<typename I::hamiltonian, TanhHamiltonian> {};

template <class I, class = void>
struct has_steps : std::false_type {};
template <class I>
struct has_steps<I, std::void_t<decltype(I::steps)>> : std::true_type {};

/// A splitting method of the tanh Hamiltonian: a `plan` (kicks and drifts, SymplecticSplitting's)
/// and `hamiltonian` = TanhHamiltonian.
template <class I>
constexpr bool is_tanh_splitting() {
  if constexpr (has_plan<I>::value && has_tanh_hamiltonian<I>::value)
    return I::has_dynamics;
  else
    return false;
}

/// I is Base<I::steps> or derived from it (false when I declares no step count).
template <template <int> class Base, class I>
constexpr bool derives_from_steps() {
  if constexpr (has_steps<I>::value) {
    if constexpr (I::steps >= 1)
      return std::is_base_of_v<Base<I::steps>, I>;
    else
      return false;
  } else {
    return false;
  }
}

template <int N>
using TanhEuler = HamiltonianEuler<N, TanhHamiltonian>;

/// Whether a policy has parameter tensors besides rho (drift has none: no params pointer needed).
template <class I>
constexpr bool has_parameters() {
  return !std::is_same_v<typename I::template parameters<float>, EmptyParameters<float>>;
}

}  // namespace dynamics_detail

/// True for the policies whose family has device kernels, within their limits: Identity, any
/// SymplecticSplitting of the tanh Hamiltonian (at most 64 merged stages), Euler<N> and
/// Uncoupled<N> (N <= 32), Affine<N>, policies derived from them, and any family a consumer adds.
template <class Integrator>
constexpr bool has_device_dynamics = DeviceDynamics<Integrator>::supported;

/// (q_out, k_out) = Phi(q_in, k_in) for P pairs; see the header comment. q_out may equal q_in and
/// k_out may equal k_in (in place). Asynchronous on `stream`.
template <class Integrator, class T>
void dynamics_forward(const DynamicsDims& dims, const float* params, const float* rho, const T* q_in,
                      const T* k_in, T* q_out, T* k_out, cudaStream_t stream = nullptr) {
  static_assert(is_storage<T>::value, "coupledqk::cuda::dynamics_forward: storage T must be float or bf16");
  static_assert(has_device_dynamics<Integrator>,
                "coupledqk::cuda::dynamics_forward: no device dynamics for this integrator policy: no "
                "DeviceDynamics specialisation for its family, or outside its limits (built in: Identity, "
                "SymplecticSplitting schemes of at most 64 merged stages, Euler<N> and Uncoupled<N> with N <= 32, "
                "Affine<N>)");
  using namespace dynamics_detail;
  using Device = DeviceDynamics<Integrator>;
  const char* fn = "dynamics_forward";
  validate_pairs_heads(dims, fn);
  Device::validate(dims, fn);
  if (dims.pairs == 0) return;
  require_pointer(q_in, "q_in", fn, dims);
  require_pointer(k_in, "k_in", fn, dims);
  require_pointer(q_out, "q_out", fn, dims);
  require_pointer(k_out, "k_out", fn, dims);
  if constexpr (Integrator::has_dynamics) {
    if constexpr (has_parameters<Integrator>()) require_pointer(params, "params", fn, dims);
    require_pointer(rho, "rho", fn, dims);
  }
  Device::template forward<T>(dims, params, rho, q_in, k_in, q_out, k_out, stream);
}

/// Backward of dynamics_forward, recomputing the trajectory from (q_in, k_in). dq, dk: on entry the
/// cotangents of q_out, k_out; on exit those of q_in, k_in. dparams (+=) in the params layout;
/// drho (+=) [H]. Asynchronous on `stream`.
template <class Integrator, class T>
void dynamics_backward(const DynamicsDims& dims, const float* params, const float* rho, const T* q_in,
                       const T* k_in, float* dq, float* dk, float* dparams, float* drho,
                       cudaStream_t stream = nullptr) {
  static_assert(is_storage<T>::value, "coupledqk::cuda::dynamics_backward: storage T must be float or bf16");
  static_assert(has_device_dynamics<Integrator>,
                "coupledqk::cuda::dynamics_backward: no device dynamics for this integrator policy: no "
                "DeviceDynamics specialisation for its family, or outside its limits (built in: Identity, "
                "SymplecticSplitting schemes of at most 64 merged stages, Euler<N> and Uncoupled<N> with N <= 32, "
                "Affine<N>)");
  using namespace dynamics_detail;
  using Device = DeviceDynamics<Integrator>;
  const char* fn = "dynamics_backward";
  validate_pairs_heads(dims, fn);
  Device::validate(dims, fn);
  if (dims.pairs == 0) return;
  if constexpr (Integrator::has_dynamics) {  // (without dynamics the backward is the identity)
    if constexpr (has_parameters<Integrator>()) {  // (drift has only rho)
      require_pointer(params, "params", fn, dims);
      require_pointer(dparams, "dparams", fn, dims);
    }
    require_pointer(rho, "rho", fn, dims);
    require_pointer(q_in, "q_in", fn, dims);
    require_pointer(k_in, "k_in", fn, dims);
    require_pointer(dq, "dq", fn, dims);
    require_pointer(dk, "dk", fn, dims);
    require_pointer(drho, "drho", fn, dims);
  }
  Device::template backward<T>(dims, params, rho, q_in, k_in, dq, dk, dparams, drho, stream);
}

/// The launch a call would make on the current device (tile rows, shared memory, grid, scratch):
/// for benchmarks and reports. Families without a launch_plan report none (blocks = 0): Identity
/// launches nothing, Affine is not reported (its own kernels, affine.cuh).
template <class Integrator, class T>
dynamics_detail::LaunchPlan dynamics_launch_plan(const DynamicsDims& dims, bool backward) {
  using namespace dynamics_detail;
  using Device = DeviceDynamics<Integrator>;
  static_assert(has_device_dynamics<Integrator>, "coupledqk::cuda::dynamics_launch_plan: unsupported policy");
  validate_pairs_heads(dims, "dynamics_launch_plan");
  Device::validate(dims, "dynamics_launch_plan");
  if constexpr (has_launch_plan<Device, T>::value) {
    return Device::template launch_plan<T>(dims, backward);
  } else {
    return {};
  }
}

// ---- the built-in families ----------------------------------------------------------------------

/// Any policy without dynamics (Identity): q' = q, k' = k. The forward copies when out != in, the
/// backward does nothing; any d >= 1.
template <class I>
struct DeviceDynamics<I, std::enable_if_t<!I::has_dynamics>> {
  static constexpr bool supported = true;

  static void validate(const DynamicsDims& dims, const char* fn) { dynamics_detail::validate_head_dim(dims, fn, 0); }

  template <class T>
  static void forward(const DynamicsDims& dims, const float*, const float*, const T* q_in, const T* k_in, T* q_out,
                      T* k_out, cudaStream_t stream) {
    const std::size_t bytes = static_cast<std::size_t>(dims.pairs * dims.head_dim) * sizeof(T);
    if (q_out != q_in) COUPLEDQK_CUDA_CHECK(cudaMemcpyAsync(q_out, q_in, bytes, cudaMemcpyDeviceToDevice, stream));
    if (k_out != k_in) COUPLEDQK_CUDA_CHECK(cudaMemcpyAsync(k_out, k_in, bytes, cudaMemcpyDeviceToDevice, stream));
  }

  template <class T>
  static void backward(const DynamicsDims&, const float*, const float*, const T*, const T*, float*, float*, float*,
                       float*, cudaStream_t) {}
};

/// A symplectic splitting of the tanh Hamiltonian (SymplecticSplitting: Leapfrog<N>,
/// examples/forest_ruth.hpp, any scheme): one op per stage of the policy's merged `plan`, each
/// reading the previous one's output; a kick (coef w) is f = 0, c = -w, a drift f = 1, c = +w.
template <class I>
struct DeviceDynamics<I, std::enable_if_t<dynamics_detail::is_tanh_splitting<I>()>>
    : dynamics_detail::TanhOpsDynamics<DeviceDynamics<I>> {
  static constexpr bool supported = I::plan.size <= dynamics_detail::kMaxOps;
  using form = dynamics_detail::OpForm</*Tied=*/true, /*Group=*/1, /*OwnState=*/false>;

  static void validate(const DynamicsDims& dims, const char* fn) {
    dynamics_detail::validate_head_dim(dims, fn, dynamics_detail::kMaxDim);
    dynamics_detail::validate_hidden(dims, fn);
  }

  static dynamics_detail::OpProgram program(const DynamicsDims& dims) {
    dynamics_detail::OpProgram p;
    p.ops.steps = I::steps;
    p.ops.count = I::plan.size;
    for (int i = 0; i < I::plan.size; ++i) {
      const bool kick = I::plan.stage[i].kind == StageKind::kick;
      if (!kick) p.ops.field_bits |= 1ull << i;
      p.ops.coef[i] = static_cast<float>(kick ? -I::plan.stage[i].coef : I::plan.stage[i].coef);
    }
    p.r = dims.hidden;
    p.po = dynamics_detail::tanh_hamiltonian_offsets(dims.head_dim, dims.hidden);
    return p;
  }
};

/// Explicit Euler of the tanh Hamiltonian (HamiltonianEuler<N, TanhHamiltonian>: Euler<N>): per
/// step the group {drift: f = 1, c = +1; kick: f = 0, c = -1}, both reading the step's input.
template <class I>
struct DeviceDynamics<I, std::enable_if_t<dynamics_detail::derives_from_steps<dynamics_detail::TanhEuler, I>()>>
    : dynamics_detail::TanhOpsDynamics<DeviceDynamics<I>> {
  static constexpr bool supported = 2 * I::steps <= dynamics_detail::kMaxOps;
  using form = dynamics_detail::OpForm</*Tied=*/true, /*Group=*/2, /*OwnState=*/false>;

  static void validate(const DynamicsDims& dims, const char* fn) {
    dynamics_detail::validate_head_dim(dims, fn, dynamics_detail::kMaxDim);
    dynamics_detail::validate_hidden(dims, fn);
  }

  static dynamics_detail::OpProgram program(const DynamicsDims& dims) {
    dynamics_detail::OpProgram p;
    p.ops = dynamics_detail::paired_ops(I::steps, /*first=*/1, 1.f, -1.f);
    p.r = dims.hidden;
    p.po = dynamics_detail::tanh_hamiltonian_offsets(dims.head_dim, dims.hidden);
    return p;
  }
};

/// Uncoupled<N>: per step the group {f = 0: q <- q + h Pq2 tanh(Pq1 q + pq); f = 1: k <- k + h Pk2
/// tanh(Pk1 k + pk)}, each field of width r = m / 2, untied (B = P*2^T, s = 1), moving its own state.
template <class I>
struct DeviceDynamics<I, std::enable_if_t<dynamics_detail::derives_from_steps<::coupledqk::Uncoupled, I>()>>
    : dynamics_detail::TanhOpsDynamics<DeviceDynamics<I>> {
  static constexpr bool supported = 2 * I::steps <= dynamics_detail::kMaxOps;
  using form = dynamics_detail::OpForm</*Tied=*/false, /*Group=*/2, /*OwnState=*/true>;

  static void validate(const DynamicsDims& dims, const char* fn) {
    using dynamics_detail::kMaxDim;
    dynamics_detail::validate_head_dim(dims, fn, kMaxDim);
    if (dims.hidden < 2 || dims.hidden > kMaxDim || dims.hidden % 2 != 0)
      throw ::coupledqk::invalid_argument(dynamics_detail::where(fn) + "hidden m = " + std::to_string(dims.hidden) +
                                  " is not supported by Uncoupled; accepted: m even, 2 <= m <= " +
                                  std::to_string(kMaxDim) + " (q and k each get m/2 units)");
  }

  /// Parameters in visit order: Pq1 [r, d], Pk1 [r, d], pq [r], pk [r], Pq2 [d, r], Pk2 [d, r].
  static dynamics_detail::OpProgram program(const DynamicsDims& dims) {
    dynamics_detail::OpProgram p;
    p.ops = dynamics_detail::paired_ops(I::steps, /*first=*/0, 1.f, 1.f);
    const Index d = dims.head_dim, r = dims.hidden / 2;
    p.r = r;
    p.po.A[0] = 0;              // Pq1 [r, d]
    p.po.A[1] = r * d;          // Pk1
    p.po.bias[0] = 2 * r * d;   // pq [r]
    p.po.bias[1] = 2 * r * d + r;
    p.po.B[0] = 2 * r * d + 2 * r;  // Pq2 [d, r]
    p.po.B[1] = 3 * r * d + 2 * r;  // Pk2
    p.po.scale[0] = p.po.scale[1] = -1;
    return p;
  }
};

}  // namespace coupledqk::cuda

#include "affine.cuh"    // Affine<N>: its own kernels and its DeviceDynamics specialisation
#include "velocity.cuh"  // the velocity family (drift, newton-*, unit-leapfrog): its kernels and specialisations
