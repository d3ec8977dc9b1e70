// The narrow products of the dynamics (dynamics/tanh_map.hpp, affine_coupling.hpp, force.hpp):
//
//     small_gemm<S>(A, trans_a, B, trans_b, C, alpha, accumulate)     C (+)= alpha op(A) op(B)
//
// the same contract as gemm (core/gemm.hpp), for the products a chunk of the dynamics makes:
// [256, 64] x [64, 64] and the like, a few hundred thousand multiply-adds each. At that size
// Eigen's GEMM spends a large part of its time outside its kernel (packing op(A) and op(B),
// cache blocking meant for matrices a thousand times larger); issue 24 measured the coupled layer
// at 1.18x of standard attention against the 1.105x its FLOPs allow. This kernel packs nothing
// on the left and at most one column block of op(B):
//
//  - A register block of C (6 rows x 4 packets; 2 packets where there are 16 vector registers)
//    lives in registers for the whole depth K; op(A) is read in place (an element broadcast per row
//    and k, whatever its storage order), op(B) one row of packets per k.
//  - op(B) is read in place when its rows are contiguous (B not transposed) and N is a multiple
//    of the packet size; otherwise each column block of op(B) is copied, zero-padded to whole
//    packets, into a buffer on the stack (at most kSmallGemmMaxDepth rows of it: 64 KiB). No
//    heap, no thread_local: the first call on a thread costs what every later one does, so a
//    training step allocates nothing whichever thread first meets which size.
//  - Every element of C is sum_k op(A)_ik op(B)_kj accumulated from zero in increasing k, one fused
//    multiply-add per k (mul + add without FMA), then C = alpha acc or C += alpha acc. That order
//    depends neither on the thread count nor on the row's position or the number of rows, so a
//    row's result is the same in a chunk of 256 rows and alone (decoding one token).
//
// Products wider than kSmallGemmMaxCols, deeper than kSmallGemmMaxDepth where op(B) must be copied,
// or with more than kSmallGemmMaxWork multiply-adds go to gemm (its blocking wins there). The
// results differ from gemm's in the last bits (another summation order), never in their
// determinism. Tested against a long-double product in tests/test_small_gemm.cpp.
#pragma once

#include <Eigen/Core>
#include <algorithm>

#include "error.hpp"
#include "gemm.hpp"
#include "types.hpp"

namespace coupledqk {

/// Widest op(B) (columns of C) the kernel takes; wider products go to gemm.
inline constexpr Index kSmallGemmMaxCols = 256;
/// Deepest op(B) the kernel copies (a transposed B, or N not a multiple of the packet size).
inline constexpr Index kSmallGemmMaxDepth = 256;
/// Most multiply-adds (M N K) the kernel takes: 2^22, beyond which gemm's cache blocking wins.
inline constexpr double kSmallGemmMaxWork = 4194304.0;

namespace detail {

template <class S>
struct SmallGemm {
  using Packet = typename Eigen::internal::packet_traits<S>::type;
  static constexpr int kPacket = Eigen::internal::unpacket_traits<Packet>::size;
  /// Rows x packets of one register block: 6 x 4 accumulators + 4 loads + 1 broadcast fit in 32
  /// vector registers (AVX-512), 6 x 2 + 2 + 1 in 16 (SSE, AVX2).
  static constexpr int kRows = 6;
#ifdef EIGEN_ARCH_DEFAULT_NUMBER_OF_REGISTERS
  static constexpr int kPackets = EIGEN_ARCH_DEFAULT_NUMBER_OF_REGISTERS >= 32 ? 4 : 2;
#else  // no SIMD (or an architecture Eigen does not say it of): the smaller block
  static constexpr int kPackets = 2;
#endif
  static constexpr Index kBlockCols = Index(kPackets) * kPacket;

  /// Whether op(B) is read where it is: rows contiguous (B not transposed) and whole packets wide.
  static bool b_in_place(Index N, bool trans_b) { return !trans_b && N % kPacket == 0; }

  /// The register block: C rows [0, RR), packets [0, NN) (cols of them valid, the rest padding).
  /// a(i, k) = a[i * a_row + k * a_k]; b(k, j) = b[k * ldb + j], readable for NN whole packets.
  template <int RR, int NN>
  static void block(Index K, const S* a, Index a_row, Index a_k, const S* b, Index ldb, S* c, Index ldc,
                    Index cols, S alpha, bool accumulate) {
    using namespace Eigen::internal;
    Packet acc[RR][NN];
    for (int r = 0; r < RR; ++r)
      for (int n = 0; n < NN; ++n) acc[r][n] = pset1<Packet>(S(0));
    for (Index k = 0; k < K; ++k) {
      Packet bp[NN];
      for (int n = 0; n < NN; ++n) bp[n] = ploadu<Packet>(b + k * ldb + n * kPacket);
      for (int r = 0; r < RR; ++r) {
        const Packet av = pset1<Packet>(a[r * a_row + k * a_k]);
        for (int n = 0; n < NN; ++n) acc[r][n] = pmadd(av, bp[n], acc[r][n]);
      }
    }
    const Packet al = pset1<Packet>(alpha);
    for (int r = 0; r < RR; ++r) {
      S* cr = c + r * ldc;
      for (int n = 0; n < NN; ++n) {
        const Index j0 = Index(n) * kPacket;
        Packet v = pmul(al, acc[r][n]);
        if (j0 + kPacket <= cols) {
          if (accumulate) v = padd(ploadu<Packet>(cr + j0), v);
          pstoreu(cr + j0, v);
        } else {  // the last, partial packet of a padded block
          EIGEN_ALIGN_MAX S lanes[kPacket];
          pstore(lanes, v);
          for (Index j = j0; j < cols; ++j) cr[j] = accumulate ? cr[j] + lanes[j - j0] : lanes[j - j0];
        }
      }
    }
  }

