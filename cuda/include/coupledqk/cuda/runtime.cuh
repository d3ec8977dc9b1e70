// The CUDA runtime pieces every coupledqk CUDA header uses: error checks that throw, device
// detection that never throws, an owning device buffer, the storage types (float32, bf16) and a
// row-major GEMM on cuBLAS with float32 accumulation.
//
// Conventions (the same as the CPU headers, include/coupledqk/core/types.hpp):
//   * activations are row-major [rows, cols] with rows = tokens (b, t); the (token, head) pair
//     (r, h) of a [B*T, D] tensor is the d-wide slice at offset r*D + h*d, i.e. row r*H + h of the
//     same memory read as [B*T*H, d];
//   * parameters and their gradients are float32 (the masters); activations are stored as T
//     (float or bf16) and every sum is accumulated in float32;
//   * cotangents (gradients of activations) are float32.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>

#include <coupledqk/core/error.hpp>
#include <utility>
#include <vector>

namespace coupledqk::cuda {

using Index = std::int64_t;
using bf16 = __nv_bfloat16;

/// A CUDA or cuBLAS call failed (or no device is usable). The message names the call, the
/// error, and where.
class cuda_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
inline std::string where(const char* expr, const char* file, int line) {
  std::ostringstream s;
  s << expr << " at " << file << ":" << line;
  return s.str();
}
inline const char* cublas_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_(unknown)";
  }
}
}  // namespace detail

#define COUPLEDQK_CUDA_CHECK(expr)                                                                      \
  do {                                                                                                  \
    const cudaError_t coupledqk_err_ = (expr);                                                          \
    if (coupledqk_err_ != cudaSuccess)                                                                  \
      throw ::coupledqk::cuda::cuda_error(std::string("CUDA error ") + cudaGetErrorName(coupledqk_err_) + \
                                          " (" + cudaGetErrorString(coupledqk_err_) + ") in " +       \
                                          ::coupledqk::cuda::detail::where(#expr, __FILE__, __LINE__)); \
  } while (0)

#define COUPLEDQK_CUBLAS_CHECK(expr)                                                                      \
  do {                                                                                                    \
    const cublasStatus_t coupledqk_st_ = (expr);                                                          \
    if (coupledqk_st_ != CUBLAS_STATUS_SUCCESS)                                                           \
      throw ::coupledqk::cuda::cuda_error(std::string("cuBLAS error ") +                                  \
                                          ::coupledqk::cuda::detail::cublas_status_name(coupledqk_st_) +  \
                                          " in " + ::coupledqk::cuda::detail::where(#expr, __FILE__, __LINE__)); \
  } while (0)

/// Checks the last kernel launch (launch-configuration errors; execution errors surface at the
/// next synchronising call).
#define COUPLEDQK_CUDA_CHECK_LAUNCH() COUPLEDQK_CUDA_CHECK(cudaGetLastError())

/// Number of usable CUDA devices; 0 when there is no driver, no device, or the driver is too old
/// for this runtime. Never throws.
inline int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky error
    return 0;
  }
  return n;
}
inline bool device_available() noexcept { return device_count() > 0; }

/// Why no device is usable ("" when one is): for messages such as "skipped: no CUDA device (...)".
inline std::string no_device_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
  }
  return n > 0 ? std::string() : std::string("no CUDA device found");
}

/// Throws cuda_error with what was needed when no device is usable.
inline void require_device(const char* what) {
  const std::string why = no_device_reason();
  if (!why.empty()) throw cuda_error(std::string(what) + " needs a CUDA device, and none is usable (" + why + ")");
}

// ---- storage types ------------------------------------------------------------------------------

/// Storage precision of activations: float32, or bf16 with float32 accumulation.
enum class Precision { f32, bf16 };

inline const char* to_string(Precision p) { return p == Precision::f32 ? "f32" : "bf16"; }

