// Masked softmax attention on the device in the FlashAttention manner: the T x T matrix is never
// formed in global memory. The CPU counterpart is include/coupledqk/scoring/flash_softmax.hpp.
//
// Layout. Element (b, t, h, i) of a tensor is at base[(b*T + t)*row_stride + h*head_stride + i],
// so the Softmax scoring ([B*T, H*d], head stride d) and the Differential one (sub-heads with head
// stride 2d, values of width 2d) use the same kernels. Q and K have width dqk, V and O width dv.
//
//     O   = softmax(Q K^T * scale + mask) V                  per (b, h)
//     lse = log sum_j exp(scale * q_t . k_j), j in t's range  float [B, H, T]
//
// The mask (FlashMask, the device form of coupledqk::Mask and coupledqk::Sequences of
// include/coupledqk/scoring/mask.hpp) is a run-time argument: causal (the default) or
// bidirectional, an optional window w, and B sequences of T rows (equal, the default), right-padded
// to T (device lengths [B]) or packed end to end (device offsets [B+1], flash-attention's
// cu_seqlens; T is then the longest). Query t of a sequence of L tokens reads the keys
// [begin(t), end(t, L)), one contiguous range; padding rows get o = 0, lse = 0 and zero dq, dk, dv.
// Tiles start at multiples of the tile size from each sequence's first row whatever the mask, so
// the default runs the operations (and gives the bits) of the causal kernels before masks.
//
// Forward: one block per (query tile of 64 rows, b*h); only the key tiles the tile's rows reach
// are visited, in order (causal: up to the diagonal; a window: from the tile holding key
// begin(first row)), with an online softmax in float: running row maximum m and sum l rescale the
// output accumulator held in registers; a row with nothing to read in a visited tile keeps its
// state.
//
// Backward (the usual recomputation from lse): D_t = dO_t . O_t (a small kernel), then
//   * dK, dV: one block per (key tile of 64, b*h), looping over the query tiles that read it
//     (causal: at or below the diagonal): P^T = exp(scale K Q^T - lse), dP^T = V dO^T, dS^T = P^T * (dP^T - D),
//     dV += P^T dO, dK += scale dS^T Q, all in registers, written once at the end;
//   * dQ: a separate pass, one block per (query tile, b*h), looping over the key tiles it reads
//     (the forward's): dQ += scale dS K.
// No atomics anywhere: every output element is written by exactly one thread, in a fixed order of
// summation, so the results are bitwise reproducible from run to run. (The price of the separate
// dQ pass is recomputing P and dP once more.)
//
// Two sets of kernels, chosen at compile time per storage type and width (flash_detail::Kernels):
//   * tensor cores (bf16 storage, dv <= 128, sm_80+): nvcuda::wmma 16x16x16 bf16 fragments with
//     float accumulators, 4 warps per block, 16 rows per warp (see "tensor-core path" below);
//   * CUDA cores (FMA): float storage, and bf16 with dv > 128 (Differential with d > 64).
// FMA kernels: a 16 x 16 grid of threads; a tile product [M, N] gives every thread
// an (M/16) x (N/16) register micro-tile with rows ty + 16 i and columns tx + 16 j, so that the 16
// threads of one row are one half-warp (row reductions are 4 shuffles). Tiles are staged in
// shared memory as float, rows padded by one float where they are read across rows (no bank
// conflicts). Head widths are compile-time buckets: dqk -> DQK in {32, 64, 128}, dv -> DV in
// {DQK, 2 DQK}; the padding columns are zero-filled. Storage T is float or bf16; every sum is in
// float.
//
// Limits: 1 <= dqk <= 128, 1 <= dv <= 256 (the Differential scoring needs dv = 2 dqk), any
// T >= 1, B, H >= 1 (0 is accepted: nothing to do).
//
// Scratch: flash_backward keeps D [B, H, T] (float) in a thread_local DeviceBuffer that grows
// (reserve) and is reused. Calls from one host thread are therefore serialised through it: calls
// from the same host thread on *different* streams must not overlap in time (they do not on one
// stream); different host threads have their own.
#pragma once

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <mma.h>

#include <coupledqk/scoring/mask.hpp>

#include "runtime.cuh"

/// 0 disables the tensor-core kernels (bf16 then runs on the FMA ones).
#ifndef COUPLEDQK_FLASH_TENSOR_CORES
#define COUPLEDQK_FLASH_TENSOR_CORES 1
#endif

namespace coupledqk::cuda {

/// Which keys each query reads and how the rows are cut into sequences: the device form of
/// coupledqk::Mask and coupledqk::Sequences (include/coupledqk/scoring/mask.hpp). The default is
/// causal over B sequences of `seq` rows each.
///
///     causal, window w         t - w < t' <= t              (window 0: none)
///     bidirectional, window w  |t - t'| < w, 0 <= t' < L
///     lengths (device, [B])    right-padded: sequence b holds lengths[b] (1..seq) tokens at rows
///                              b*seq ..; its other rows are padding (o = 0, zero gradients)
///     offsets (device, [B+1])  packed: sequence b is rows offsets[b] .. offsets[b+1]-1, offsets[0] = 0;
///                              FlashLayout::seq is then the longest length
///
/// The kernels read lengths and offsets on the device; the host checks only that at most one of
/// them is given (DeviceSequences below uploads them from a checked coupledqk::Sequences).
struct FlashMask {
  bool causal = true;
  Index window = 0;
  const Index* lengths = nullptr;
  const Index* offsets = nullptr;
  Index rows = 0;  ///< packed: the number of rows, offsets[B] (read on the host); else 0

  bool is_default() const { return causal && window == 0 && !lengths && !offsets; }
};

/// Shape, strides (in elements), score scale and mask of one attention over B x H heads.
struct FlashLayout {
  Index batch = 0, seq = 0, heads = 0, dqk = 0, dv = 0;
  Index q_row = 0, q_head = 0, k_row = 0, k_head = 0, v_row = 0, v_head = 0, o_row = 0, o_head = 0;
  float scale = 1.0f;
  FlashMask mask{};
};

/// A coupledqk::Sequences on the device: its padded lengths or packed offsets in device memory,
/// uploaded (asynchronously, from a host copy kept here) only when they change from one call to the
/// next. mask() gives the FlashMask of `m` over them, valid while this object lives and is not
/// given other sequences.
class DeviceSequences {
 public:
  void set(const Sequences& seqs, cudaStream_t stream) {
    if (uploaded_ && seqs == seqs_) return;
    seqs_ = seqs;
    host_.clear();
    if (seqs.layout() == SequenceLayout::padded) host_ = seqs.lengths();
    if (seqs.layout() == SequenceLayout::packed) host_ = seqs.offsets();
    if (!host_.empty()) {
      // stream-ordered after the kernels that read the previous values; from pageable memory the
      // call returns once host_ is staged, so host_ may change afterwards
      meta_.reserve(host_.size());
      COUPLEDQK_CUDA_CHECK(cudaMemcpyAsync(meta_.data(), host_.data(), sizeof(Index) * host_.size(),
                                           cudaMemcpyHostToDevice, stream));
    }
    uploaded_ = true;
  }
  const Sequences& sequences() const { return seqs_; }
  FlashMask mask(const Mask& m) const {
    FlashMask f;
    f.causal = m.causal;
    f.window = m.window;
    if (seqs_.layout() == SequenceLayout::padded) f.lengths = meta_.data();
    if (seqs_.layout() == SequenceLayout::packed) {
      f.offsets = meta_.data();
      f.rows = seqs_.rows();
    }
    return f;
  }

