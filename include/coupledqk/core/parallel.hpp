// Multi-threading for the CPU paths. OpenMP when the translation unit is compiled with it
// (-fopenmp; CMake: OpenMP::OpenMP_CXX), serial otherwise: the results are the same either way,
// because every parallel loop writes disjoint outputs and reduces in a fixed order.
#pragma once

#ifdef _OPENMP
#include <omp.h>
#define COUPLEDQK_PRAGMA(x) _Pragma(#x)
/// A parallel for over independent iterations (each iteration writes its own outputs).
#define COUPLEDQK_PARALLEL_FOR COUPLEDQK_PRAGMA(omp parallel for schedule(dynamic, 1))
#else
#define COUPLEDQK_PARALLEL_FOR
#endif

namespace coupledqk {

/// Threads a parallel loop may use (1 without OpenMP).
inline int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

}  // namespace coupledqk
