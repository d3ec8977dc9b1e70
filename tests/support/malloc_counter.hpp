// Counts the process's heap allocations while counting is switched on: malloc, calloc, realloc and
// the aligned allocators (libstdc++'s operator new, Eigen's aligned_malloc and libgomp all end in
// them). For tests and benchmarks that check "no allocation inside a training step".
//
//     // in exactly one translation unit of the executable (glibc only):
//     #define COUPLEDQK_DEFINE_MALLOC_COUNTER
//     #include "malloc_counter.hpp"
//
//     malloc_counter::Scope scope;            // counting on until it is destroyed
//     ... the code under test ...
//     scope.count(); scope.bytes(); scope.sizes()   // allocations, bytes, the first sizes seen
//
// The definitions replace glibc's allocation functions in the executable (glibc supports replacing
// malloc) and forward to glibc's own (__libc_malloc, ...), so only a counter is added. Elsewhere
// (no glibc) nothing is replaced and available() is false.
#pragma once

#include <atomic>
#include <cstddef>
#include <vector>

namespace malloc_counter {

inline constexpr int kSizes = 64;
inline std::atomic<bool> g_on{false};
inline std::atomic<long long> g_count{0}, g_bytes{0};
inline std::atomic<std::size_t> g_size[kSizes] = {};

inline void note(std::size_t bytes) {
  if (!g_on.load(std::memory_order_relaxed)) return;
  const long long i = g_count.fetch_add(1, std::memory_order_relaxed);
  g_bytes.fetch_add(static_cast<long long>(bytes), std::memory_order_relaxed);
  if (i < kSizes) g_size[i].store(bytes, std::memory_order_relaxed);
}

/// Whether this executable counts (the replacement functions are compiled in).
bool available();

/// Counts allocations from construction to destruction (one scope at a time).
class Scope {
 public:
  Scope() {
    g_count = 0;
    g_bytes = 0;
    g_on = true;
  }
  ~Scope() { g_on = false; }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  long long count() const { return g_count.load(); }
  long long bytes() const { return g_bytes.load(); }
  /// The sizes of the first (up to 64) allocations counted.
  std::vector<std::size_t> sizes() const {
    std::vector<std::size_t> s;
    const long long n = count() < kSizes ? count() : kSizes;
    for (long long i = 0; i < n; ++i) s.push_back(g_size[i].load());
    return s;
  }
};

}  // namespace malloc_counter

#ifdef COUPLEDQK_DEFINE_MALLOC_COUNTER
#if defined(__GLIBC__)
#include <cerrno>
#include <malloc.h>
#include <stdlib.h>
// Declared noexcept like glibc's own declarations (__THROW).
extern "C" {
void* __libc_malloc(std::size_t) noexcept;
void* __libc_calloc(std::size_t, std::size_t) noexcept;
void* __libc_realloc(void*, std::size_t) noexcept;
void* __libc_memalign(std::size_t, std::size_t) noexcept;
void __libc_free(void*) noexcept;

void* malloc(std::size_t n) noexcept {
  malloc_counter::note(n);
  return __libc_malloc(n);
}
void* calloc(std::size_t n, std::size_t size) noexcept {
  malloc_counter::note(n * size);
  return __libc_calloc(n, size);
}
void* realloc(void* p, std::size_t n) noexcept {
  malloc_counter::note(n);
  return __libc_realloc(p, n);
}
void free(void* p) noexcept { __libc_free(p); }
void* memalign(std::size_t align, std::size_t n) noexcept {
  malloc_counter::note(n);
  return __libc_memalign(align, n);
}
void* aligned_alloc(std::size_t align, std::size_t n) noexcept {
  malloc_counter::note(n);
  return __libc_memalign(align, n);
}
int posix_memalign(void** out, std::size_t align, std::size_t n) noexcept {
  malloc_counter::note(n);
  void* p = __libc_memalign(align, n);
  if (!p && n) return ENOMEM;
  *out = p;
  return 0;
}
}
bool malloc_counter::available() { return true; }
#else
bool malloc_counter::available() { return false; }
#endif
#endif