 private:
  Sequences seqs_;
  std::vector<Index> host_;  // what meta_ holds
  DeviceBuffer<Index> meta_;
  bool uploaded_ = false;
};

inline constexpr Index flash_max_dqk = 128;
inline constexpr Index flash_max_dv = 256;

namespace flash_detail {

constexpr int kThreads = 256;  // a 16 x 16 grid of threads
constexpr int kSide = 16;

// ---- device helpers -------------------------------------------------------------------------------

// Reductions over the 16 lanes of a half-warp (the threads that share a row of a micro-tile).
__device__ __forceinline__ float max16(float x) {
#pragma unroll
  for (int off = 8; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}
__device__ __forceinline__ float sum16(float x) {
#pragma unroll
  for (int off = 8; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}
__device__ __forceinline__ float sum32(float x) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

/// acc[i][j] = sum_c A[(ty + 16 i) * LDA + c] * B[(tx + 16 j) * LDB + c], c < K: this thread's
/// register micro-tile of A B^T for two row-major tiles in shared memory (rows ty + 16 i of A,
/// rows tx + 16 j of B), float accumulation.
template <int MI, int NJ, int K, int LDA, int LDB>
__device__ __forceinline__ void tile_product_nt(float (&acc)[MI][NJ], const float* __restrict__ A,
                                                const float* __restrict__ B, int ty, int tx) {
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NJ; ++j) acc[i][j] = 0.0f;
#pragma unroll 8
  for (int c = 0; c < K; ++c) {
    float a[MI], b[NJ];
#pragma unroll
    for (int i = 0; i < MI; ++i) a[i] = A[(ty + kSide * i) * LDA + c];
#pragma unroll
    for (int j = 0; j < NJ; ++j) b[j] = B[(tx + kSide * j) * LDB + c];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NJ; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
  }
}

// Rows of a tile of `tile` rows that lie before the end of the sequence (`left` rows remain).
__device__ __forceinline__ int tile_rows(int tile, Index left) {
  return left < Index(tile) ? static_cast<int>(left) : tile;
}

// dst[r * LD + c] = float(src[r * row_stride + c]) for r < nrows, c < ncols; 0 elsewhere in the
// ROWS x COLS tile. src points at the first row of the tile.
template <int ROWS, int COLS, int LD, class E>
__device__ __forceinline__ void load_tile(float* __restrict__ dst, const E* __restrict__ src, Index row_stride,
                                          int nrows, int ncols) {
  static_assert((ROWS * COLS) % kThreads == 0, "tile size must be a multiple of the block size");
#pragma unroll 8
  for (int it = 0; it < ROWS * COLS / kThreads; ++it) {
    const int idx = it * kThreads + static_cast<int>(threadIdx.x);
    const int r = idx / COLS, c = idx % COLS;
    float x = 0.0f;
    if (r < nrows && c < ncols) x = to_float(src[Index(r) * row_stride + c]);
    dst[r * LD + c] = x;
  }
}

// ---- the mask as the kernels read it ----------------------------------------------------------------

// FlashMask with the sequences' row stride: where sequence b's rows are, and which keys query t of
// a sequence of len tokens reads, [begin(t), end(t, len)) (coupledqk::Mask::begin / end), or, per
// key j, which queries read it, [first_query(j), query_end(j, len)).
struct MaskArgs {
  Index seq = 0;  // T: rows per sequence (equal, padded), the longest one (packed); lse's stride
  Index window = 0;
  const Index* lengths = nullptr;
  const Index* offsets = nullptr;
  bool causal = true;

  __device__ __forceinline__ Index start(Index b) const { return offsets ? offsets[b] : b * seq; }
  // rows of sequence b: its tokens and, when padded, its padding
  __device__ __forceinline__ Index span(Index b) const { return offsets ? offsets[b + 1] - offsets[b] : seq; }
  // tokens of sequence b
  __device__ __forceinline__ Index length(Index b) const {
    return offsets ? offsets[b + 1] - offsets[b] : lengths ? lengths[b] : seq;
  }
  __device__ __forceinline__ Index begin(Index t) const { return window > 0 && t >= window ? t - window + 1 : 0; }
  __device__ __forceinline__ Index end(Index t, Index len) const {
    if (causal) return t + 1;
    return window > 0 && t + window < len ? t + window : len;
  }
  __device__ __forceinline__ Index first_query(Index j) const { return causal ? j : begin(j); }
  __device__ __forceinline__ Index query_end(Index j, Index len) const {
    return window > 0 && j + window < len ? j + window : len;
  }
  __device__ __forceinline__ bool visible(Index t, Index j, Index len) const {
    return t < len && j < len && j >= begin(t) && j < end(t, len);
  }
};

// The rows of a tile of `tile` rows from `first` on that are tokens of a sequence of len tokens.
__device__ __forceinline__ int valid_rows(int tile, Index first, Index len) {
  return first < len ? tile_rows(tile, len - first) : 0;
}

// ---- kernel arguments -----------------------------------------------------------------------------

template <class E>
struct FwdArgs {
  const E* q;
  const E* k;
  const E* v;
  E* o;
  float* lse;  // may be null
  MaskArgs m;
  Index heads;
  Index q_row, q_head, k_row, k_head, v_row, v_head, o_row, o_head;
  int dqk, dv;
  float scale;
};

template <class E>
struct BwdArgs {
  const E* q;
  const E* k;
  const E* v;
  const float* lse;
  const float* delta;
  const float* d_o;  // o's strides
  float* dq;         // q's strides
  float* dk;         // k's strides
  float* dv;         // v's strides
  MaskArgs m;
  Index heads;
  Index q_row, q_head, k_row, k_head, v_row, v_head, o_row, o_head;
  int dqk, dv_width;
  float scale;
  bool accumulate_dv;
};

// ---- tile configurations ----------------------------------------------------------------------------

// Forward: BQ query rows x BK key rows per step. Shared: Q [BQ][DQK+1], K [BK][DQK+1],
// V [BK][DV], P [BQ][BK+1] (float).
template <int DQK, int DV>
struct FwdConfig {
  static constexpr int BQ = 64;
  static constexpr int BK = DV >= 256 ? 32 : 64;
  static constexpr int LDQ = DQK + 1, LDV = DV, LDP = BK + 1;
  static constexpr int smem_floats = BQ * LDQ + BK * LDQ + BK * LDV + BQ * LDP;
  static constexpr std::size_t smem_bytes = sizeof(float) * smem_floats;
};

// dK/dV: BM key rows kept, BN query rows per step. Shared: K [BM][DQK+1], V [BM][DV+1],
// Q [BN][DQK+1], dO [BN][DV+1], P^T and dS^T [BM][BN+1], lse and D [BN].
template <int DQK, int DV>
struct DkdvConfig {
  static constexpr int BM = 64;
  static constexpr int BN = DV >= 256 ? 32 : 64;
  static constexpr int LDK = DQK + 1, LDV = DV + 1, LDS = BN + 1;
  static constexpr int smem_floats = BM * LDK + BM * LDV + BN * LDK + BN * LDV + 2 * BM * LDS + 2 * BN;
  static constexpr std::size_t smem_bytes = sizeof(float) * smem_floats;
};

// dQ: BM query rows kept, BN key rows per step. Shared: Q [BM][DQK+1], dO [BM][DV+1],
// K [BN][DQK+1], V [BN][DV+1], dS [BM][BN+1].
template <int DQK, int DV>
struct DqConfig {
  static constexpr int BM = 64;
  static constexpr int BN = DV >= 256 ? 32 : 64;
  static constexpr int LDK = DQK + 1, LDV = DV + 1, LDS = BN + 1;
  static constexpr int smem_floats = BM * LDK + BM * LDV + BN * LDK + BN * LDV + BM * LDS;
  static constexpr std::size_t smem_bytes = sizeof(float) * smem_floats;
};

// ---- forward ----------------------------------------------------------------------------------------

template <class E, int DQK, int DV>
__global__ void __launch_bounds__(kThreads, 1) forward_kernel(const FwdArgs<E> a) {
  using C = FwdConfig<DQK, DV>;
  constexpr int BQ = C::BQ, BK = C::BK, LDQ = C::LDQ, LDV = C::LDV, LDP = C::LDP;
  constexpr int MI = BQ / kSide, NJ = BK / kSide, NC = DV / kSide;
  COUPLEDQK_DYNAMIC_SHARED(16, float, smem);
  float* const Qs = smem;
  float* const Ks = Qs + BQ * LDQ;
  float* const Vs = Ks + BK * LDQ;
  float* const Ps = Vs + BK * LDV;

  const int tx = static_cast<int>(threadIdx.x) % kSide, ty = static_cast<int>(threadIdx.x) / kSide;
  const Index bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
  const Index first = a.m.start(b), span = a.m.span(b), L = a.m.length(b);
  // the last query tiles have the most key tiles: they are launched first
  const Index i0 = Index(gridDim.y - 1 - blockIdx.y) * BQ;
  if (i0 >= span) return;  // past a packed sequence shorter than the longest
  const int nq = tile_rows(BQ, span - i0), nv = valid_rows(BQ, i0, L);  // rows; tokens among them
  const E* const q = a.q + (first + i0) * a.q_row + h * a.q_head;
  const E* const k = a.k + first * a.k_row + h * a.k_head;
  const E* const v = a.v + first * a.v_row + h * a.v_head;

  load_tile<BQ, DQK, LDQ>(Qs, q, a.q_row, nv, a.dqk);

  float m[MI], l[MI], acc[MI][NC];
#pragma unroll
  for (int i = 0; i < MI; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[i][c] = 0.0f;
  }

  // keys [kbegin, kend) are read by some row of this tile; the key tiles start at multiples of BK
  const Index kbegin = nv > 0 ? a.m.begin(i0) / BK * BK : 0, kend = nv > 0 ? a.m.end(i0 + nv - 1, L) : 0;
  for (Index j0 = kbegin; j0 < kend; j0 += BK) {
    const int nk = tile_rows(BK, L - j0);
    __syncthreads();  // the previous step is done with Ks, Vs, Ps
    load_tile<BK, DQK, LDQ>(Ks, k + j0 * a.k_row, a.k_row, nk, a.dqk);
    load_tile<BK, DV, LDV>(Vs, v + j0 * a.v_row, a.v_row, nk, a.dv);
    __syncthreads();

    // S = Q K^T (this thread: rows ty + 16 i, columns tx + 16 j)
    float s[MI][NJ];
    tile_product_nt<MI, NJ, DQK, LDQ, LDQ>(s, Qs, Ks, ty, tx);

    // online softmax, row by row
#pragma unroll
    for (int i = 0; i < MI; ++i) {
      const Index row = i0 + ty + kSide * i;
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        const Index col = j0 + tx + kSide * j;
        s[i][j] = a.m.visible(row, col, L) ? s[i][j] * a.scale : -INFINITY;
        mx = fmaxf(mx, s[i][j]);
      }
      mx = max16(mx);
      const float m_new = fmaxf(m[i], mx);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing visible yet
      const float alpha = expf(m[i] - m_use);                 // 0 on the first visible tile
      float rs = 0.0f;
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        const float p = expf(s[i][j] - m_use);  // masked: exp(-inf) = 0
        Ps[(ty + kSide * i) * LDP + tx + kSide * j] = p;
        rs += p;
      }
      l[i] = l[i] * alpha + rs;  // this thread's share of the row sum; alpha is the row's
      m[i] = m_new;
#pragma unroll
      for (int c = 0; c < NC; ++c) acc[i][c] *= alpha;
    }
    __syncthreads();

    // acc += P V (this thread: rows ty + 16 i, value columns tx + 16 c)
#pragma unroll 4
    for (int jj = 0; jj < nk; ++jj) {
      float pa[MI], vb[NC];
#pragma unroll
      for (int i = 0; i < MI; ++i) pa[i] = Ps[(ty + kSide * i) * LDP + jj];
#pragma unroll
      for (int c = 0; c < NC; ++c) vb[c] = Vs[jj * LDV + tx + kSide * c];
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int c = 0; c < NC; ++c) acc[i][c] = fmaf(pa[i], vb[c], acc[i][c]);
    }
  }