/// Parses "f32"/"float32" or "bf16"; throws coupledqk::invalid_argument naming what is accepted.
inline Precision parse_precision(const std::string& s) {
  if (s == "f32" || s == "float32" || s == "fp32") return Precision::f32;
  if (s == "bf16" || s == "bfloat16") return Precision::bf16;
  throw ::coupledqk::invalid_argument("unknown precision '" + s + "'; accepted: f32 (float32), bf16 (bfloat16 storage, float32 accumulation)");
}

template <class T>
struct is_storage : std::bool_constant<std::is_same_v<T, float> || std::is_same_v<T, bf16>> {};

__host__ __device__ inline float to_float(float x) { return x; }
__host__ __device__ inline float to_float(bf16 x) { return __bfloat162float(x); }
template <class T>
__host__ __device__ inline T from_float(float x);
template <>
__host__ __device__ inline float from_float<float>(float x) { return x; }
template <>
__host__ __device__ inline bf16 from_float<bf16>(float x) { return __float2bfloat16_rn(x); }

template <class T>
constexpr cudaDataType_t cuda_data_type() {
  static_assert(is_storage<T>::value, "coupledqk::cuda: storage type must be float or bf16");
  return std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_16BF;
}

// ---- device memory ------------------------------------------------------------------------------

/// An owning, movable array in device memory (cudaMalloc / cudaFree). Size in elements.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n) { resize(n); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = std::exchange(o.ptr_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~DeviceBuffer() { release(); }

  /// Reallocates only when n differs from the current size; contents are then undefined.
  void resize(std::size_t n) {
    if (n == size_) return;
    release();
    if (n > 0) COUPLEDQK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), n * sizeof(T)));
    size_ = n;
  }
  /// Grows to at least n elements (never shrinks): workspaces reused across steps.
  void reserve(std::size_t n) {
    if (n > size_) resize(n);
  }
  void zero(cudaStream_t s = nullptr) {
    if (size_ > 0) COUPLEDQK_CUDA_CHECK(cudaMemsetAsync(ptr_, 0, size_ * sizeof(T), s));
  }
  /// Fills every byte with 0xFF (NaN for float and bf16): tests poison outputs with it.
  void poison(cudaStream_t s = nullptr) {
    if (size_ > 0) COUPLEDQK_CUDA_CHECK(cudaMemsetAsync(ptr_, 0xFF, size_ * sizeof(T), s));
  }
  void upload(const T* host, std::size_t n) {
    resize(n);
    if (n > 0) COUPLEDQK_CUDA_CHECK(cudaMemcpy(ptr_, host, n * sizeof(T), cudaMemcpyHostToDevice));
  }
  void upload(const std::vector<T>& host) { upload(host.data(), host.size()); }
  void download(T* host, std::size_t n) const {
    if (n > size_) throw std::out_of_range("DeviceBuffer::download: asked for " + std::to_string(n) +
                                           " elements, the buffer holds " + std::to_string(size_));
    if (n > 0) COUPLEDQK_CUDA_CHECK(cudaMemcpy(host, ptr_, n * sizeof(T), cudaMemcpyDeviceToHost));
  }
  std::vector<T> download() const {
    std::vector<T> out(size_);
    download(out.data(), size_);
    return out;
  }

  T* data() { return ptr_; }
  const T* data() const { return ptr_; }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  void release() noexcept {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    size_ = 0;
  }
  T* ptr_ = nullptr;
  std::size_t size_ = 0;
};

// ---- launch helpers -----------------------------------------------------------------------------

/// Starts kernel<<<grid, block, shared_bytes, stream>>>(args...) and checks the launch: the one place
/// this library starts a kernel. Built against the CPU emulator of the tests
/// (tests/cuda/emulator, which defines COUPLEDQK_CUDA_EMULATOR), the same call runs the kernel on
/// the CPU instead.
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared_bytes, cudaStream_t stream,
            Args&&... args) {
#if defined(COUPLEDQK_CUDA_EMULATOR)
  (void)stream;
  (void)::coupledqk_emulator::launch(kernel, grid, block, shared_bytes,
                                     std::tuple<Params...>(std::forward<Args>(args)...));
#else
  kernel<<<grid, block, shared_bytes, stream>>>(std::forward<Args>(args)...);
#endif
  COUPLEDQK_CUDA_CHECK_LAUNCH();
}

