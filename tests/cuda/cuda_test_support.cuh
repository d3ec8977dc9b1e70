// Helpers shared by the CUDA tests: random host data, poisoned device outputs, error norms.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <coupledqk/core/random.hpp>
#include <coupledqk/cuda/runtime.cuh>

namespace coupledqk::cuda::testing {

/// n normal(0, std^2) floats from a coupledqk::Rng.
inline std::vector<float> random_vector(std::size_t n, std::uint64_t seed, double std = 1.0) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.normal() * std);
  return v;
}

/// Host floats -> device buffer of storage T (float or bf16).
template <class T>
DeviceBuffer<T> to_device(const std::vector<float>& host) {
  DeviceBuffer<float> f;
  f.upload(host);
  DeviceBuffer<T> out(host.size());
  convert<T, float>(f.data(), out.data(), static_cast<Index>(host.size()));
  COUPLEDQK_CUDA_CHECK(cudaDeviceSynchronize());
  return out;
}

/// Device buffer of storage T -> host floats.
template <class T>
std::vector<float> to_host(const DeviceBuffer<T>& d) {
  DeviceBuffer<float> f(d.size());
  convert<float, T>(d.data(), f.data(), static_cast<Index>(d.size()));
  COUPLEDQK_CUDA_CHECK(cudaDeviceSynchronize());
  return f.download();
}

/// A device buffer of n elements filled with NaN (0xFF bytes): outputs a kernel must overwrite.
template <class T>
DeviceBuffer<T> poisoned(std::size_t n) {
  DeviceBuffer<T> b(n);
  b.poison();
  return b;
}

/// max |a - b| / max(max |b|, floor): relative to the reference's scale, NaN-propagating.
inline double relative_error(const std::vector<float>& got, const std::vector<float>& want, double floor = 1e-6) {
  REQUIRE(got.size() == want.size());
  double scale = floor, err = 0;
  for (std::size_t i = 0; i < want.size(); ++i) scale = std::max(scale, std::abs(double(want[i])));
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double e = std::abs(double(got[i]) - double(want[i]));
    if (!(e <= err)) err = std::isnan(e) ? INFINITY : e;  // NaN (a poisoned entry left) -> inf
  }
  return err / scale;
}

/// ||got - want||_2 / ||want||_2 (with a floor on the denominator).
inline double relative_l2(const std::vector<float>& got, const std::vector<float>& want, double floor = 1e-12) {
  REQUIRE(got.size() == want.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = double(got[i]) - double(want[i]);
    num += d * d;
    den += double(want[i]) * double(want[i]);
  }
  if (std::isnan(num)) return INFINITY;
  return std::sqrt(num) / std::max(std::sqrt(den), floor);
}

/// 1 where the cases without bf16 storage are compiled: every build except the CPU emulator's
/// exact_bf16 flavour (COUPLEDQK_EMULATOR_EXACT_BF16), which exists for the bf16 code paths. Its
/// float32 cases would be the `emulated` flavour's once more (the same source, the same float type;
/// only the warp order differed), so it compiles only what stores bf16, and CTest runs the `emulated`
/// build in both warp orders instead (tests/cuda/emulator/CMakeLists.txt): issue 26's build time.
/// A case that checks both keeps its bf16 part there.
#if defined(COUPLEDQK_EMULATOR_EXACT_BF16)
#define COUPLEDQK_TEST_FLOAT_CASES 0
#else
#define COUPLEDQK_TEST_FLOAT_CASES 1
#endif

/// The tolerance of a bf16-storage comparison (L2 norm, relative): 2e-2, the rounding of bf16
/// storage. Under the CPU emulator built with COUPLEDQK_EMULATOR_EXACT_BF16 (a "bf16" that keeps the
/// whole float) no rounding is left, so the float tolerance applies: what could still differ is
/// indexing, and it must not.
constexpr double bf16_tolerance() {
#if defined(COUPLEDQK_EMULATOR_EXACT_BF16)
  return 1e-4;
#else
  return 2e-2;
#endif
}

/// The tolerance of the attention layer's bf16 gradients (L2, relative): see test_cuda_layer.cu for
/// why it is 1e-1; 1e-4 under COUPLEDQK_EMULATOR_EXACT_BF16.
constexpr double bf16_gradient_tolerance() {
#if defined(COUPLEDQK_EMULATOR_EXACT_BF16)
  return 1e-4;
#else
  return 1e-1;
#endif
}

}  // namespace coupledqk::cuda::testing
