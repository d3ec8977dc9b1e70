// Forced first include (-include) of the project's own translation units when they are built with
// -march=native by GCC < 13 (CMakeLists.txt, COUPLEDQK_NATIVE). GCC 12's AVX-512 headers define
// _mm512_undefined_ps() and friends with a self-initialised placeholder (`__m512 __Y = __Y;`) that
// -Wmaybe-uninitialized and -Wuninitialized report wherever Eigen's kernels inline them (GCC bug
// 105593, fixed in 13). Including the intrinsics here, first, with those two warnings ignored for
// these lines only, keeps them for every other line, the project's own code included. Nothing for
// device passes (nvcc).
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDA_ARCH__) && (defined(__x86_64__) || defined(__i386__))
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif
