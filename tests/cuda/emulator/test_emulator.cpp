// Self-tests of the CPU CUDA emulator (include/coupledqk_cuda_emulator.hpp): the checks it claims
// catch what they should, and its cuBLAS, shuffles and wmma compute what the real ones do.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <mma.h>

#include <coupledqk/cuda/runtime.cuh>

namespace cu = coupledqk::cuda;
namespace emu = coupledqk_emulator;

namespace {

// Restores the scheduling order a test changed.
struct OrderGuard {
  emu::Order saved = emu::Order::get();
  explicit OrderGuard(emu::Order::Mode m) { emu::Order::get().mode = m; }
  ~OrderGuard() { emu::Order::get() = saved; }
};

// out[i] = smem[(i + 1) % n] after every thread wrote smem[i] = i, with or without the barrier.
template <bool Barrier>
__global__ void rotate_kernel(float* out) {
  COUPLEDQK_DYNAMIC_SHARED(16, float, smem);
  const int i = static_cast<int>(threadIdx.x), n = static_cast<int>(blockDim.x);
  smem[i] = static_cast<float>(i);
  if constexpr (Barrier) __syncthreads();
  out[i] = smem[(i + 1) % n];
}

template <bool Barrier>
std::vector<float> rotate(int n) {
  cu::DeviceBuffer<float> out(static_cast<std::size_t>(n));
  cu::launch(rotate_kernel<Barrier>, 1, n, n * sizeof(float), nullptr, out.data());
  return out.download();
}

__global__ void warp_sum_kernel(const float* in, float* out) {
  float v = in[threadIdx.x];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  out[threadIdx.x] = v;
}

__global__ void big_smem_kernel(float* out) {
  COUPLEDQK_DYNAMIC_SHARED(16, float, smem);
  smem[threadIdx.x] = 1.0f;
  out[threadIdx.x] = smem[threadIdx.x];
}

__global__ void wmma_kernel(const cu::bf16* a, const cu::bf16* b, float* c) {
  namespace wmma = nvcuda::wmma;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, cu::bf16, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, cu::bf16, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
  wmma::fill_fragment(fc, 0.0f);
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, b, 16);
  wmma::mma_sync(fc, fa, fb, fc);
  wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}

}  // namespace

TEST_CASE("emulator: a missing __syncthreads between warps is visible; with it the result is right") {
  for (auto mode : {emu::Order::forward, emu::Order::reverse, emu::Order::random}) {
    OrderGuard guard(mode);
    const std::vector<float> good = rotate<true>(64);
    for (int i = 0; i < 64; ++i) CHECK(good[static_cast<std::size_t>(i)] == float((i + 1) % 64));
    if (mode == emu::Order::random) continue;  // random may or may not catch it in one launch
    // warp 0 first: thread 31 reads smem[32] before warp 1 wrote it (NaN); reverse: thread 63 reads
    // smem[0] before warp 0 wrote it.
    const std::vector<float> bad = rotate<false>(64);
    CHECK(std::isnan(bad[mode == emu::Order::forward ? 31 : 63]));
  }
}

TEST_CASE("emulator: device memory starts as NaN; copies check their ranges") {
  cu::DeviceBuffer<float> b(100);
  for (float x : b.download()) CHECK(std::isnan(x));
  std::vector<float> host(10);
  CHECK_THROWS_AS(b.download(host.data(), 200), std::out_of_range);  // the library's own check
  CHECK(emu::Memory::get().device(b.data(), 100 * sizeof(float)));
  CHECK_FALSE(emu::Memory::get().device(b.data(), 101 * sizeof(float)));
  CHECK(emu::Memory::get().host(host.data(), host.size() * sizeof(float)));
}

