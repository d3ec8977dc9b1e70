// cuBLAS for the CPU emulator: handles, and the two GEMMs the library calls (cublasGemmEx and
// cublasGemmStridedBatchedEx) for float32 and bf16 inputs with float32 accumulation, column-major
// as cuBLAS is. Arguments are checked as cuBLAS checks them (CUBLAS_STATUS_INVALID_VALUE), and every
// matrix must lie inside one device allocation.
#pragma once

#include <string>

#include "cuda_bf16.h"
#include "cuda_runtime.h"

typedef enum {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1, CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99 } cublasGemmAlgo_t;

struct cublasContext {
  cudaStream_t stream = nullptr;
};
typedef cublasContext* cublasHandle_t;

inline cublasStatus_t cublasCreate(cublasHandle_t* h) {
  *h = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasDestroy(cublasHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}

namespace coupledqk_emulator {

inline float load_element(const void* p, cudaDataType_t t, long long i) {
  return t == CUDA_R_32F ? static_cast<const float*>(p)[i] : static_cast<float>(static_cast<const __nv_bfloat16*>(p)[i]);
}
inline void store_element(void* p, cudaDataType_t t, long long i, float v) {
  if (t == CUDA_R_32F)
    static_cast<float*>(p)[i] = v;
  else
    static_cast<__nv_bfloat16*>(p)[i] = __nv_bfloat16(v);
}
inline std::size_t element_bytes(cudaDataType_t t) { return t == CUDA_R_32F ? sizeof(float) : sizeof(__nv_bfloat16); }

// Bytes spanned by a column-major rows x cols matrix with leading dimension ld.
inline std::size_t span_bytes(long long rows, long long cols, long long ld, cudaDataType_t t) {
  if (rows == 0 || cols == 0) return 0;
  return static_cast<std::size_t>((cols - 1) * ld + rows) * element_bytes(t);
}

inline cublasStatus_t gemm_batched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                   const void* alpha, const void* A, cudaDataType_t at, int lda, long long sa,
                                   const void* B, cudaDataType_t bt, int ldb, long long sb, const void* beta, void* C,
                                   cudaDataType_t ct, int ldc, long long sc, int batch, cublasComputeType_t compute,
                                   const char* who) {
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  const auto supported = [](cudaDataType_t t) { return t == CUDA_R_32F || t == CUDA_R_16BF; };
  if (compute != CUBLAS_COMPUTE_32F || !supported(at) || !supported(bt) || !supported(ct) || at != bt)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T)) return CUBLAS_STATUS_INVALID_VALUE;
  if (m < 0 || n < 0 || k < 0 || batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
  const long long a_rows = ta == CUBLAS_OP_N ? m : k, a_cols = ta == CUBLAS_OP_N ? k : m;
  const long long b_rows = tb == CUBLAS_OP_N ? k : n, b_cols = tb == CUBLAS_OP_N ? n : k;
  if (lda < std::max<long long>(1, a_rows) || ldb < std::max<long long>(1, b_rows) || ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  for (int p = 0; p < batch; ++p) {
    const char* a = static_cast<const char*>(A) + p * sa * static_cast<long long>(element_bytes(at));
    const char* b = static_cast<const char*>(B) + p * sb * static_cast<long long>(element_bytes(bt));
    char* c = static_cast<char*>(C) + p * sc * static_cast<long long>(element_bytes(ct));
    if (k > 0 && al != 0.0f) {
      require_device_range(a, span_bytes(a_rows, a_cols, lda, at), who);
      require_device_range(b, span_bytes(b_rows, b_cols, ldb, bt), who);
    }
    require_device_range(c, span_bytes(m, n, ldc, ct), who);
    std::vector<float> arow(static_cast<std::size_t>(k));
    for (int i = 0; i < m; ++i) {
      for (int l = 0; l < k; ++l)
        arow[static_cast<std::size_t>(l)] = load_element(a, at, ta == CUBLAS_OP_N ? i + static_cast<long long>(l) * lda : l + static_cast<long long>(i) * lda);
      for (int j = 0; j < n; ++j) {
        float acc = 0.0f;
        if (al != 0.0f)
          for (int l = 0; l < k; ++l)
            acc += arow[static_cast<std::size_t>(l)] *
                   load_element(b, bt, tb == CUBLAS_OP_N ? l + static_cast<long long>(j) * ldb : j + static_cast<long long>(l) * ldb);
        const long long ci = i + static_cast<long long>(j) * ldc;
        // beta == 0: C is not read (it may hold NaN), as in cuBLAS
        const float out = be == 0.0f ? al * acc : al * acc + be * load_element(c, ct, ci);
        store_element(c, ct, ci, out);
      }
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace coupledqk_emulator

inline cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                   const void* alpha, const void* A, cudaDataType_t at, int lda, const void* B,
                                   cudaDataType_t bt, int ldb, const void* beta, void* C, cudaDataType_t ct, int ldc,
                                   cublasComputeType_t compute, cublasGemmAlgo_t) {
  return coupledqk_emulator::gemm_batched(h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta, C, ct, ldc, 0, 1,
                                          compute, "cublasGemmEx");
}
inline cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                                 int k, const void* alpha, const void* A, cudaDataType_t at, int lda,
                                                 long long sa, const void* B, cudaDataType_t bt, int ldb, long long sb,
                                                 const void* beta, void* C, cudaDataType_t ct, int ldc, long long sc,
                                                 int batch, cublasComputeType_t compute, cublasGemmAlgo_t) {
  return coupledqk_emulator::gemm_batched(h, ta, tb, m, n, k, alpha, A, at, lda, sa, B, bt, ldb, sb, beta, C, ct, ldc, sc,
                                          batch, compute, "cublasGemmStridedBatchedEx");
}
