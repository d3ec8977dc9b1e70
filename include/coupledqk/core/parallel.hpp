// Multi-threading for the CPU paths. OpenMP when the translation unit is compiled with it
// (-fopenmp; CMake: OpenMP::OpenMP_CXX), serial otherwise: the results are the same either way,
// because every parallel loop writes disjoint outputs and reduces in a fixed order.
#pragma once

#ifdef _OPENMP
#include <omp.h>
#endif

#include <Eigen/Core>

namespace coupledqk {

/// Threads a parallel loop may use (1 without OpenMP).
inline int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

/// The calling thread's number in the current parallel region (0 outside one), in [0, max_threads()).
inline int thread_index() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

/// Calls f(i) for i = 0..n-1, iterations shared among the OpenMP threads (dynamic schedule, one
/// iteration at a time) when there are several threads and several iterations and the caller is
/// not already in a parallel region; otherwise a plain loop on the calling thread. (Entering an
/// OpenMP region with one thread is not free: libgomp allocates a team for every such region, so a
/// training step on one thread would allocate at every loop.)
template <class F>
void parallel_for(Eigen::Index n, F&& f) {
#ifdef _OPENMP
  if (n > 1 && omp_get_max_threads() > 1 && !omp_in_parallel()) {
#pragma omp parallel for schedule(dynamic, 1)
    for (Eigen::Index i = 0; i < n; ++i) f(i);
    return;
  }
#endif
  for (Eigen::Index i = 0; i < n; ++i) f(i);
}

/// The same with a static schedule (contiguous blocks of rows), and in parallel only when `worth`
/// (enough work to share). Used by the row kernels (autodiff/kernels.hpp).
template <class F>
void parallel_rows(Eigen::Index n, bool worth, F&& f) {
#ifdef _OPENMP
  if (worth && n > 1 && omp_get_max_threads() > 1 && !omp_in_parallel()) {
#pragma omp parallel for schedule(static)
    for (Eigen::Index i = 0; i < n; ++i) f(i);
    return;
  }
#else
  (void)worth;  // without OpenMP every loop is serial
#endif
  for (Eigen::Index i = 0; i < n; ++i) f(i);
}

}  // namespace coupledqk
