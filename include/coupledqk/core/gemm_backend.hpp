// Which kernel coupledqk::gemm's panels run: Eigen's (always there) or OpenBLAS's (optional).
//
// Eigen's register-blocked kernel reaches ~97% of OpenBLAS's SGEMM on AMD Zen 4, where AVX-512
// runs at half rate, but leaves a fifth of an Intel AVX-512 core unused. Compiled with
// COUPLEDQK_USE_OPENBLAS (CMake: -DCOUPLEDQK_BLAS=OpenBLAS, which also links the library, Debian's
// pthread build preferred), gemm's panels call OpenBLAS's sgemm_/dgemm_ instead, one call per panel
// on the panel's thread, with OpenBLAS's own threading turned off: the threads and the panel
// boundaries stay gemm's, so the thread count still changes no bit (tests/autodiff/test_no_alloc.cpp
// checks it for this build). What the option gives up: the bits are OpenBLAS's, not Eigen's (a run
// with the option and one without differ in rounding), and they follow the kernel OpenBLAS picks
// for the CPU (another machine, another kernel).
//
// OpenBLAS picks its kernels when it is loaded, from the CPU it recognises; a CPU it does not know
// (new Intel parts, some virtual machines) gets older or generic kernels, slower than Eigen's. At
// the first product the backend compares the core OpenBLAS reports with the CPU's instruction set,
// and when OpenBLAS's kernels are narrower than the CPU supports (no AVX-512 kernels on an Intel CPU
// with AVX-512, no AVX2 kernels on a CPU with AVX2 and FMA) it keeps Eigen's kernel and says why in
// gemm_backend_description(), with the remedy (OPENBLAS_CORETYPE). On AMD, OpenBLAS's AVX2 "Zen"
// kernels are its proper ones for Zen 4 too.
//
// gemm calls OpenBLAS from several threads at once, which needs a threaded build of OpenBLAS
// (pthread or OpenMP: their buffer allocation is locked). Debian's single-threaded build
// (openblas-serial, 0.3.21) called that way gave different training losses from run to run on
// 2026-12-07 (tests/autodiff/test_determinism.cpp, 2 threads: 5 of 8 runs failed; the pthread build:
// 0 of 8), so a serial build is refused in the same way, with the package to install instead.
// OpenBLAS's thread count is process-wide: gemm sets it to one at its first product, and a program
// that raises it again (openblas_set_num_threads, OPENBLAS_NUM_THREADS is read only at load) gets
// OpenBLAS's threads inside gemm's panels, and the same-bits guarantee no longer holds.
//
//     coupledqk::gemm_backend()                    GemmBackend::eigen or GemmBackend::openblas
//     coupledqk::gemm_backend_description()        e.g. "OpenBLAS 0.3.21 (core SkylakeX, pthread build, its threads off)"
//     coupledqk::set_gemm_backend(GemmBackend::eigen)   for side-by-side measurements
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cctype>
#include <limits>
#include <string>
#include <type_traits>

#include "error.hpp"
#include "types.hpp"

#ifdef COUPLEDQK_USE_OPENBLAS
extern "C" {
// The Fortran BLAS interface (32-bit integers: Debian's libopenblas0) and OpenBLAS's own controls.
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
            const int* ldc);
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const double* alpha,
            const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
            const int* ldc);
void openblas_set_num_threads(int threads);
char* openblas_get_corename(void);
char* openblas_get_config(void);
int openblas_get_parallel(void);
}
#endif

