// The large matrix products of a training step (projections, MLP, logits, and their gradients).
//
//     gemm<S>(A, trans_a, B, trans_b, C, alpha, accumulate)     C (+)= alpha op(A) op(B)
//
// A, B and C are row-major matrices, maps or blocks with unit inner stride; op(X) is X or X^T.
// The arithmetic is Eigen's own GEMM (its packing routines and its register-blocked gebp kernel,
// Eigen/src/Core/products), called through Eigen::internal::general_matrix_matrix_product with
// the same cache blocking Eigen computes for a single-threaded product. What differs is only the
// driver around it:
//
//  - Packing buffers. Eigen's driver allocates them on the heap for every product larger than
//    EIGEN_STACK_ALLOCATION_LIMIT (128 KB), and always for its multi-threaded path. Here each
//    thread keeps its own buffers (grown on demand, never shrunk), so a training step that repeats
//    the same products allocates nothing after its first step.
//  - Threads. The output is cut into as many panels as threads (rows when op(B) is the smaller
//    operand to re-pack per panel, else columns), each computed by one thread with the sequential
//    kernel. Panel boundaries are multiples of the kernel's register blocks (kRowGrain, kColGrain)
//    and Eigen's cache blocking does not change which kernel path an output element takes, so
//    every element gets the same operations in the same order on any thread count: the product
//    is bitwise the same on 1 or N threads, and the same as Eigen's single-threaded `C = A * B`
//    (tested in tests/autodiff/test_no_alloc.cpp).
//
// Inside an OpenMP parallel region the product runs on the calling thread alone.
//
// Built with COUPLEDQK_USE_OPENBLAS (-DCOUPLEDQK_BLAS=OpenBLAS), each panel is one call of OpenBLAS's
// serial sgemm_/dgemm_ instead of Eigen's kernel, on the same threads but on row panels only, in
// multiples of kBlasRowGrain and of at least kBlasPanelWork multiply-adds, so that its bits do not
// depend on the thread count either (gemm_backend.hpp says when it is not used and why).
#pragma once

#include <Eigen/Core>
#include <algorithm>

#include "error.hpp"
#include "gemm_backend.hpp"
#include "parallel.hpp"
#include "types.hpp"

