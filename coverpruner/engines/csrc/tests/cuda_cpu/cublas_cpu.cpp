// Literal column-major GEMM behind the emulated cublas_v2.h (see include/cublas_v2.h).
#include "include/cublas_v2.h"
#include "include/cuda_fp16.h"

namespace
{
thread_local long g_live_handles = 0;

float load(const void* base, cudaDataType type, long long index)
{
    if (type == CUDA_R_16F)
        return __half2float(static_cast<const __half*>(base)[index]);
    return static_cast<const float*>(base)[index];
}
} // namespace

struct cublasContext
{
    cudaStream_t stream = nullptr;
};

cublasStatus_t cublasCreate(cublasHandle_t* handle)
{
    if (handle == nullptr)
        return CUBLAS_STATUS_INVALID_VALUE;
    *handle = new cublasContext;
    ++g_live_handles;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle)
{
    if (handle == nullptr)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    --g_live_handles;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream)
{
    if (handle == nullptr)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusString(cublasStatus_t status)
{
    switch (status)
    {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    default: return "CUBLAS_STATUS_OTHER";
    }
}

// C[b] = alpha op(A[b]) op(B[b]) + beta C[b], all column-major; beta == 0 never reads C (cuBLAS's rule, so
// an uninitialised output may hold NaN). Float accumulation in k order.
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
    int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype, int lda, long long strideA,
    const void* B, cudaDataType Btype, int ldb, long long strideB, const void* beta, void* C, cudaDataType Ctype,
    int ldc, long long strideC, int batchCount, cublasComputeType_t computeType, cublasGemmAlgo_t)
{
    if (handle == nullptr)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (m < 0 || n < 0 || k < 0 || batchCount < 0 || lda < (transa == CUBLAS_OP_N ? m : k)
        || ldb < (transb == CUBLAS_OP_N ? k : n) || ldc < m || lda < 1 || ldb < 1 || ldc < 1)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (Ctype != CUDA_R_32F || computeType != CUBLAS_COMPUTE_32F || Atype != Btype)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
    for (int p = 0; p < batchCount; ++p)
    {
        float* c = static_cast<float*>(C) + p * strideC;
        for (int j = 0; j < n; ++j)
            for (int i = 0; i < m; ++i)
            {
                float acc = 0.f;
                for (int l = 0; l < k; ++l)
                {
                    const long long ia = transa == CUBLAS_OP_N ? i + static_cast<long long>(l) * lda
                                                               : l + static_cast<long long>(i) * lda;
                    const long long ib = transb == CUBLAS_OP_N ? l + static_cast<long long>(j) * ldb
                                                               : j + static_cast<long long>(l) * ldb;
                    acc += load(A, Atype, p * strideA + ia) * load(B, Btype, p * strideB + ib);
                }
                float& out = c[i + static_cast<long long>(j) * ldc];
                out = b == 0.f ? a * acc : a * acc + b * out;
            }
    }
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" long cp_emu_live_cublas_handles(void) { return g_live_handles; }
