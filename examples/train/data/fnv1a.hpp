// 64-bit FNV-1a, the one hash of the training tools: split and cache keys (corpora.cpp, tokenizer.cpp),
// run fingerprints (trainer/run_plan.cpp) and run identities (study). Fixed and the same on every platform,
// so a key written by one machine is found by another. Not for security.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace coupledqk::train {

inline constexpr std::uint64_t fnv1a64_offset = 14695981039346656037ull;

/// FNV-1a of `bytes` bytes at `data`, chained through `state` (start: fnv1a64_offset). (Its own
/// name, not an overload of fnv1a64: fnv1a64("text", state) would otherwise pick this one.)
inline std::uint64_t fnv1a64_bytes(const void* data, std::size_t bytes, std::uint64_t state = fnv1a64_offset) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) {
    state ^= p[i];
    state *= 1099511628211ull;
  }
  return state;
}
inline std::uint64_t fnv1a64(std::string_view bytes, std::uint64_t state = fnv1a64_offset) {
  return fnv1a64_bytes(bytes.data(), bytes.size(), state);
}

}  // namespace coupledqk::train