  E* const o = a.o + (first + i0) * a.o_row + h * a.o_head;
#pragma unroll
  for (int i = 0; i < MI; ++i) {
    const float lt = sum16(l[i]);
    const int r = ty + kSide * i;
    if (r < nq) {
      const bool token = r < nv;  // padding rows: o = 0, lse = 0
      const float inv = 1.0f / lt;
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        const int col = tx + kSide * c;
        if (col < a.dv) o[Index(r) * a.o_row + col] = from_float<E>(token ? acc[i][c] * inv : 0.0f);
      }
      if (tx == 0 && a.lse) a.lse[bh * a.m.seq + i0 + r] = token ? m[i] + logf(lt) : 0.0f;
    }
  }
}

// ---- backward: D = rowsum(dO * O) ---------------------------------------------------------------------

// One warp per (b, h, t); delta is [B, H, T] like lse. ROUND_DO: dO is read rounded to bf16, as
// the tensor-core kernels read it for dP, so that dP - D stays consistent (they cancel exactly in
// rowsum(dS) = 0; with T = 1, dS = dP - D = 0).
template <class E, bool ROUND_DO>
__global__ void __launch_bounds__(kThreads) delta_kernel(const E* __restrict__ o, const float* __restrict__ d_o,
                                                          float* __restrict__ delta, Index batch, const MaskArgs m,
                                                          Index heads, int dv, Index o_row, Index o_head) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const Index warps = Index(gridDim.x) * (kThreads / 32);
  const Index seq = m.seq, items = batch * heads * seq;
  for (Index w = Index(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32; w < items; w += warps) {
    const Index t = w % seq, bh = w / seq, b = bh / heads, h = bh % heads;
    if (t >= m.span(b)) continue;  // past a packed sequence shorter than the longest: never read
    const Index base = (m.start(b) + t) * o_row + h * o_head;
    float s = 0.0f;
    for (int c = lane; c < dv; c += 32) {
      float g = d_o[base + c];
      if constexpr (ROUND_DO) g = to_float(from_float<bf16>(g));
      s = fmaf(to_float(o[base + c]), g, s);
    }
    s = sum32(s);
    if (lane == 0) delta[w] = s;
  }
}

// ---- backward: dK, dV ----------------------------------------------------------------------------------

template <class E, int DQK, int DV>
__global__ void __launch_bounds__(kThreads, 1) dkdv_kernel(const BwdArgs<E> a) {
  using C = DkdvConfig<DQK, DV>;
  constexpr int BM = C::BM, BN = C::BN, LDK = C::LDK, LDV = C::LDV, LDS = C::LDS;
  constexpr int MI = BM / kSide, NJ = BN / kSide, NK = DQK / kSide, NV = DV / kSide;
  COUPLEDQK_DYNAMIC_SHARED(16, float, smem);
  float* const Ks = smem;
  float* const Vs = Ks + BM * LDK;
  float* const Qs = Vs + BM * LDV;
  float* const dOs = Qs + BN * LDK;
  float* const Pt = dOs + BN * LDV;
  float* const dSt = Pt + BM * LDS;
  float* const lse_s = dSt + BM * LDS;
  float* const dl_s = lse_s + BN;

  const int tx = static_cast<int>(threadIdx.x) % kSide, ty = static_cast<int>(threadIdx.x) / kSide;
  const Index bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
  const Index first = a.m.start(b), span = a.m.span(b), L = a.m.length(b);
  const Index j0 = Index(blockIdx.y) * BM;  // the first key tiles have the most query tiles
  if (j0 >= span) return;  // past a packed sequence shorter than the longest
  const int nk = tile_rows(BM, span - j0), nkv = valid_rows(BM, j0, L);  // rows; tokens among them
  const E* const q = a.q + first * a.q_row + h * a.q_head;
  const float* const d_o = a.d_o + first * a.o_row + h * a.o_head;
  const float* const lse = a.lse + bh * a.m.seq;
  const float* const delta = a.delta + bh * a.m.seq;

  load_tile<BM, DQK, LDK>(Ks, a.k + (first + j0) * a.k_row + h * a.k_head, a.k_row, nkv, a.dqk);
  load_tile<BM, DV, LDV>(Vs, a.v + (first + j0) * a.v_row + h * a.v_head, a.v_row, nkv, a.dv_width);

  float dk[MI][NK], dv[MI][NV];
#pragma unroll
  for (int i = 0; i < MI; ++i) {
#pragma unroll
    for (int c = 0; c < NK; ++c) dk[i][c] = 0.0f;
#pragma unroll
    for (int c = 0; c < NV; ++c) dv[i][c] = 0.0f;
  }

  // the query tiles that read these keys (causal: at or below the diagonal); padding keys: none,
  // so their dK, dV are written 0
  const Index qbegin = nkv > 0 ? a.m.first_query(j0) / BN * BN : 0;
  const Index qend = nkv > 0 ? a.m.query_end(j0 + nkv - 1, L) : 0;
  for (Index i0 = qbegin; i0 < qend; i0 += BN) {
    const int nq = tile_rows(BN, L - i0);
    __syncthreads();  // the previous step is done with Qs, dOs, Pt, dSt, lse_s, dl_s
    load_tile<BN, DQK, LDK>(Qs, q + i0 * a.q_row, a.q_row, nq, a.dqk);
    load_tile<BN, DV, LDV>(dOs, d_o + i0 * a.o_row, a.o_row, nq, a.dv_width);
    for (int t = static_cast<int>(threadIdx.x); t < BN; t += kThreads) {
      lse_s[t] = t < nq ? lse[i0 + t] : 0.0f;
      dl_s[t] = t < nq ? delta[i0 + t] : 0.0f;
    }
    __syncthreads();

    // S^T = K Q^T and dP^T = V dO^T (this thread: key rows ty + 16 i, query columns tx + 16 j)
    float st[MI][NJ], dpt[MI][NJ];
    tile_product_nt<MI, NJ, DQK, LDK, LDK>(st, Ks, Qs, ty, tx);
    tile_product_nt<MI, NJ, DV, LDV, LDV>(dpt, Vs, dOs, ty, tx);

    // P^T = exp(scale S^T - lse), dS^T = P^T * (dP^T - D), masked
#pragma unroll
    for (int i = 0; i < MI; ++i) {
      const Index key = j0 + ty + kSide * i;
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        const int qj = tx + kSide * j;
        const Index qi = i0 + qj;
        const float p = a.m.visible(qi, key, L) ? expf(st[i][j] * a.scale - lse_s[qj]) : 0.0f;
        Pt[(ty + kSide * i) * LDS + qj] = p;
        dSt[(ty + kSide * i) * LDS + qj] = p * (dpt[i][j] - dl_s[qj]);
      }
    }
    __syncthreads();

    // dV += P^T dO, dK += dS^T Q (this thread: key rows ty + 16 i, columns tx + 16 c)
#pragma unroll 2
    for (int jj = 0; jj < nq; ++jj) {
      float pa[MI], sa[MI];
#pragma unroll
      for (int i = 0; i < MI; ++i) {
        pa[i] = Pt[(ty + kSide * i) * LDS + jj];
        sa[i] = dSt[(ty + kSide * i) * LDS + jj];
      }
#pragma unroll
      for (int c = 0; c < NV; ++c) {
        const float ob = dOs[jj * LDV + tx + kSide * c];
#pragma unroll
        for (int i = 0; i < MI; ++i) dv[i][c] = fmaf(pa[i], ob, dv[i][c]);
      }
#pragma unroll
      for (int c = 0; c < NK; ++c) {
        const float qb = Qs[jj * LDK + tx + kSide * c];
#pragma unroll
        for (int i = 0; i < MI; ++i) dk[i][c] = fmaf(sa[i], qb, dk[i][c]);
      }
    }
  }

  float* const dk_out = a.dk + (first + j0) * a.k_row + h * a.k_head;
  float* const dv_out = a.dv + (first + j0) * a.v_row + h * a.v_head;
