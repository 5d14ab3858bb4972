// Emulated cuBLAS for the CPU tests: a literal column-major GEMM (cublas_cpu.cpp) behind the same
// signatures, so similarity_gemm.cpp compiles unchanged and its transposes, leading dimensions and
// strides are what the emulated kernels then read.
#pragma once
#include "../cuda_cpu.h"

typedef struct cublasContext* cublasHandle_t;
typedef enum
{
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_NOT_SUPPORTED = 15
} cublasStatus_t;
typedef enum
{
    CUBLAS_OP_N = 0,
    CUBLAS_OP_T = 1
} cublasOperation_t;
typedef enum
{
    CUDA_R_32F = 0,
    CUDA_R_16F = 2
} cudaDataType;
typedef enum
{
    CUBLAS_COMPUTE_32F = 68
} cublasComputeType_t;
typedef enum
{
    CUBLAS_GEMM_DEFAULT = -1
} cublasGemmAlgo_t;

extern "C" { // C linkage, as the real cuBLAS API (ctypes reaches it too)
cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
const char* cublasGetStatusString(cublasStatus_t status);
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
    int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype, int lda, long long strideA,
    const void* B, cudaDataType Btype, int ldb, long long strideB, const void* beta, void* C, cudaDataType Ctype,
    int ldc, long long strideC, int batchCount, cublasComputeType_t computeType, cublasGemmAlgo_t algo);
}

// Test hook: cuBLAS handles created and not yet destroyed.
extern "C" long cp_emu_live_cublas_handles(void);
