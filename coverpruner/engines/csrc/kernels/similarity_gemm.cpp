// cuBLAS strided-batched GEMM for the coverage selector (see similarity_gemm.h).
#include "similarity_gemm.h"

#include "coverpruner/coverage_select.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

namespace coverpruner
{
namespace
{

cublasHandle_t thread_handle(std::string* error)
{
    // One handle per host thread: a cuBLAS handle must not be used by concurrent threads.
    thread_local cublasHandle_t handle = nullptr;
    if (handle == nullptr)
    {
        const cublasStatus_t st = cublasCreate(&handle);
        if (st != CUBLAS_STATUS_SUCCESS)
        {
            *error = std::string("cublasCreate failed: ") + cublasGetStatusString(st);
            handle = nullptr;
        }
    }
    return handle;
}

} // namespace

int similarity_gemm(void* cublas, void* stream, void const* normalized, bool fp16, int batch, int n, int d,
    float* sim, std::string* error)
{
    cublasHandle_t handle = cublas != nullptr ? static_cast<cublasHandle_t>(cublas) : thread_handle(error);
    if (handle == nullptr)
        return CP_ERR_CUBLAS;
    cublasStatus_t st = cublasSetStream(handle, static_cast<cudaStream_t>(stream));
    if (st != CUBLAS_STATUS_SUCCESS)
    {
        *error = std::string("cublasSetStream: ") + cublasGetStatusString(st);
        return CP_ERR_CUBLAS;
    }
    // Row-major Vn [n, d] is column-major X [d, n]; M = X^T X is symmetric, so the column-major result
    // is also the row-major M.
    const float alpha = 1.f, beta = 0.f;
    const cudaDataType in_type = fp16 ? CUDA_R_16F : CUDA_R_32F;
    const long long stride_v = static_cast<long long>(n) * d, stride_m = static_cast<long long>(n) * n;
    st = cublasGemmStridedBatchedEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, n, d, &alpha, normalized, in_type, d,
        stride_v, normalized, in_type, d, stride_v, &beta, sim, CUDA_R_32F, n, stride_m, batch, CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS)
    {
        *error = std::string("cublasGemmStridedBatchedEx: ") + cublasGetStatusString(st);
        return CP_ERR_CUBLAS;
    }
    return CP_OK;
}

} // namespace coverpruner