#pragma unroll
  for (int i = 0; i < MI; ++i) {
    const int r = ty + kSide * i;
    if (r >= nk) continue;
#pragma unroll
    for (int c = 0; c < NK; ++c) {
      const int col = tx + kSide * c;
      if (col < a.dqk) dk_out[Index(r) * a.k_row + col] = dk[i][c] * a.scale;
    }
#pragma unroll
    for (int c = 0; c < NV; ++c) {
      const int col = tx + kSide * c;
      if (col < a.dv_width) {
        float* const p = dv_out + Index(r) * a.v_row + col;
        *p = a.accumulate_dv ? *p + dv[i][c] : dv[i][c];
      }
    }
  }
}

// ---- backward: dQ ----------------------------------------------------------------------------------------

template <class E, int DQK, int DV>
__global__ void __launch_bounds__(kThreads, 1) dq_kernel(const BwdArgs<E> a) {
  using C = DqConfig<DQK, DV>;
  constexpr int BM = C::BM, BN = C::BN, LDK = C::LDK, LDV = C::LDV, LDS = C::LDS;
  constexpr int MI = BM / kSide, NJ = BN / kSide, NK = DQK / kSide;
  COUPLEDQK_DYNAMIC_SHARED(16, float, smem);
  float* const Qs = smem;
  float* const dOs = Qs + BM * LDK;
  float* const Ks = dOs + BM * LDV;
  float* const Vs = Ks + BN * LDK;
  float* const dSs = Vs + BN * LDV;

  const int tx = static_cast<int>(threadIdx.x) % kSide, ty = static_cast<int>(threadIdx.x) / kSide;
  const Index bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
  const Index first = a.m.start(b), span = a.m.span(b), L = a.m.length(b);
  const Index i0 = Index(gridDim.y - 1 - blockIdx.y) * BM;  // heaviest tiles first
  if (i0 >= span) return;  // past a packed sequence shorter than the longest
  const int nq = tile_rows(BM, span - i0), nv = valid_rows(BM, i0, L);  // rows; tokens among them
  const E* const k = a.k + first * a.k_row + h * a.k_head;
  const E* const v = a.v + first * a.v_row + h * a.v_head;

  load_tile<BM, DQK, LDK>(Qs, a.q + (first + i0) * a.q_row + h * a.q_head, a.q_row, nv, a.dqk);
  load_tile<BM, DV, LDV>(dOs, a.d_o + (first + i0) * a.o_row + h * a.o_head, a.o_row, nv, a.dv_width);

  float lse_r[MI], dl_r[MI], dq[MI][NK];
#pragma unroll
  for (int i = 0; i < MI; ++i) {
    const int r = ty + kSide * i;
    lse_r[i] = r < nv ? a.lse[bh * a.m.seq + i0 + r] : 0.0f;
    dl_r[i] = r < nv ? a.delta[bh * a.m.seq + i0 + r] : 0.0f;
#pragma unroll
    for (int c = 0; c < NK; ++c) dq[i][c] = 0.0f;
  }

  // the forward's key tiles; padding rows read none, so their dQ is written 0
  const Index kbegin = nv > 0 ? a.m.begin(i0) / BN * BN : 0, kend = nv > 0 ? a.m.end(i0 + nv - 1, L) : 0;
  for (Index j0 = kbegin; j0 < kend; j0 += BN) {
    const int nk = tile_rows(BN, L - j0);
    __syncthreads();  // the previous step is done with Ks, Vs, dSs
    load_tile<BN, DQK, LDK>(Ks, k + j0 * a.k_row, a.k_row, nk, a.dqk);
    load_tile<BN, DV, LDV>(Vs, v + j0 * a.v_row, a.v_row, nk, a.dv_width);
    __syncthreads();

    // S = Q K^T and dP = dO V^T (this thread: query rows ty + 16 i, key columns tx + 16 j)
    float s[MI][NJ], dp[MI][NJ];
    tile_product_nt<MI, NJ, DQK, LDK, LDK>(s, Qs, Ks, ty, tx);
    tile_product_nt<MI, NJ, DV, LDV, LDV>(dp, dOs, Vs, ty, tx);

#pragma unroll
    for (int i = 0; i < MI; ++i) {
      const Index row = i0 + ty + kSide * i;
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        const Index col = j0 + tx + kSide * j;
        const float p = a.m.visible(row, col, L) ? expf(s[i][j] * a.scale - lse_r[i]) : 0.0f;
        dSs[(ty + kSide * i) * LDS + tx + kSide * j] = p * (dp[i][j] - dl_r[i]);
      }
    }
    __syncthreads();

    // dQ += dS K (this thread: query rows ty + 16 i, columns tx + 16 c)
#pragma unroll 4
    for (int jj = 0; jj < nk; ++jj) {
      float sa[MI];
#pragma unroll
      for (int i = 0; i < MI; ++i) sa[i] = dSs[(ty + kSide * i) * LDS + jj];
#pragma unroll
      for (int c = 0; c < NK; ++c) {
        const float kb = Ks[jj * LDK + tx + kSide * c];
#pragma unroll
        for (int i = 0; i < MI; ++i) dq[i][c] = fmaf(sa[i], kb, dq[i][c]);
      }
    }
  }

  float* const dq_out = a.dq + (first + i0) * a.q_row + h * a.q_head;
#pragma unroll
  for (int i = 0; i < MI; ++i) {
    const int r = ty + kSide * i;
    if (r >= nq) continue;
#pragma unroll
    for (int c = 0; c < NK; ++c) {
      const int col = tx + kSide * c;
      if (col < a.dqk) dq_out[Index(r) * a.q_row + col] = dq[i][c] * a.scale;
    }
  }
}

// ---- tensor-core path (bf16 storage, nvcuda::wmma, sm_80+) ---------------------------------------------
//
// The same three passes with 16x16x16 bf16 fragments and float accumulators, 4 warps per block,
// each warp owning 16 of the 64 rows a block keeps; the 64 rows streamed per step are shared.
// Shared tiles are bf16 (rows padded by 8 elements), plus a float scratch per warp where the
// fragments are stored to be read element-wise (masking, softmax, dS). The operands of the
// second products are rounded to bf16 as FlashAttention does: P for P V and P^T dO, dS for dS K and
// dS^T Q, and the float cotangent dO. Used for DV <= 128 (the accumulators of dK and dV stay in
// registers); wider values (Differential with d > 64) take the FMA kernels.

constexpr int kTcWarps = 4;
constexpr int kTcThreads = 32 * kTcWarps;

constexpr std::size_t align128(std::size_t bytes) { return (bytes + 127) / 128 * 128; }