  /// One column block of C (all M rows) with NN packets.
  template <int NN>
  static void column_block(Index M, Index K, const S* a, Index a_row, Index a_k, const S* b, Index ldb, S* c,
                           Index ldc, Index cols, S alpha, bool accumulate) {
    Index i = 0;
    for (; i + kRows <= M; i += kRows)
      block<kRows, NN>(K, a + i * a_row, a_row, a_k, b, ldb, c + i * ldc, ldc, cols, alpha, accumulate);
    const S* ai = a + i * a_row;
    S* ci = c + i * ldc;
    switch (M - i) {  // the last rows, fewer than kRows
      case 5: block<5, NN>(K, ai, a_row, a_k, b, ldb, ci, ldc, cols, alpha, accumulate); break;
      case 4: block<4, NN>(K, ai, a_row, a_k, b, ldb, ci, ldc, cols, alpha, accumulate); break;
      case 3: block<3, NN>(K, ai, a_row, a_k, b, ldb, ci, ldc, cols, alpha, accumulate); break;
      case 2: block<2, NN>(K, ai, a_row, a_k, b, ldb, ci, ldc, cols, alpha, accumulate); break;
      case 1: block<1, NN>(K, ai, a_row, a_k, b, ldb, ci, ldc, cols, alpha, accumulate); break;
      default: break;
    }
  }

  /// Dispatch on the packets a block of `cols` columns needs (1..kPackets).
  static void column_block(Index M, Index K, const S* a, Index a_row, Index a_k, const S* b, Index ldb, S* c,
                           Index ldc, Index cols, S alpha, bool accumulate) {
    const Index packets = (cols + kPacket - 1) / kPacket;
    if constexpr (kPackets == 4) {
      if (packets == 4) return column_block<4>(M, K, a, a_row, a_k, b, ldb, c, ldc, cols, alpha, accumulate);
      if (packets == 3) return column_block<3>(M, K, a, a_row, a_k, b, ldb, c, ldc, cols, alpha, accumulate);
    }
    if (packets == 2) return column_block<2>(M, K, a, a_row, a_k, b, ldb, c, ldc, cols, alpha, accumulate);
    column_block<1>(M, K, a, a_row, a_k, b, ldb, c, ldc, cols, alpha, accumulate);
  }
};

}  // namespace detail

/// Whether small_gemm computes [M, K] x [K, N] on its own kernel (else it calls gemm).
template <class S>
bool small_gemm_takes(Index M, Index N, Index K, bool trans_b) {
  return N <= kSmallGemmMaxCols && detail::work_of(M, N, K) <= kSmallGemmMaxWork &&
         (detail::SmallGemm<S>::b_in_place(N, trans_b) || K <= kSmallGemmMaxDepth);
}

/// C = alpha op(A) op(B) (accumulate = false) or C += alpha op(A) op(B) (accumulate = true), as
/// gemm, on the calling thread. Allocates nothing.
template <class S>
void small_gemm(const ConstMatrixRef<S>& A, bool trans_a, const ConstMatrixRef<S>& B, bool trans_b, MatrixRef<S> C,
                S alpha = S(1), bool accumulate = false) {
  using Kernel = detail::SmallGemm<S>;
  const Index M = trans_a ? A.cols() : A.rows(), K = trans_a ? A.rows() : A.cols();
  const Index N = trans_b ? B.rows() : B.cols();
  require((trans_b ? B.cols() : B.rows()) == K && C.rows() == M && C.cols() == N, "small_gemm: op(A) is [", M,
          ", ", K, "], op(B) is [", trans_b ? B.cols() : B.rows(), ", ", N, "], C is [", C.rows(), ", ", C.cols(),
          "]; expected [M, K] x [K, N] -> [M, N]");
  if (!small_gemm_takes<S>(M, N, K, trans_b)) return gemm<S>(A, trans_a, B, trans_b, C, alpha, accumulate);
  if (M == 0 || N == 0) return;
  if (K == 0) {
    if (!accumulate) C.setZero();
    return;
  }
  const Index lda = A.outerStride(), ldb = B.outerStride(), ldc = C.outerStride();
  const Index a_row = trans_a ? 1 : lda, a_k = trans_a ? lda : 1;
  const bool in_place = Kernel::b_in_place(N, trans_b);
  constexpr Index kBlock = Kernel::kBlockCols;
  for (Index j0 = 0; j0 < N; j0 += kBlock) {
    const Index cols = std::min(kBlock, N - j0);
    if (in_place) {
      Kernel::column_block(M, K, A.data(), a_row, a_k, B.data() + j0, ldb, C.data() + j0, ldc, cols, alpha,
                           accumulate);
      continue;
    }
    // op(B) columns [j0, j0 + cols), k by k, zero-padded to whole packets: row k at panel + k * kBlock.
    EIGEN_ALIGN_MAX S panel[kSmallGemmMaxDepth * kBlock];
    const Index padded = (cols + Kernel::kPacket - 1) / Kernel::kPacket * Kernel::kPacket;
    for (Index k = 0; k < K; ++k) {
      S* row = panel + k * kBlock;
      if (trans_b)
        for (Index j = 0; j < cols; ++j) row[j] = B.data()[(j0 + j) * ldb + k];
      else
        for (Index j = 0; j < cols; ++j) row[j] = B.data()[k * ldb + j0 + j];
      for (Index j = cols; j < padded; ++j) row[j] = S(0);
    }
    Kernel::column_block(M, K, A.data(), a_row, a_k, panel, kBlock, C.data() + j0, ldc, cols, alpha, accumulate);
  }
}

}  // namespace coupledqk