/// Declares the block's dynamic shared memory as `type name[]`, aligned to `align` bytes.
#if defined(COUPLEDQK_CUDA_EMULATOR)
#define COUPLEDQK_DYNAMIC_SHARED(align, type, name) \
  type* const name = ::coupledqk_emulator::dynamic_shared<type>()
#else
#define COUPLEDQK_DYNAMIC_SHARED(align, type, name) extern __shared__ __align__(align) type name[]
#endif

inline unsigned grid_for(Index n, int block) {
  const Index g = (n + block - 1) / block;
  return static_cast<unsigned>(g < 1 ? 1 : (g > 65535 * 64 ? 65535 * 64 : g));
}

// ---- element-wise conversion ----------------------------------------------------------------------

template <class To, class From>
__global__ void convert_kernel(const From* __restrict__ in, To* __restrict__ out, Index n) {
  for (Index i = blockIdx.x * Index(blockDim.x) + threadIdx.x; i < n; i += Index(gridDim.x) * blockDim.x)
    out[i] = from_float<To>(to_float(in[i]));
}

/// out[i] = in[i] converted (float <-> bf16, or a copy).
template <class To, class From>
void convert(const From* in, To* out, Index n, cudaStream_t s = nullptr) {
  if (n <= 0) return;
  if constexpr (std::is_same_v<To, From>) {
    if (static_cast<const void*>(in) != static_cast<const void*>(out))
      COUPLEDQK_CUDA_CHECK(cudaMemcpyAsync(out, in, n * sizeof(To), cudaMemcpyDeviceToDevice, s));
  } else {
    launch(convert_kernel<To, From>, grid_for(n, 256), 256, 0, s, in, out, n);
  }
}

// ---- cuBLAS ---------------------------------------------------------------------------------------

/// A cuBLAS handle bound to a stream. One per thread of work; not copyable.
class Blas {
 public:
  explicit Blas(cudaStream_t stream = nullptr) : stream_(stream) {
    require_device("coupledqk::cuda::Blas");
    COUPLEDQK_CUBLAS_CHECK(cublasCreate(&handle_));
    COUPLEDQK_CUBLAS_CHECK(cublasSetStream(handle_, stream_));
  }
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  ~Blas() {
    if (handle_) cublasDestroy(handle_);
  }
  cublasHandle_t handle() const { return handle_; }
  cudaStream_t stream() const { return stream_; }

 private:
  cublasHandle_t handle_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

/// Row-major GEMM with float32 accumulation:
///     C[M, N] = alpha * op(A) op(B) + beta * C
/// op(A) is [M, K] (A stored [M, K] with row stride lda, or [K, M] when trans_a); op(B) is [K, N]
/// (B stored [K, N] with row stride ldb, or [N, K] when trans_b); C [M, N] with row stride ldc.
/// A and B share a storage type TA (float or bf16); C is float or TA.
template <class TA, class TC>
void gemm(const Blas& blas, bool trans_a, bool trans_b, Index M, Index N, Index K, float alpha, const TA* A,
          Index lda, const TA* B, Index ldb, float beta, TC* C, Index ldc) {
  static_assert(is_storage<TA>::value && is_storage<TC>::value, "gemm: storage must be float or bf16");
  if (M == 0 || N == 0) return;
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
  COUPLEDQK_CUBLAS_CHECK(cublasGemmEx(blas.handle(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                      trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(N),
                                      static_cast<int>(M), static_cast<int>(K), &alpha, B, cuda_data_type<TA>(),
                                      static_cast<int>(ldb), A, cuda_data_type<TA>(), static_cast<int>(lda), &beta, C,
                                      cuda_data_type<TC>(), static_cast<int>(ldc), CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT));
}

}  // namespace coupledqk::cuda
