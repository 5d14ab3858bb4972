// cuBLAS strided-batched GEMM for the coverage selector (see similarity_gemm.h).
#include "similarity_gemm.h"

#include "coverpruner/coverage_select.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <utility>

namespace coverpruner
{
namespace
{

// Handles the library creates for callers that pass none: one per (device, stream). A handle is bound to the
// device current at its creation and must not be used by two threads at once; keying by stream gives each
// concurrent stream its own, and the mutex guards only the map (a caller must not run one stream from two
// threads at once anyway). cublasCreate allocates, which CUDA-graph capture forbids: a capturing stream without
// a handle is refused with a message (run once outside capture, or pass a handle). cp_release_handles()
// destroys them (teardown).
std::mutex g_handles_mutex;
std::map<std::pair<int, void*>, cublasHandle_t> g_handles;

cublasHandle_t handle_for(void* stream, std::string* error)
{
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess)
    {
        *error = "cudaGetDevice failed: no usable CUDA device";
        return nullptr;
    }
    std::lock_guard<std::mutex> lock(g_handles_mutex);
    const auto key = std::make_pair(device, stream);
    const auto it = g_handles.find(key);
    if (it != g_handles.end())
        return it->second;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture) == cudaSuccess
        && capture != cudaStreamCaptureStatusNone)
    {
        *error = "this stream is being captured into a CUDA graph and has no cuBLAS handle yet (creating one "
                 "allocates, which capture forbids): run the selector once on this stream before capturing, or "
                 "pass a cuBLAS handle";
        return nullptr;
    }
    cublasHandle_t handle = nullptr;
    const cublasStatus_t st = cublasCreate(&handle);
    if (st != CUBLAS_STATUS_SUCCESS)
    {
        *error = std::string("cublasCreate failed: ") + cublasGetStatusString(st);
        return nullptr;
    }
    g_handles.emplace(key, handle);
    return handle;
}

} // namespace

int similarity_gemm(void* cublas, void* stream, void const* normalized, bool fp16, int batch, int n, int d,
    float* sim, std::string* error)
{
    cublasHandle_t handle = cublas != nullptr ? static_cast<cublasHandle_t>(cublas) : handle_for(stream, error);
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
    // One GEMM per batch item, each with batchCount 1: cuBLAS picks its algorithm (tiling, split-K) by the batch
    // count too, so one strided call over 3 items rounded M differently from 3 single calls on an H200 and a
    // batch's picks differed from each item's alone on near-ties. The same call per item keeps batched == alone.
    const size_t item = fp16 ? 2 : 4;
    for (int b = 0; b < batch; ++b)
    {
        void const* vb = static_cast<char const*>(normalized) + static_cast<size_t>(b) * stride_v * item;
        st = cublasGemmStridedBatchedEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, n, d, &alpha, vb, in_type, d, stride_v,
            vb, in_type, d, stride_v, &beta, sim + static_cast<size_t>(b) * stride_m, CUDA_R_32F, n, stride_m, 1,
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS)
        {
            *error = std::string("cublasGemmStridedBatchedEx: ") + cublasGetStatusString(st);
            return CP_ERR_CUBLAS;
        }
    }
    return CP_OK;
}

int create_handle(void** handle, std::string* error)
{
    cublasHandle_t h = nullptr;
    const cublasStatus_t st = cublasCreate(&h);
    if (st != CUBLAS_STATUS_SUCCESS)
    {
        *error = std::string("cublasCreate failed: ") + cublasGetStatusString(st);
        return CP_ERR_CUBLAS;
    }
    *handle = h;
    return CP_OK;
}

void destroy_handle(void* handle)
{
    if (handle != nullptr)
        cublasDestroy(static_cast<cublasHandle_t>(handle));
}

int release_handles()
{
    std::lock_guard<std::mutex> lock(g_handles_mutex);
    int released = 0;
    for (auto& entry : g_handles)
        if (cublasDestroy(entry.second) == CUBLAS_STATUS_SUCCESS)
            ++released;
    g_handles.clear();
    return released;
}

} // namespace coverpruner