namespace coupledqk {

enum class GemmBackend { eigen, openblas };

inline const char* to_string(GemmBackend b) { return b == GemmBackend::openblas ? "openblas" : "eigen"; }

namespace detail {

inline std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

/// Would OpenBLAS's kernels for `core` be narrower than what this CPU runs? Empty: no; else why.
/// `avx512`, `avx2`: the CPU's instruction set; `intel`: its vendor (AMD runs AVX-512 at half rate,
/// where OpenBLAS's AVX2 kernels are its proper ones).
inline std::string openblas_core_too_narrow(const std::string& core, bool avx512, bool avx2, bool intel) {
  const std::string c = lower(core);
  const bool core512 = c == "skylakex" || c == "cooperlake" || c == "sapphirerapids";
  const bool core256 = core512 || c == "haswell" || c == "skylake" || c == "zen" || c == "atomx" ||
                       c == "alderlake" || c == "rocketlake";
  if (avx512 && intel && !core512)
    return "OpenBLAS detected core '" + core +
           "' (no AVX-512 kernels) on an Intel CPU with AVX-512; set OPENBLAS_CORETYPE=SkylakeX (or "
           "Cooperlake, SapphireRapids) before the program starts to use OpenBLAS";
  if (avx2 && !core256)
    return "OpenBLAS detected core '" + core +
           "' (no AVX2 kernels) on a CPU with AVX2 and FMA; set OPENBLAS_CORETYPE=Haswell (or Zen on AMD) "
           "before the program starts to use OpenBLAS";
  return {};
}

/// Is the OpenBLAS build unsafe to call from several threads at once? `parallel`: what
/// openblas_get_parallel() says (0 single-threaded build, 1 pthreads, 2 OpenMP). Empty: safe; else why.
inline std::string openblas_build_unsafe(int parallel) {
  if (parallel != 0) return {};
  return "this is OpenBLAS's single-threaded build (e.g. Debian's openblas-serial), which is not safe to call "
         "from gemm's threads at once (runs gave different bits); link a threaded build instead (Debian: "
         "libopenblas-pthread-dev, or libopenblas-openmp-dev; gemm still turns OpenBLAS's own threads off)";
}

struct GemmBackendState {
  GemmBackend available = GemmBackend::eigen;  // what this build and CPU can run
  GemmBackend active = GemmBackend::eigen;     // what gemm uses now
  std::string description;                     // what it is, and why OpenBLAS is not used when it is not
};

inline GemmBackendState make_gemm_backend_state() {
  GemmBackendState s;
  const std::string eigen = "Eigen " + std::to_string(EIGEN_WORLD_VERSION) + "." + std::to_string(EIGEN_MAJOR_VERSION) +
                            "." + std::to_string(EIGEN_MINOR_VERSION) + " gebp kernel (" +
                            std::to_string(Eigen::internal::packet_traits<float>::size) + " floats per packet)";
#ifdef COUPLEDQK_USE_OPENBLAS
  openblas_set_num_threads(1);  // gemm's panels are the threads
  const char* corename = openblas_get_corename();
  const std::string core = corename ? corename : "unknown";
  std::string config = openblas_get_config() ? openblas_get_config() : "OpenBLAS";
  // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ... SkylakeX SINGLE_THREADED": the name and version
  const std::size_t space = config.find(' ', config.find(' ') + 1);
  if (space != std::string::npos) config.resize(space);
  bool avx512 = false, avx2 = false, intel = false;
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  __builtin_cpu_init();
  avx512 = __builtin_cpu_supports("avx512f");
  avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  intel = __builtin_cpu_is("intel");
#endif
  const int parallel = openblas_get_parallel();
  std::string why = openblas_build_unsafe(parallel);
  if (why.empty()) why = openblas_core_too_narrow(core, avx512, avx2, intel);
  const std::string openblas =
      config + " (core " + core + (parallel == 2 ? ", OpenMP build" : ", pthread build") + ", its threads off)";
  if (why.empty()) {
    s.available = s.active = GemmBackend::openblas;
    s.description = openblas;
  } else {
    s.description = eigen + "; OpenBLAS not used: " + why;
  }
#else
  s.description = eigen;
#endif
  return s;
}

inline GemmBackendState& gemm_backend_state() {
  static GemmBackendState state = make_gemm_backend_state();
  return state;
}

}  // namespace detail

/// The kernel gemm's panels run now.
inline GemmBackend gemm_backend() { return detail::gemm_backend_state().active; }

/// What that kernel is (library, version, core), and why OpenBLAS is not used when the build has it.
inline std::string gemm_backend_description() {
  const detail::GemmBackendState& s = detail::gemm_backend_state();
  if (s.active == GemmBackend::eigen && s.available == GemmBackend::openblas)
    return "Eigen (chosen with set_gemm_backend; this build also has " + s.description + ")";
  return s.description;
}

/// Chooses the kernel (not while a product runs on another thread). OpenBLAS where this build or
/// this CPU cannot use it is an error that says why.
inline void set_gemm_backend(GemmBackend b) {
  detail::GemmBackendState& s = detail::gemm_backend_state();
  require(b == GemmBackend::eigen || s.available == GemmBackend::openblas, "set_gemm_backend: '", to_string(b),
          "' is not available here (", s.description,
#ifdef COUPLEDQK_USE_OPENBLAS
          ")",
#else
          "; the build does not have OpenBLAS: configure with -DCOUPLEDQK_BLAS=OpenBLAS)",
#endif
          "; accepted: eigen", s.available == GemmBackend::openblas ? ", openblas" : "");
  s.active = b;
}

namespace detail {

/// C [M, N] (row-major, ldc) += alpha A B through OpenBLAS, when it is the active backend and S is
/// float or double; false (nothing done) otherwise. A is [M, K], B is [K, N], stored with the given
/// Eigen storage orders.
template <class S, int AOrder, int BOrder>
bool blas_panel(Index M, Index N, Index K, const S* A, Index lda, const S* B, Index ldb, S* C, Index ldc, S alpha) {
#ifdef COUPLEDQK_USE_OPENBLAS
  constexpr bool blas_type = std::is_same<S, float>::value || std::is_same<S, double>::value;
  if constexpr (blas_type) {
    if (gemm_backend() != GemmBackend::openblas) return false;
    const Index most = std::numeric_limits<int>::max();
    if (M > most || N > most || K > most || lda > most || ldb > most || ldc > most) return false;
    // Column-major BLAS sees the row-major C [M, N] as C^T [N, M]: C^T += alpha B^T A^T. A row-major
    // [r, c] operand is a column-major [c, r] one in the same memory, i.e. already transposed.
    const char tb = BOrder == Eigen::RowMajor ? 'N' : 'T', ta = AOrder == Eigen::RowMajor ? 'N' : 'T';
    const int m = static_cast<int>(N), n = static_cast<int>(M), k = static_cast<int>(K);
    const int ia = static_cast<int>(lda), ib = static_cast<int>(ldb), ic = static_cast<int>(ldc);
    const S one = S(1);
    if constexpr (std::is_same<S, float>::value)
      sgemm_(&tb, &ta, &m, &n, &k, &alpha, B, &ib, A, &ia, &one, C, &ic);
    else
      dgemm_(&tb, &ta, &m, &n, &k, &alpha, B, &ib, A, &ia, &one, C, &ic);
    return true;
  }
#endif
  (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B, (void)ldb, (void)C, (void)ldc, (void)alpha;
  return false;
}

}  // namespace detail
}  // namespace coupledqk
