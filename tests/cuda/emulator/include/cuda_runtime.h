// The CUDA runtime API for the CPU emulator (coupledqk_cuda_emulator.hpp): the subset the coupledqk
// CUDA headers, tests and trainer use, with the same names, types and error behaviour. Every call is
// synchronous; streams are tokens.
#pragma once

#include "coupledqk_cuda_emulator.hpp"

typedef struct CUstream_st* cudaStream_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

enum cudaDeviceAttr {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
  cudaDevAttrMemoryPoolsSupported = 115,
};

enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};

typedef enum cudaDataType_t {
  CUDA_R_32F = 0,
  CUDA_R_64F = 1,
  CUDA_R_16F = 2,
  CUDA_R_16BF = 14,
} cudaDataType;

struct cudaDeviceProp {
  char name[256];
  std::size_t totalGlobalMem;
  std::size_t sharedMemPerBlock;
  std::size_t sharedMemPerBlockOptin;
  int warpSize;
  int maxThreadsPerBlock;
  int multiProcessorCount;
  int major;
  int minor;
};

struct cudaFuncAttributes {
  std::size_t sharedSizeBytes;
  std::size_t constSizeBytes;
  std::size_t localSizeBytes;
  int maxThreadsPerBlock;
  int numRegs;
  int ptxVersion;
  int binaryVersion;
  int maxDynamicSharedSizeBytes;
};

inline const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
  }
  return "cudaErrorUnknown";
}
inline const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
  }
  return "unknown error";
}

inline cudaError_t cudaGetLastError() {
  const cudaError_t e = coupledqk_emulator::last_error();
  coupledqk_emulator::last_error() = cudaSuccess;
  return e;
}
inline cudaError_t cudaPeekAtLastError() { return coupledqk_emulator::last_error(); }

// One emulated device; COUPLEDQK_EMULATOR_NO_DEVICE=1 makes it disappear (to test the skip paths).
inline cudaError_t cudaGetDeviceCount(int* n) {
  if (std::getenv("COUPLEDQK_EMULATOR_NO_DEVICE")) {
    *n = 0;
    return coupledqk_emulator::fail(cudaErrorNoDevice, "COUPLEDQK_EMULATOR_NO_DEVICE is set");
  }
  *n = 1;
  return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int d) {
  return d == 0 ? cudaSuccess : coupledqk_emulator::fail(cudaErrorInvalidDevice, "cudaSetDevice: only device 0");
}
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
  if (d != 0) return coupledqk_emulator::fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties: only device 0");
  *p = cudaDeviceProp{};
  std::snprintf(p->name, sizeof p->name, "coupledqk CPU emulator (not a GPU)");
  p->totalGlobalMem = std::size_t(16) << 30;
  p->sharedMemPerBlock = coupledqk_emulator::default_dynamic_smem;
  p->sharedMemPerBlockOptin = coupledqk_emulator::optin_dynamic_smem;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->multiProcessorCount = coupledqk_emulator::sm_count();
  p->major = 9;
  p->minor = 0;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int d) {
  if (d != 0) return coupledqk_emulator::fail(cudaErrorInvalidDevice, "cudaDeviceGetAttribute: only device 0");
  switch (a) {
    case cudaDevAttrMaxThreadsPerBlock: *v = 1024; return cudaSuccess;
    case cudaDevAttrMultiProcessorCount: *v = coupledqk_emulator::sm_count(); return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = static_cast<int>(coupledqk_emulator::optin_dynamic_smem); return cudaSuccess;
    case cudaDevAttrMemoryPoolsSupported: *v = 1; return cudaSuccess;
  }
  return coupledqk_emulator::fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute: attribute not emulated");
}

inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaStreamCreate(cudaStream_t* s) {
  static CUstream_st* token = reinterpret_cast<CUstream_st*>(std::uintptr_t(0x57));
  *s = token;
  return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }

inline cudaError_t cudaMalloc(void** p, std::size_t bytes) { return coupledqk_emulator::device_malloc(p, bytes); }
template <class T>
inline cudaError_t cudaMalloc(T** p, std::size_t bytes) {
  return coupledqk_emulator::device_malloc(reinterpret_cast<void**>(p), bytes);
}
inline cudaError_t cudaFree(void* p) { return coupledqk_emulator::device_free(p); }
inline cudaError_t cudaMallocAsync(void** p, std::size_t bytes, cudaStream_t) { return cudaMalloc(p, bytes); }
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t) { return cudaFree(p); }

inline cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind) {
  using coupledqk_emulator::Memory;
  const Memory& m = Memory::get();
  const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (kind == cudaMemcpyDefault || kind == cudaMemcpyHostToHost)
    return coupledqk_emulator::fail(cudaErrorInvalidMemcpyDirection, "cudaMemcpy: kind not emulated");
  if (n > 0) {
    if (dst_dev ? !m.device(dst, n) : !m.host(dst, n))
      coupledqk_emulator::fatal(std::string("cudaMemcpy: the destination is not ") + (dst_dev ? "inside one device allocation" : "host memory"));
    if (src_dev ? !m.device(src, n) : !m.host(src, n))
      coupledqk_emulator::fatal(std::string("cudaMemcpy: the source is not ") + (src_dev ? "inside one device allocation" : "host memory"));
    std::memmove(dst, src, n);
  }
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind, cudaStream_t = nullptr) {
  return cudaMemcpy(dst, src, n, kind);
}
inline cudaError_t cudaMemset(void* p, int v, std::size_t n) {
  coupledqk_emulator::require_device_range(p, n, "cudaMemset");
  if (n > 0) std::memset(p, v, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* p, int v, std::size_t n, cudaStream_t = nullptr) { return cudaMemset(p, v, n); }

template <class... Params>
inline cudaError_t cudaFuncSetAttribute(void (*kernel)(Params...), cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
    return coupledqk_emulator::fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: attribute not emulated");
  if (value < 0 || std::size_t(value) > coupledqk_emulator::optin_dynamic_smem)
    return coupledqk_emulator::fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: " + std::to_string(value) +
                                                              " bytes of dynamic shared memory above the device's opt-in limit");
  coupledqk_emulator::smem_limits()[reinterpret_cast<const void*>(kernel)] = std::size_t(value);
  return cudaSuccess;
}
template <class... Params>
inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* a, void (*kernel)(Params...)) {
  *a = cudaFuncAttributes{};
  a->maxThreadsPerBlock = 1024;
  a->ptxVersion = 90;
  a->binaryVersion = 90;
  a->maxDynamicSharedSizeBytes = static_cast<int>(coupledqk_emulator::smem_limit(reinterpret_cast<const void*>(kernel)));
  return cudaSuccess;
}
// Resident blocks per SM as an sm_90 part would allow by threads and shared memory alone.
template <class... Params>
inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* n, void (*kernel)(Params...), int threads,
                                                                 std::size_t smem) {
  if (smem > coupledqk_emulator::smem_limit(reinterpret_cast<const void*>(kernel))) {
    *n = 0;
    return cudaSuccess;
  }
  const int by_threads = threads > 0 ? 2048 / threads : 0;
  const int by_smem = static_cast<int>(233472 / (smem + 1024));
  *n = std::max(0, std::min({by_threads, by_smem, 32}));
  return cudaSuccess;
}
