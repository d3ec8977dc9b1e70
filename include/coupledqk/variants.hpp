// The compiled variant table (optional): include this header and link coupledqk::variants, and a
// program that builds layers or models by name (make_attention<S>(name, ...) for float and double,
// make_gpt<float>(config)) instantiates none of the table's layers: they are compiled once in the
// library (CMakeLists.txt generates its sources: the table positions spread over several
// translation units, so a parallel build keeps every core busy). Without this header everything stays header-only: the same calls instantiate the
// table in the calling translation unit.
//
//     #include <coupledqk/variants.hpp>           // before any call by name
//     auto layer = coupledqk::make_attention<float>("diff-leapfrog", 3, config, seed);
//     target_link_libraries(app PRIVATE coupledqk::variants)    # CMake
//
// Each built-in entry K is one explicit instantiation of BuiltinAttention<S, K> and BuiltinGpt<S, K>
// (registry.hpp, model/gpt.hpp), declared extern here for K < max_builtin_entries; the numbers are
// positions in the table, not names, so the table stays the one list of variants. The build
// (static_assert below) says when the table outgrows them.
#pragma once

#include "model/gpt.hpp"
#include "registry.hpp"

namespace coupledqk {

/// How many table positions the compiled table covers.
inline constexpr std::size_t max_builtin_entries = 32;
static_assert(std::decay_t<decltype(builtin_variants)>::size <= max_builtin_entries,
              "the built-in variant table has more entries than variants.hpp declares: raise "
              "max_builtin_entries and add the positions to COUPLEDQK_FOR_EACH_TABLE_POSITION");

// The library and the program must agree on Eigen's alignment (it follows the instruction set,
// e.g. -march=native with AVX-512 gives 64 bytes): objects of different layouts on each side
// corrupt the heap. The library defines variants_abi::compiled_with_eigen_max_align_bytes_<N> for
// its own N and every program that includes this header refers to the one of its N, so a mismatch
// is a link error naming both alignments ("undefined reference to ..._32" while the library has
// "..._64"): compile with the flags the library was built with (CMake: coupledqk::variants passes
// them on).
#define COUPLEDQK_VARIANTS_CAT2(a, b) a##b
#define COUPLEDQK_VARIANTS_CAT(a, b) COUPLEDQK_VARIANTS_CAT2(a, b)
#define COUPLEDQK_VARIANTS_ABI_TAG COUPLEDQK_VARIANTS_CAT(compiled_with_eigen_max_align_bytes_, EIGEN_MAX_ALIGN_BYTES)
namespace variants_abi {
extern const int COUPLEDQK_VARIANTS_ABI_TAG;
#if defined(__GNUC__)
[[gnu::used]] static const int* const check = &COUPLEDQK_VARIANTS_ABI_TAG;
#endif
}  // namespace variants_abi

#define COUPLEDQK_FOR_EACH_TABLE_POSITION(X)                                                                   \
  X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15) X(16) X(17) X(18) \
  X(19) X(20) X(21) X(22) X(23) X(24) X(25) X(26) X(27) X(28) X(29) X(30) X(31)

// (The library's own sources follow these with the explicit instantiation definitions of their
// share of the positions, which the language allows.) make_gpt<double> (the tests' gradient
// checks) is not compiled in: it stays header-only, so the project does not build it twice.
#define COUPLEDQK_EXTERN_TABLE_POSITION(K)           \
  extern template struct BuiltinAttention<float, K>;  \
  extern template struct BuiltinAttention<double, K>; \
  extern template struct BuiltinGpt<float, K>;
COUPLEDQK_FOR_EACH_TABLE_POSITION(COUPLEDQK_EXTERN_TABLE_POSITION)
#undef COUPLEDQK_EXTERN_TABLE_POSITION

}  // namespace coupledqk
