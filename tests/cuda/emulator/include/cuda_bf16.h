// bfloat16 for the CPU emulator: storage of the upper 16 bits of a float, round-to-nearest-even on
// conversion (as __float2bfloat16_rn), NaN kept quiet. The host conversions of the real header
// (from float, to float) are implicit here too.
#pragma once

#include <cstdint>
#include <cstring>

#include "coupledqk_cuda_emulator.hpp"

#if defined(COUPLEDQK_EMULATOR_EXACT_BF16)
// Diagnostics only: a "bf16" that keeps the whole float (4 bytes, no rounding). Tests built with it
// separate rounding error from indexing bugs in the bf16 code paths.
struct __nv_bfloat16 {
  float __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) : __x(f) {}
  operator float() const { return __x; }
};
#else
struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) : __x(from(f)) {}
  operator float() const {
    const std::uint32_t u = std::uint32_t(__x) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  static unsigned short from(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0) return static_cast<unsigned short>((u >> 16) | 0x0040u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return static_cast<unsigned short>(u >> 16);
  }
};
#endif
typedef __nv_bfloat16 nv_bfloat16;

inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return static_cast<float>(h); }
