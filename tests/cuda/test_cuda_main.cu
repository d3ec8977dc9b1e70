// main() of the CUDA tests: runs doctest when a CUDA device is usable; otherwise prints
// "skipped: no CUDA device (<reason>)" and exits 77 (CTest's SKIP_RETURN_CODE for these tests).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include <coupledqk/cuda/runtime.cuh>

int main(int argc, char** argv) {
  const std::string why = coupledqk::cuda::no_device_reason();
  if (!why.empty()) {
    std::printf("skipped: no CUDA device (%s)\n", why.c_str());
    return 77;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
    std::printf("CUDA device 0: %s, compute capability %d.%d\n", prop.name, prop.major, prop.minor);
  doctest::Context context(argc, argv);
  return context.run();
}