TEST_CASE("emulator: launches are checked as on sm_90") {
  cu::DeviceBuffer<float> out(1024);
  // more than 48 KiB of dynamic shared memory needs cudaFuncSetAttribute first
  const std::size_t big = 64 * 1024;
  CHECK_THROWS_WITH_AS(cu::launch(big_smem_kernel, 1, 32, big, nullptr, out.data()),
                       doctest::Contains("cudaErrorInvalidValue"), cu::cuda_error);
  COUPLEDQK_CUDA_CHECK(cudaFuncSetAttribute(big_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(big)));
  cu::launch(big_smem_kernel, 1, 32, big, nullptr, out.data());
  CHECK(out.download()[0] == 1.0f);
  // above the opt-in limit: refused by the attribute itself
  CHECK(cudaFuncSetAttribute(big_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 300 * 1024) ==
        cudaErrorInvalidValue);
  (void)cudaGetLastError();
  // blocks of more than 1024 threads
  CHECK_THROWS_WITH_AS(cu::launch(warp_sum_kernel, 1, 2048, 0, nullptr, out.data(), out.data()),
                       doctest::Contains("cudaErrorInvalidConfiguration"), cu::cuda_error);
}

TEST_CASE("emulator: shuffles, wmma and cuBLAS compute what the real ones do") {
  std::vector<float> in(32);
  for (int i = 0; i < 32; ++i) in[static_cast<std::size_t>(i)] = float(i) * 0.5f;
  cu::DeviceBuffer<float> din, dout(32);
  din.upload(in);
  cu::launch(warp_sum_kernel, 1, 32, 0, nullptr, din.data(), dout.data());
  for (float x : dout.download()) CHECK(x == doctest::Approx(248.0));  // 0.5 * (0 + ... + 31)

  // C = A B^T for bf16 16x16 tiles (B read col-major = B^T row-major), exact in float here
  std::vector<cu::bf16> a(256), b(256);
  for (int i = 0; i < 256; ++i) {
    a[static_cast<std::size_t>(i)] = __float2bfloat16_rn(float(i % 7) - 3.0f);
    b[static_cast<std::size_t>(i)] = __float2bfloat16_rn(float(i % 5) * 0.25f);
  }
  cu::DeviceBuffer<cu::bf16> da, db;
  da.upload(a);
  db.upload(b);
  cu::DeviceBuffer<float> dc(256);
  cu::launch(wmma_kernel, 1, 32, 0, nullptr, da.data(), db.data(), dc.data());
  const std::vector<float> c = dc.download();
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      float want = 0;
      for (int k = 0; k < 16; ++k) want += float(a[std::size_t(i * 16 + k)]) * float(b[std::size_t(j * 16 + k)]);
      CHECK(c[std::size_t(i * 16 + j)] == want);
    }

  // row-major gemm through cuBLAS: C[2x3] = A[2x4] B[4x3]
  const std::vector<float> A = {1, 2, 3, 4, 5, 6, 7, 8}, B = {1, 0, 2, 0, 1, 0, 3, 0, 1, 0, 2, 0};
  cu::DeviceBuffer<float> dA, dB, dC(6);
  dA.upload(A);
  dB.upload(B);
  cu::Blas blas;
  cu::gemm<float, float>(blas, false, false, 2, 3, 4, 1.0f, dA.data(), 4, dB.data(), 3, 0.0f, dC.data(), 3);
  const std::vector<float> C = dC.download();
  const std::vector<float> want = {10, 10, 5, 26, 22, 17};
  for (std::size_t i = 0; i < 6; ++i) CHECK(C[i] == want[i]);
  // a leading dimension smaller than the row: cuBLAS's CUBLAS_STATUS_INVALID_VALUE, thrown
  const auto bad_ldb = [&] {
    cu::gemm<float, float>(blas, false, false, 2, 3, 4, 1.0f, dA.data(), 4, dB.data(), 2, 0.0f, dC.data(), 3);
  };
  CHECK_THROWS_WITH_AS(bad_ldb(), doctest::Contains("CUBLAS_STATUS_INVALID_VALUE"), cu::cuda_error);
}