template <int DQK, int DV>
struct TcConfig {
  static constexpr int BM = 16 * kTcWarps;  // rows kept by a block (16 per warp)
  static constexpr int BN = 64;             // rows streamed per step
  static constexpr int LDK = DQK + 8, LDV = DV + 8, LDP = BN + 8;  // bf16 leading dimensions
  static constexpr int FCOLS = (2 * BN > DV ? (2 * BN > DQK ? 2 * BN : DQK) : (DV > DQK ? DV : DQK));
  static constexpr int LDF = FCOLS + 4;  // float scratch
  static constexpr std::size_t bf16_tile(int rows, int ld) { return align128(sizeof(bf16) * rows * ld); }
  static constexpr std::size_t scratch = align128(sizeof(float) * BM * LDF);
  // forward: Q [BM][LDK], K [BN][LDK], V [BN][LDV], P [BM][LDP], scratch
  static constexpr std::size_t fwd_bytes =
      bf16_tile(BM, LDK) + bf16_tile(BN, LDK) + bf16_tile(BN, LDV) + bf16_tile(BM, LDP) + scratch;
  // dK/dV: K [BM][LDK], V [BM][LDV], Q [BN][LDK], dO [BN][LDV], P^T, dS^T [BM][LDP], scratch, lse, D
  static constexpr std::size_t dkdv_bytes = bf16_tile(BM, LDK) + bf16_tile(BM, LDV) + bf16_tile(BN, LDK) +
                                            bf16_tile(BN, LDV) + 2 * bf16_tile(BM, LDP) + scratch +
                                            align128(sizeof(float) * 2 * BN);
  // dQ: Q [BM][LDK], dO [BM][LDV], K [BN][LDK], V [BN][LDV], dS [BM][LDP], scratch
  static constexpr std::size_t dq_bytes = bf16_tile(BM, LDK) + bf16_tile(BM, LDV) + bf16_tile(BN, LDK) +
                                          bf16_tile(BN, LDV) + bf16_tile(BM, LDP) + scratch;
};

// Carves consecutive 128-byte-aligned regions out of the dynamic shared memory.
struct SmemCarver {
  unsigned char* p;
  template <class X>
  __device__ __forceinline__ X* take(std::size_t count) {
    X* const out = reinterpret_cast<X*>(p);
    p += align128(sizeof(X) * count);
    return out;
  }
};

