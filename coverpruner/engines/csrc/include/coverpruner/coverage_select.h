/*
 * C entry point of the CUDA coverage selector (libcoverpruner_selector.so).
 *
 * Representational Coverage Maximization on the GPU, for a batch of B images:
 *   Vn = V / max(||V||, 1e-12) per row; M = Vn Vn^T (cuBLAS, float32 accumulation);
 *   A = max(0, M - rowmean(M)); w = exp(tau * minmax(r)) (1 when r is NULL or constant);
 *   m = min(budget, n) greedy steps of k* = argmax_{k not in S} sum_i w_i max(0, A_ik - c_i)
 *   (ties -> lowest index), c = max(c, A[:, k*]); keep = S sorted ascending.
 *
 * Pointers to tensors are device pointers. The stream and cuBLAS handle are passed as void* so
 * this header needs no CUDA headers (ctypes and the header-free plugin core include it).
 */
#ifndef COVERPRUNER_COVERAGE_SELECT_H
#define COVERPRUNER_COVERAGE_SELECT_H

#include "coverpruner/coverage_workspace.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define CP_API __declspec(dllexport)
#else
#define CP_API __attribute__((visibility("default")))
#endif

/* Status codes; part of the C ABI. */
typedef enum cp_status
{
    CP_OK = 0,
    CP_ERR_INVALID_ARGUMENT = 1,
    CP_ERR_WORKSPACE_TOO_SMALL = 2,
    CP_ERR_CUDA = 3,
    CP_ERR_CUBLAS = 4
} cp_status;

/* Bytes of device workspace cp_coverage_select needs for (batch, n, d, dtype); 0 if invalid. */
CP_API size_t cp_coverage_workspace_size(int64_t batch, int64_t n, int64_t d, int dtype);

/*
 * Runs the selector, asynchronously on `stream`.
 *   features       [batch, n, d]  dtype (CP_DTYPE_FLOAT32 or CP_DTYPE_FLOAT16), row-major, device
 *   relevance      [batch, n]     float32 device pointer, or NULL for uniform weights
 *   budget         tokens to keep (host value, >= 0), used when budget_device is NULL
 *   budget_device  int64 scalar on the device (the TensorRT plugin's `budget` input), or NULL;
 *                  a negative device budget keeps nothing
 *   m = min(budget, n)
 *   tau            temperature used when tau_device is NULL
 *   tau_device     float32 scalar on the device (the plugin's `tau` input), or NULL
 *   keep           [batch, m]     int64 device output, each row sorted ascending; sized for the
 *                  largest possible m (n) when the budget is on the device
 *   keep_length_device  int32 scalar on the device that receives m, or NULL (int32: TensorRT size tensors)
 *   workspace      device buffer of at least cp_coverage_workspace_size(batch, n, d, dtype) bytes
 *                  (may be NULL when a host budget is 0 or >= n: no similarity is computed)
 *   stream         cudaStream_t or NULL (legacy default stream)
 *   cublas         cublasHandle_t or NULL: the library then uses its own handle for (current device, stream),
 *                  created on the first call on that stream (not allowed while the stream is being captured
 *                  into a CUDA graph: run once before capturing) and destroyed by cp_release_handles()
 * Returns a cp_status; cp_last_error() then describes the problem in words.
 */
CP_API int cp_coverage_select(const void* features, int dtype, const float* relevance, int64_t batch, int64_t n,
                              int64_t d, int64_t budget, const int64_t* budget_device, float tau,
                              const float* tau_device, int64_t* keep, int32_t* keep_length_device, void* workspace,
                              size_t workspace_bytes, void* stream, void* cublas);

/* Name of a cp_status value ("CP_OK", ...). */
CP_API const char* cp_status_string(int status);

/* Message of the last failure on the calling thread ("" when none). */
CP_API const char* cp_last_error(void);

/* Checked mode: 1 synchronises the stream after every launch so an error raised while a kernel runs names that
 * kernel (slower; for debugging a device). Default: COVERPRUNER_CUDA_CHECKED=1 in the environment, else off. */
CP_API void cp_set_checked_mode(int on);

/* Destroys the cuBLAS handles the library created for calls with cublas == NULL (teardown, before the CUDA
 * context goes away); returns how many. Later calls create new ones. */
CP_API int cp_release_handles(void);

/* A cuBLAS handle for cp_coverage_select's `cublas` argument, on the current device (CP_OK or CP_ERR_CUBLAS),
 * and its destruction; for callers without cuBLAS headers (the TensorRT plugin creates one per execution
 * context, outside any graph capture, and destroys it with the context). */
CP_API int cp_cublas_create(void** handle);
CP_API void cp_cublas_destroy(void* handle);

/* ABI version of this library; bumped when a signature above changes. */
CP_API int cp_abi_version(void);

#define CP_ABI_VERSION 2 /* cp_abi_version() returns this; 2: keep_length_device is int32 */

#ifdef __cplusplus
}
#endif

#endif /* COVERPRUNER_COVERAGE_SELECT_H */