namespace coupledqk {

namespace detail {

/// One thread's packing buffers (Eigen-aligned). Kept for the thread's life.
template <class S>
struct GemmBuffers {
  Vector<S> a, b;
};
template <class S>
GemmBuffers<S>& gemm_buffers() {
  thread_local GemmBuffers<S> buffers;
  return buffers;
}

/// Eigen's cache blocking for a single-threaded product, on this thread's kept buffers.
template <class S>
class GemmBlocking : public Eigen::internal::level3_blocking<S, S> {
 public:
  /// Sizes of the column-major problem Eigen solves: [m, k] x [k, n].
  GemmBlocking(Index m, Index n, Index k) {
    this->m_mc = m;
    this->m_nc = n;
    this->m_kc = k;
    Eigen::internal::computeProductBlockingSizes<S, S, 1, Index>(this->m_kc, this->m_mc, this->m_nc, Index(1));
    GemmBuffers<S>& w = gemm_buffers<S>();
    if (w.a.size() < this->m_kc * this->m_mc) w.a.resize(this->m_kc * this->m_mc);
    if (w.b.size() < this->m_kc * this->m_nc) w.b.resize(this->m_kc * this->m_nc);
    this->m_blockA = w.a.data();
    this->m_blockB = w.b.data();
  }
};

/// C [M, N] (row-major, leading dimension ldc) += alpha A B, A [M, K] and B [K, N] stored with the
/// given orders and leading dimensions. Single-threaded.
template <class S, int AOrder, int BOrder>
void gemm_panel(Index M, Index N, Index K, const S* A, Index lda, const S* B, Index ldb, S* C, Index ldc,
                S alpha) {
  if (blas_panel<S, AOrder, BOrder>(M, N, K, A, lda, B, ldb, C, ldc, alpha)) return;  // OpenBLAS, when on
  // A row-major result is computed by Eigen as C^T = B^T A^T (column-major): an [N, K] x [K, M]
  // product, whose blocking this is.
  GemmBlocking<S> blocking(N, M, K);
  Eigen::internal::general_matrix_matrix_product<Index, S, AOrder, false, S, BOrder, false, Eigen::RowMajor, 1>::run(
      M, N, K, A, lda, B, ldb, C, 1, ldc, alpha, blocking);
}

}  // namespace detail

/// Rows of C per panel are multiples of this (covers the kernel's column blocks nr <= 16), columns
/// multiples of kColGrain (covers its row blocks mr = 3 packets <= 48 floats).
inline constexpr Index kGemmRowGrain = 16, kGemmColGrain = 48;

/// Rows of C per panel on OpenBLAS's kernel are multiples of this, and its columns are never split.
/// C's rows are the n of OpenBLAS's column-major product C^T = B^T A^T, which its kernels tile in
/// blocks of 12 (Haswell / Zen sgemm), 8 (their dgemm), 4 or 8 (SkylakeX): a split at a multiple of
/// the block leaves every element on the same kernel path. A split of C's columns (OpenBLAS's m) is not
/// safe on any multiple: on the Haswell / Zen sgemm kernel (0.3.21, measured) the rows either side of
/// a split inside one of its cache blocks (320 rows there) round differently from the whole
/// product, so a panel's result would depend on the thread count.
inline constexpr Index kBlasRowGrain = 48;

/// The fewest multiply-adds a panel on OpenBLAS's kernel holds (see gemm): 2^21, twice the size
/// below which OpenBLAS 0.3.x may switch to its small-matrix kernels.
inline constexpr double kBlasPanelWork = 2097152.0;

namespace detail {
inline double work_of(Index M, Index N, Index K) {
  return static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
}
}  // namespace detail

/// C = alpha op(A) op(B) (accumulate = false) or C += alpha op(A) op(B) (accumulate = true).
/// op(A): [M, K], op(B): [K, N], C: [M, N]. Allocates nothing once this thread (and, on several
/// threads, each OpenMP thread) has run a product of at least these sizes.
template <class S>
void gemm(const ConstMatrixRef<S>& A, bool trans_a, const ConstMatrixRef<S>& B, bool trans_b, MatrixRef<S> C,
          S alpha = S(1), bool accumulate = false) {
  const Index M = trans_a ? A.cols() : A.rows(), K = trans_a ? A.rows() : A.cols();
  const Index N = trans_b ? B.rows() : B.cols();
  require((trans_b ? B.cols() : B.rows()) == K && C.rows() == M && C.cols() == N, "gemm: op(A) is [", M, ", ",
          K, "], op(B) is [", trans_b ? B.cols() : B.rows(), ", ", N, "], C is [", C.rows(), ", ", C.cols(),
          "]; expected [M, K] x [K, N] -> [M, N]");
  if (!accumulate) C.setZero();
  if (M == 0 || N == 0 || K == 0) return;
  const Index lda = A.outerStride(), ldb = B.outerStride(), ldc = C.outerStride();

  // One panel: rows [r0, r0 + m) and columns [c0, c0 + n) of C.
  auto panel = [&](Index r0, Index m, Index c0, Index n) {
    const S* a = trans_a ? A.data() + r0 : A.data() + r0 * lda;  // op(A) rows r0..
    const S* b = trans_b ? B.data() + c0 * ldb : B.data() + c0;  // op(B) columns c0..
    S* c = C.data() + r0 * ldc + c0;
    constexpr int R = Eigen::RowMajor, Cm = Eigen::ColMajor;
    if (!trans_a && !trans_b)
      detail::gemm_panel<S, R, R>(m, n, K, a, lda, b, ldb, c, ldc, alpha);
    else if (!trans_a && trans_b)
      detail::gemm_panel<S, R, Cm>(m, n, K, a, lda, b, ldb, c, ldc, alpha);
    else if (trans_a && !trans_b)
      detail::gemm_panel<S, Cm, R>(m, n, K, a, lda, b, ldb, c, ldc, alpha);
    else
      detail::gemm_panel<S, Cm, Cm>(m, n, K, a, lda, b, ldb, c, ldc, alpha);
  };

  // Threads: as many as Eigen would use for this size (at least ~50k multiply-adds each).
  Index threads = 1;
#ifdef _OPENMP
  if (!omp_in_parallel()) {
    threads = std::min<Index>(Eigen::nbThreads(),
                              std::max<Index>(1, static_cast<Index>(detail::work_of(M, N, K) / 50000.0)));
  }
#endif
  // Split the rows of C when op(B) (re-packed by every panel) is the smaller operand, else the columns.
  // On OpenBLAS's kernel always the rows, in multiples of kBlasRowGrain (see there).
  const bool blas = gemm_backend() == GemmBackend::openblas;
  const bool by_rows = blas || N <= M;
  const Index extent = by_rows ? M : N, grain = blas ? kBlasRowGrain : by_rows ? kGemmRowGrain : kGemmColGrain;
  const Index units = (extent + grain - 1) / grain;
  threads = std::min(threads, units);
  if (threads <= 1) {
    panel(0, M, 0, N);
    return;
  }
  // On OpenBLAS's kernel every panel holds at least kBlasPanelWork multiply-adds: OpenBLAS runs
  // products of at most 10^6 on its small-matrix kernels (SkylakeX), which round differently from its
  // blocked ones, so the whole product and each of its panels then take the same kernel path and the
  // thread count changes no bit (fewer panels while the last one is smaller than that).
  if (blas)
    threads = std::min<Index>(threads,
                              std::max<Index>(1, static_cast<Index>(detail::work_of(M, N, K) / kBlasPanelWork)));
  const double per_unit_work = static_cast<double>(by_rows ? N : M) * static_cast<double>(K);
  Index per = 0, panels = 0;
  for (;;) {
    per = (units + threads - 1) / threads * grain;  // panel size, a multiple of the grain
    panels = (extent + per - 1) / per;
    if (!blas || panels <= 1 || static_cast<double>(extent - (panels - 1) * per) * per_unit_work >= kBlasPanelWork)
      break;
    threads = panels - 1;
  }
  if (panels <= 1) {
    panel(0, M, 0, N);
    return;
  }
  // The team is OpenMP's default size (as every parallel loop of the library), panel p on thread p:
  // libgomp reuses a team of the same size without allocating, and each thread always gets the same
  // panels, so its packing buffers are sized once.
#ifdef _OPENMP
#pragma omp parallel for schedule(static, 1)
#endif
  for (Index p = 0; p < panels; ++p) {
    const Index s0 = p * per, len = std::min(per, extent - s0);
    if (by_rows)
      panel(s0, len, 0, N);
    else
      panel(0, M, s0, len);
  }
}

}  // namespace coupledqk