// dst[r * LD + c] = bf16(src[r * row_stride + c]) for r < nrows, c < ncols; 0 elsewhere in the
// ROWS x COLS tile (the padding columns COLS..LD-1 are never read).
template <int ROWS, int COLS, int LD, class E>
__device__ __forceinline__ void load_tile_bf16(bf16* __restrict__ dst, const E* __restrict__ src, Index row_stride,
                                               int nrows, int ncols) {
  static_assert((ROWS * COLS) % kTcThreads == 0, "tile size must be a multiple of the block size");
#pragma unroll 8
  for (int it = 0; it < ROWS * COLS / kTcThreads; ++it) {
    const int idx = it * kTcThreads + static_cast<int>(threadIdx.x);
    const int r = idx / COLS, c = idx % COLS;
    bf16 x = from_float<bf16>(0.0f);
    if (r < nrows && c < ncols) {
      if constexpr (std::is_same_v<E, bf16>)
        x = src[Index(r) * row_stride + c];
      else
        x = from_float<bf16>(src[Index(r) * row_stride + c]);
    }
    dst[r * LD + c] = x;
  }
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define COUPLEDQK_FLASH_TC_BODY 1
#else
#define COUPLEDQK_FLASH_TC_BODY 0
#endif

namespace wmma = nvcuda::wmma;
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// C[16 x 16] = sum_k A[16 x K] B[K x 16], B read as the transpose of a row-major [16][K] tile
// (col_major matrix_b): the products X Y^T of the attention.
template <int K>
__device__ __forceinline__ void mma_abt(FragC& c, const bf16* a, int lda, const bf16* b, int ldb) {
  wmma::fill_fragment(c, 0.0f);
#pragma unroll 2
  for (int kk = 0; kk < K / 16; ++kk) {
    FragA fa;
    FragBCol fb;
    wmma::load_matrix_sync(fa, a + kk * 16, lda);
    wmma::load_matrix_sync(fb, b + kk * 16, ldb);
    wmma::mma_sync(c, fa, fb, c);
  }
}
// C[16 x 16] += sum_k A[16 x K] B[K x 16], B row-major: the products X Y.
template <int K>
__device__ __forceinline__ void mma_ab_acc(FragC& c, const bf16* a, int lda, const bf16* b, int ldb) {
#pragma unroll 2
  for (int kk = 0; kk < K / 16; ++kk) {
    FragA fa;
    FragBRow fb;
    wmma::load_matrix_sync(fa, a + kk * 16, lda);
    wmma::load_matrix_sync(fb, b + Index(kk) * 16 * ldb, ldb);
    wmma::mma_sync(c, fa, fb, c);
  }
}

// Element-wise work on a warp's 16-row slab: lane -> row lane / 2, columns (lane % 2) + 2 t.

template <int DQK, int DV>
__global__ void __launch_bounds__(kTcThreads, 1) tc_forward_kernel(const FwdArgs<bf16> a) {
#if COUPLEDQK_FLASH_TC_BODY
  using C = TcConfig<DQK, DV>;
  constexpr int BM = C::BM, BN = C::BN, LDK = C::LDK, LDV = C::LDV, LDP = C::LDP, LDF = C::LDF;
  constexpr int NS = BN / 2, NC = DV / 2;
  COUPLEDQK_DYNAMIC_SHARED(128, unsigned char, tc_smem);
  SmemCarver carve{tc_smem};
  bf16* const Qs = carve.take<bf16>(BM * LDK);
  bf16* const Ks = carve.take<bf16>(BN * LDK);
  bf16* const Vs = carve.take<bf16>(BN * LDV);
  bf16* const Ps = carve.take<bf16>(BM * LDP);
  float* const F = carve.take<float>(BM * LDF);

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int wrow = 16 * warp, r = lane / 2, half = lane % 2;
  const Index bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
  const Index first = a.m.start(b), span = a.m.span(b), L = a.m.length(b);
  const Index i0 = Index(gridDim.y - 1 - blockIdx.y) * BM;  // heaviest tiles first
  if (i0 >= span) return;  // past a packed sequence shorter than the longest
  const int nq = tile_rows(BM, span - i0), nv = valid_rows(BM, i0, L);  // rows; tokens among them
  const bf16* const k = a.k + first * a.k_row + h * a.k_head;
  const bf16* const v = a.v + first * a.v_row + h * a.v_head;
  load_tile_bf16<BM, DQK, LDK>(Qs, a.q + (first + i0) * a.q_row + h * a.q_head, a.q_row, nv, a.dqk);

  float* const Fw = F + wrow * LDF;
  bf16* const Pw = Ps + wrow * LDP;
  const Index row = i0 + wrow + r;
  float m = -INFINITY, l = 0.0f, acc[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) acc[c] = 0.0f;

  const Index kbegin = nv > 0 ? a.m.begin(i0) / BN * BN : 0, kend = nv > 0 ? a.m.end(i0 + nv - 1, L) : 0;
  for (Index j0 = kbegin; j0 < kend; j0 += BN) {
    const int nk = tile_rows(BN, L - j0);
    __syncthreads();  // every warp is done with Ks, Vs
    load_tile_bf16<BN, DQK, LDK>(Ks, k + j0 * a.k_row, a.k_row, nk, a.dqk);
    load_tile_bf16<BN, DV, LDV>(Vs, v + j0 * a.v_row, a.v_row, nk, a.dv);
    __syncthreads();

    // S = Q_w K^T -> Fw[:, 0:BN]
#pragma unroll 1
    for (int n = 0; n < BN / 16; ++n) {
      FragC s;
      mma_abt<DQK>(s, Qs + wrow * LDK, LDK, Ks + n * 16 * LDK, LDK);
      wmma::store_matrix_sync(Fw + n * 16, s, LDF, wmma::mem_row_major);
    }
    __syncwarp();

    // online softmax on row r (two lanes per row)
    float sv[NS];
    float mx = -INFINITY;
#pragma unroll
    for (int t = 0; t < NS; ++t) {
      const int cj = half + 2 * t;
      const Index col = j0 + cj;
      sv[t] = a.m.visible(row, col, L) ? Fw[r * LDF + cj] * a.scale : -INFINITY;
      mx = fmaxf(mx, sv[t]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_new = fmaxf(m, mx);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;
    const float alpha = expf(m - m_use);
    float rs = 0.0f;
#pragma unroll
    for (int t = 0; t < NS; ++t) {
      const float p = expf(sv[t] - m_use);
      Pw[r * LDP + half + 2 * t] = from_float<bf16>(p);
      rs += p;
    }
    l = l * alpha + rs;
    m = m_new;
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[c] *= alpha;
    __syncwarp();

    // P V -> Fw[:, 0:DV], added to the accumulator
#pragma unroll 1
    for (int c = 0; c < DV / 16; ++c) {
      FragC o;
      wmma::fill_fragment(o, 0.0f);
      mma_ab_acc<BN>(o, Pw, LDP, Vs + c * 16, LDV);
      wmma::store_matrix_sync(Fw + c * 16, o, LDF, wmma::mem_row_major);
    }
    __syncwarp();
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[c] += Fw[r * LDF + half + 2 * c];
    __syncwarp();
  }

  const float lt = l + __shfl_xor_sync(0xffffffffu, l, 1);
  if (wrow + r < nq) {
    const bool token = wrow + r < nv;  // padding rows: o = 0, lse = 0
    bf16* const o = a.o + (first + row) * a.o_row + h * a.o_head;
    const float inv = 1.0f / lt;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int col = half + 2 * c;
      if (col < a.dv) o[col] = from_float<bf16>(token ? acc[c] * inv : 0.0f);
    }
    if (half == 0 && a.lse) a.lse[bh * a.m.seq + row] = token ? m + logf(lt) : 0.0f;
  }
#else
  (void)a;
  __trap();
#endif
}

template <int DQK, int DV>
__global__ void __launch_bounds__(kTcThreads, 1) tc_dkdv_kernel(const BwdArgs<bf16> a) {
#if COUPLEDQK_FLASH_TC_BODY
  using C = TcConfig<DQK, DV>;
  constexpr int BM = C::BM, BN = C::BN, LDK = C::LDK, LDV = C::LDV, LDP = C::LDP, LDF = C::LDF;
  constexpr int NK = DQK / 16, NV = DV / 16;
  COUPLEDQK_DYNAMIC_SHARED(128, unsigned char, tc_smem);
  SmemCarver carve{tc_smem};
  bf16* const Ks = carve.take<bf16>(BM * LDK);
  bf16* const Vs = carve.take<bf16>(BM * LDV);
  bf16* const Qs = carve.take<bf16>(BN * LDK);
  bf16* const dOs = carve.take<bf16>(BN * LDV);
  bf16* const Pt = carve.take<bf16>(BM * LDP);
  bf16* const dSt = carve.take<bf16>(BM * LDP);
  float* const F = carve.take<float>(BM * LDF);
  float* const lse_s = carve.take<float>(2 * BN);
  float* const dl_s = lse_s + BN;

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int wrow = 16 * warp, r = lane / 2, half = lane % 2;
  const Index bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
  const Index first = a.m.start(b), span = a.m.span(b), L = a.m.length(b);
  const Index j0 = Index(blockIdx.y) * BM;
  if (j0 >= span) return;  // past a packed sequence shorter than the longest
  const int nk = tile_rows(BM, span - j0), nkv = valid_rows(BM, j0, L);  // rows; tokens among them
  const bf16* const q = a.q + first * a.q_row + h * a.q_head;
  const float* const d_o = a.d_o + first * a.o_row + h * a.o_head;
  load_tile_bf16<BM, DQK, LDK>(Ks, a.k + (first + j0) * a.k_row + h * a.k_head, a.k_row, nkv, a.dqk);
  load_tile_bf16<BM, DV, LDV>(Vs, a.v + (first + j0) * a.v_row + h * a.v_head, a.v_row, nkv, a.dv_width);

  float* const Fw = F + wrow * LDF;
  bf16* const Pw = Pt + wrow * LDP;
  bf16* const Sw = dSt + wrow * LDP;
  const Index key = j0 + wrow + r;
  FragC dk[NK], dv[NV];
#pragma unroll
  for (int c = 0; c < NK; ++c) wmma::fill_fragment(dk[c], 0.0f);
#pragma unroll
  for (int c = 0; c < NV; ++c) wmma::fill_fragment(dv[c], 0.0f);

  // the query tiles that read these keys; padding keys: none, so their dK, dV are written 0
  const Index qbegin = nkv > 0 ? a.m.first_query(j0) / BN * BN : 0;
  const Index qend = nkv > 0 ? a.m.query_end(j0 + nkv - 1, L) : 0;
  for (Index i0 = qbegin; i0 < qend; i0 += BN) {
    const int nq = tile_rows(BN, L - i0);
    __syncthreads();  // every warp is done with Qs, dOs, lse_s, dl_s
    load_tile_bf16<BN, DQK, LDK>(Qs, q + i0 * a.q_row, a.q_row, nq, a.dqk);
    load_tile_bf16<BN, DV, LDV>(dOs, d_o + i0 * a.o_row, a.o_row, nq, a.dv_width);
    for (int t = static_cast<int>(threadIdx.x); t < BN; t += kTcThreads) {
      lse_s[t] = t < nq ? a.lse[bh * a.m.seq + i0 + t] : 0.0f;
      dl_s[t] = t < nq ? a.delta[bh * a.m.seq + i0 + t] : 0.0f;
    }
    __syncthreads();

    // S^T = K_w Q^T -> Fw[:, 0:BN], dP^T = V_w dO^T -> Fw[:, BN:2BN]
#pragma unroll 1
    for (int n = 0; n < BN / 16; ++n) {
      FragC s;
      mma_abt<DQK>(s, Ks + wrow * LDK, LDK, Qs + n * 16 * LDK, LDK);
      wmma::store_matrix_sync(Fw + n * 16, s, LDF, wmma::mem_row_major);
      mma_abt<DV>(s, Vs + wrow * LDV, LDV, dOs + n * 16 * LDV, LDV);
      wmma::store_matrix_sync(Fw + BN + n * 16, s, LDF, wmma::mem_row_major);
    }
    __syncwarp();
    // P^T = exp(scale S^T - lse), dS^T = P^T (dP^T - D), masked
#pragma unroll 8
    for (int t = 0; t < BN / 2; ++t) {
      const int qj = half + 2 * t;
      const Index qi = i0 + qj;
      const float p = a.m.visible(qi, key, L) ? expf(Fw[r * LDF + qj] * a.scale - lse_s[qj]) : 0.0f;
      Pw[r * LDP + qj] = from_float<bf16>(p);
      Sw[r * LDP + qj] = from_float<bf16>(p * (Fw[r * LDF + BN + qj] - dl_s[qj]));
    }
    __syncwarp();
    // dV_w += P^T dO, dK_w += dS^T Q
#pragma unroll
    for (int c = 0; c < NV; ++c) mma_ab_acc<BN>(dv[c], Pw, LDP, dOs + c * 16, LDV);
#pragma unroll
    for (int c = 0; c < NK; ++c) mma_ab_acc<BN>(dk[c], Sw, LDP, Qs + c * 16, LDK);
  }

  // out through the scratch: dK (scaled), then dV
  const bool in_range = wrow + r < nk;
  __syncwarp();
#pragma unroll
  for (int c = 0; c < NK; ++c) wmma::store_matrix_sync(Fw + c * 16, dk[c], LDF, wmma::mem_row_major);
  __syncwarp();
  if (in_range) {
    float* const out = a.dk + (first + key) * a.k_row + h * a.k_head;
#pragma unroll
    for (int t = 0; t < DQK / 2; ++t) {
      const int col = half + 2 * t;
      if (col < a.dqk) out[col] = Fw[r * LDF + col] * a.scale;
    }
  }
  __syncwarp();
#pragma unroll
  for (int c = 0; c < NV; ++c) wmma::store_matrix_sync(Fw + c * 16, dv[c], LDF, wmma::mem_row_major);
  __syncwarp();
  if (in_range) {
    float* const out = a.dv + (first + key) * a.v_row + h * a.v_head;
#pragma unroll
    for (int t = 0; t < DV / 2; ++t) {
      const int col = half + 2 * t;
      if (col < a.dv_width) out[col] = a.accumulate_dv ? out[col] + Fw[r * LDF + col] : Fw[r * LDF + col];
    }
  }
#else
  (void)a;
  __trap();
#endif
}

template <int DQK, int DV>
__global__ void __launch_bounds__(kTcThreads, 1) tc_dq_kernel(const BwdArgs<bf16> a) {
#if COUPLEDQK_FLASH_TC_BODY
  using C = TcConfig<DQK, DV>;
  constexpr int BM = C::BM, BN = C::BN, LDK = C::LDK, LDV = C::LDV, LDP = C::LDP, LDF = C::LDF;
  constexpr int NK = DQK / 16;
  COUPLEDQK_DYNAMIC_SHARED(128, unsigned char, tc_smem);
  SmemCarver carve{tc_smem};
  bf16* const Qs = carve.take<bf16>(BM * LDK);
  bf16* const dOs = carve.take<bf16>(BM * LDV);
  bf16* const Ks = carve.take<bf16>(BN * LDK);
  bf16* const Vs = carve.take<bf16>(BN * LDV);
  bf16* const dSs = carve.take<bf16>(BM * LDP);
  float* const F = carve.take<float>(BM * LDF);

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int wrow = 16 * warp, r = lane / 2, half = lane % 2;
  const Index bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
  const Index first = a.m.start(b), span = a.m.span(b), L = a.m.length(b);
  const Index i0 = Index(gridDim.y - 1 - blockIdx.y) * BM;  // heaviest tiles first
  if (i0 >= span) return;  // past a packed sequence shorter than the longest
  const int nq = tile_rows(BM, span - i0), nv = valid_rows(BM, i0, L);  // rows; tokens among them
  const bf16* const k = a.k + first * a.k_row + h * a.k_head;
  const bf16* const v = a.v + first * a.v_row + h * a.v_head;
  load_tile_bf16<BM, DQK, LDK>(Qs, a.q + (first + i0) * a.q_row + h * a.q_head, a.q_row, nv, a.dqk);
  load_tile_bf16<BM, DV, LDV>(dOs, a.d_o + (first + i0) * a.o_row + h * a.o_head, a.o_row, nv, a.dv_width);

  float* const Fw = F + wrow * LDF;
  bf16* const Sw = dSs + wrow * LDP;
  const Index row = i0 + wrow + r;
  const bool in_range = wrow + r < nq, token = wrow + r < nv;
  const float lse_r = token ? a.lse[bh * a.m.seq + row] : 0.0f;
  const float dl_r = token ? a.delta[bh * a.m.seq + row] : 0.0f;
  FragC dq[NK];
#pragma unroll
  for (int c = 0; c < NK; ++c) wmma::fill_fragment(dq[c], 0.0f);

  // the forward's key tiles; padding rows read none, so their dQ is written 0
  const Index kbegin = nv > 0 ? a.m.begin(i0) / BN * BN : 0, kend = nv > 0 ? a.m.end(i0 + nv - 1, L) : 0;
  for (Index j0 = kbegin; j0 < kend; j0 += BN) {
    const int nk = tile_rows(BN, L - j0);
    __syncthreads();  // every warp is done with Ks, Vs
    load_tile_bf16<BN, DQK, LDK>(Ks, k + j0 * a.k_row, a.k_row, nk, a.dqk);
    load_tile_bf16<BN, DV, LDV>(Vs, v + j0 * a.v_row, a.v_row, nk, a.dv_width);
    __syncthreads();

    // S = Q_w K^T -> Fw[:, 0:BN], dP = dO_w V^T -> Fw[:, BN:2BN]
#pragma unroll 1
    for (int n = 0; n < BN / 16; ++n) {
      FragC s;
      mma_abt<DQK>(s, Qs + wrow * LDK, LDK, Ks + n * 16 * LDK, LDK);
      wmma::store_matrix_sync(Fw + n * 16, s, LDF, wmma::mem_row_major);
      mma_abt<DV>(s, dOs + wrow * LDV, LDV, Vs + n * 16 * LDV, LDV);
      wmma::store_matrix_sync(Fw + BN + n * 16, s, LDF, wmma::mem_row_major);
    }
    __syncwarp();
#pragma unroll 8
    for (int t = 0; t < BN / 2; ++t) {
      const int cj = half + 2 * t;
      const Index col = j0 + cj;
      const float p = a.m.visible(row, col, L) ? expf(Fw[r * LDF + cj] * a.scale - lse_r) : 0.0f;
      Sw[r * LDP + cj] = from_float<bf16>(p * (Fw[r * LDF + BN + cj] - dl_r));
    }
    __syncwarp();
    // dQ_w += dS K
#pragma unroll
    for (int c = 0; c < NK; ++c) mma_ab_acc<BN>(dq[c], Sw, LDP, Ks + c * 16, LDK);
  }

  __syncwarp();
#pragma unroll
  for (int c = 0; c < NK; ++c) wmma::store_matrix_sync(Fw + c * 16, dq[c], LDF, wmma::mem_row_major);
  __syncwarp();
  if (in_range) {
    float* const out = a.dq + (first + row) * a.q_row + h * a.q_head;
#pragma unroll
    for (int t = 0; t < DQK / 2; ++t) {
      const int col = half + 2 * t;
      if (col < a.dqk) out[col] = Fw[r * LDF + col] * a.scale;
    }
  }
#else
  (void)a;
  __trap();
#endif
}

#undef COUPLEDQK_FLASH_TC_BODY

// ---- host side ----------------------------------------------------------------------------------------

inline int width_bucket(Index n) { return n <= 32 ? 32 : n <= 64 ? 64 : n <= 128 ? 128 : 256; }

template <int N>
using int_ = std::integral_constant<int, N>;

// Calls f(int_<DQK>, int_<DV>) with the compile-time widths for (dqk, dv):
// DQK = max(bucket(dqk), bucket(dv)/2) in {32, 64, 128}, DV = max(bucket(dv), DQK) in {DQK, 2 DQK}.
template <class F>
void dispatch_widths(Index dqk, Index dv, F&& f) {
  const int bq = width_bucket(dqk), bv = width_bucket(dv);
  const int DQK = bq > bv / 2 ? bq : bv / 2;
  const bool wide = bv > DQK;  // DV = 2 DQK
  switch (DQK) {
    case 32: return wide ? f(int_<32>{}, int_<64>{}) : f(int_<32>{}, int_<32>{});
    case 64: return wide ? f(int_<64>{}, int_<128>{}) : f(int_<64>{}, int_<64>{});
    default: return wide ? f(int_<128>{}, int_<256>{}) : f(int_<128>{}, int_<128>{});
  }
}

[[noreturn]] inline void fail(const char* who, const std::string& what) {
  throw ::coupledqk::invalid_argument(std::string("coupledqk::cuda::") + who + ": " + what);
}

inline void validate(const FlashLayout& l, const char* who) {
  if (l.batch < 0 || l.seq < 0 || l.heads < 0)
    fail(who, "batch, seq and heads must be >= 0; got batch = " + std::to_string(l.batch) +
                  ", seq = " + std::to_string(l.seq) + ", heads = " + std::to_string(l.heads));
  if (l.dqk < 1 || l.dqk > flash_max_dqk)
    fail(who, "dqk = " + std::to_string(l.dqk) + " is not supported; accepted: 1 <= dqk <= " +
                  std::to_string(flash_max_dqk));
  if (l.dv < 1 || l.dv > flash_max_dv)
    fail(who, "dv = " + std::to_string(l.dv) + " is not supported; accepted: 1 <= dv <= " +
                  std::to_string(flash_max_dv));
  if (!std::isfinite(l.scale)) fail(who, "scale must be finite; got " + std::to_string(l.scale));
  if (l.q_row < 0 || l.q_head < 0 || l.k_row < 0 || l.k_head < 0 || l.v_row < 0 || l.v_head < 0 ||
      l.o_row < 0 || l.o_head < 0)
    fail(who, "strides must be >= 0");
  if (l.batch * l.heads > Index(std::numeric_limits<int>::max()))
    fail(who, "batch * heads = " + std::to_string(l.batch * l.heads) + " exceeds the grid limit (2^31 - 1)");
  if ((l.seq + 31) / 32 > 65535)
    fail(who, "seq = " + std::to_string(l.seq) + " exceeds the grid limit (65535 tiles of 32 rows)");
  if (l.mask.window < 0)
    fail(who, "mask window must be >= 0 (0 means no window); got " + std::to_string(l.mask.window));
  if (l.mask.lengths && l.mask.offsets)
    fail(who, "the mask holds both padded lengths and packed offsets; give one of them (or neither: B equal "
              "sequences of seq rows)");
  if (l.mask.offsets && l.mask.rows < 1)
    fail(who, "packed sequences need their number of rows (FlashMask::rows = offsets[B]); got " +
                  std::to_string(l.mask.rows));
}

inline MaskArgs mask_args(const FlashLayout& l) {
  MaskArgs m;
  m.seq = l.seq;
  m.window = l.mask.window;
  m.lengths = l.mask.lengths;
  m.offsets = l.mask.offsets;
  m.causal = l.mask.causal;
  return m;
}

inline bool empty(const FlashLayout& l) { return l.batch == 0 || l.seq == 0 || l.heads == 0; }

inline unsigned tiles(Index n, int tile) { return static_cast<unsigned>((n + tile - 1) / tile); }

template <class Kernel>
void set_smem(Kernel kernel, std::size_t bytes) {
  COUPLEDQK_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

/// D [B, H, T] of the backward: one per host thread, grown on demand (see the header comment).
inline DeviceBuffer<float>& delta_scratch() {
  thread_local DeviceBuffer<float> buffer;
  return buffer;
}

/// Which kernels run: `automatic` takes the tensor-core ones where they apply (bf16 storage,
/// dv <= 128, code built for sm_80 or later, COUPLEDQK_FLASH_TENSOR_CORES not 0) and the FMA ones
/// otherwise; the other two force a choice (tests compare them), tensor_cores throwing where it
/// does not apply.
enum class Kernels { automatic, fma, tensor_cores };

/// Whether a tensor-core kernel was compiled for sm_80 or later (otherwise its body traps).
template <class Kernel>
bool has_tensor_core_body(Kernel kernel) {
  cudaFuncAttributes attr{};
  COUPLEDQK_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  return attr.ptxVersion >= 80;
}

template <class E, int DV>
constexpr bool tensor_cores_apply() {
  return COUPLEDQK_FLASH_TENSOR_CORES != 0 && std::is_same_v<E, bf16> && DV <= 128;
}

[[noreturn]] inline void no_tensor_cores(const char* who, const FlashLayout& l) {
  fail(who, "the tensor-core kernels need bf16 storage, dv <= 128 (got dv = " + std::to_string(l.dv) +
                ") and code built for sm_80 or later");
}

template <class E>
void forward(const FlashLayout& l, const E* q, const E* k, const E* v, E* o, float* lse, Kernels kernels,
             cudaStream_t stream) {
  static_assert(is_storage<E>::value, "flash_forward: storage must be float or bf16");
  validate(l, "flash_forward");
  if (empty(l)) return;
  if (!q || !k || !v || !o) fail("flash_forward", "null pointer among q, k, v, o");
  FwdArgs<E> a{};
  a.q = q;
  a.k = k;
  a.v = v;
  a.o = o;
  a.lse = lse;
  a.m = mask_args(l);
  a.heads = l.heads;
  a.q_row = l.q_row, a.q_head = l.q_head, a.k_row = l.k_row, a.k_head = l.k_head;
  a.v_row = l.v_row, a.v_head = l.v_head, a.o_row = l.o_row, a.o_head = l.o_head;
  a.dqk = static_cast<int>(l.dqk);
  a.dv = static_cast<int>(l.dv);
  a.scale = l.scale;
  const unsigned bh = static_cast<unsigned>(l.batch * l.heads);
  dispatch_widths(l.dqk, l.dv, [&](auto dqk_c, auto dv_c) {
    constexpr int DQK = decltype(dqk_c)::value, DV = decltype(dv_c)::value;
    if constexpr (tensor_cores_apply<E, DV>()) {
      static const bool ready = has_tensor_core_body(tc_forward_kernel<DQK, DV>);
      if (kernels != Kernels::fma && ready) {
        using C = TcConfig<DQK, DV>;
        set_smem(tc_forward_kernel<DQK, DV>, C::fwd_bytes);
        launch(tc_forward_kernel<DQK, DV>, dim3(bh, tiles(l.seq, C::BM)), kTcThreads, C::fwd_bytes, stream, a);
        return;
      }
    }
    if (kernels == Kernels::tensor_cores) no_tensor_cores("flash_forward", l);
    using C = FwdConfig<DQK, DV>;
    set_smem(forward_kernel<E, DQK, DV>, C::smem_bytes);
    launch(forward_kernel<E, DQK, DV>, dim3(bh, tiles(l.seq, C::BQ)), kThreads, C::smem_bytes, stream, a);
  });
}

/// flash_backward with a choice for dv: written (=) or accumulated (+=), e.g. the two attentions of
/// a Differential head that share their values; and a choice of kernels.
template <class E>
void backward(const FlashLayout& l, const E* q, const E* k, const E* v, const E* o, const float* d_o,
              const float* lse, float* dq, float* dk, float* dv, bool accumulate_dv, Kernels kernels,
              cudaStream_t stream) {
  static_assert(is_storage<E>::value, "flash_backward: storage must be float or bf16");
  validate(l, "flash_backward");
  if (empty(l)) return;
  if (!q || !k || !v || !o || !d_o || !lse || !dq || !dk || !dv)
    fail("flash_backward", "null pointer among q, k, v, o, d_o, lse, dq, dk, dv");
  const Index n = l.batch * l.heads * l.seq;
  DeviceBuffer<float>& delta = delta_scratch();
  delta.reserve(static_cast<std::size_t>(n));

  auto launch_delta = [&](auto round_do) {
    const unsigned dgrid = grid_for(n, kThreads / 32);
    launch(delta_kernel<E, decltype(round_do)::value>, dgrid, kThreads, 0, stream, o, d_o, delta.data(), l.batch,
           mask_args(l), l.heads, static_cast<int>(l.dv), l.o_row, l.o_head);
  };

  BwdArgs<E> a{};
  a.q = q;
  a.k = k;
  a.v = v;
  a.lse = lse;
  a.delta = delta.data();
  a.d_o = d_o;
  a.dq = dq;
  a.dk = dk;
  a.dv = dv;
  a.m = mask_args(l);
  a.heads = l.heads;
  a.q_row = l.q_row, a.q_head = l.q_head, a.k_row = l.k_row, a.k_head = l.k_head;
  a.v_row = l.v_row, a.v_head = l.v_head, a.o_row = l.o_row, a.o_head = l.o_head;
  a.dqk = static_cast<int>(l.dqk);
  a.dv_width = static_cast<int>(l.dv);
  a.scale = l.scale;
  a.accumulate_dv = accumulate_dv;
  const unsigned bh = static_cast<unsigned>(l.batch * l.heads);
  dispatch_widths(l.dqk, l.dv, [&](auto dqk_c, auto dv_c) {
    constexpr int DQK = decltype(dqk_c)::value, DV = decltype(dv_c)::value;
    if constexpr (tensor_cores_apply<E, DV>()) {
      static const bool ready = has_tensor_core_body(tc_dkdv_kernel<DQK, DV>);
      if (kernels != Kernels::fma && ready) {
        using C = TcConfig<DQK, DV>;
        launch_delta(std::true_type{});
        const dim3 grid(bh, tiles(l.seq, C::BM));
        set_smem(tc_dkdv_kernel<DQK, DV>, C::dkdv_bytes);
        launch(tc_dkdv_kernel<DQK, DV>, grid, kTcThreads, C::dkdv_bytes, stream, a);
        set_smem(tc_dq_kernel<DQK, DV>, C::dq_bytes);
        launch(tc_dq_kernel<DQK, DV>, grid, kTcThreads, C::dq_bytes, stream, a);
        return;
      }
    }
    if (kernels == Kernels::tensor_cores) no_tensor_cores("flash_backward", l);
    launch_delta(std::false_type{});
    {
      using C = DkdvConfig<DQK, DV>;
      set_smem(dkdv_kernel<E, DQK, DV>, C::smem_bytes);
      launch(dkdv_kernel<E, DQK, DV>, dim3(bh, tiles(l.seq, C::BM)), kThreads, C::smem_bytes, stream, a);
    }
    {
      using C = DqConfig<DQK, DV>;
      set_smem(dq_kernel<E, DQK, DV>, C::smem_bytes);
      launch(dq_kernel<E, DQK, DV>, dim3(bh, tiles(l.seq, C::BM)), kThreads, C::smem_bytes, stream, a);
    }
  });
}

}  // namespace flash_detail

/// O (=) and, unless lse is null, lse [B, H, T] (=) of softmax attention under l.mask (causal by
/// default) over every (b, h); padding rows get 0 in both.
/// Asynchronous on `stream`.
template <class T>
void flash_forward(const FlashLayout& l, const T* q, const T* k, const T* v, T* o, float* lse,
                   cudaStream_t stream = nullptr) {
  flash_detail::forward(l, q, k, v, o, lse, flash_detail::Kernels::automatic, stream);
}

/// dq, dk, dv (float, with the strides of q, k, v) written (=) over the heads this layout covers
/// (0 on padding rows),
/// from the forward's o and lse and the cotangent d_o (float, o's strides). Asynchronous on
/// `stream`; uses the thread_local D scratch described at the top of this file.
template <class T>
void flash_backward(const FlashLayout& l, const T* q, const T* k, const T* v, const T* o, const float* d_o,
                    const float* lse, float* dq, float* dk, float* dv, cudaStream_t stream = nullptr) {
  flash_detail::backward(l, q, k, v, o, d_o, lse, dq, dk, dv, /*accumulate_dv=*/false,
                         flash_detail::Kernels::automatic, stream);
}

}  // namespace coupledqk::cuda
