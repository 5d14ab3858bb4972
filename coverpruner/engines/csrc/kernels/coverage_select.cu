// CUDA coverage selector: kernels and the C entry point declared in coverpruner/coverage_select.h.
//
// Pipeline for a batch of B problems (one launch each, all on the caller's stream):
//   1. normalize_rows      grid B*n          Vn = V / max(||V||, 1e-12), in the feature dtype
//   2. cuBLAS              strided batched   M = Vn Vn^T, float32 output and accumulation
//   3. center_clip_rows    grid B*n          A = max(0, M - rowmean(M)) in place
//   4. prepare_greedy      grid B            m, demand weights, c = 0 (keep = 0..n-1 if budget >= n)
//   5. initial_gain        grid n/256 x B    gain_k = sum_i w_i A_ik (the O(n^2) part, on every SM)
//   6. greedy_select       grid B            m greedy steps with the incremental gain update, sorted output
// The greedy runs in one block per problem so the m sequential steps cost no kernel launches.
// The cuBLAS call lives in similarity_gemm.cpp, so this file compiles with the bare CUDA toolkit.
#include "coverpruner/coverage_select.h"
#include "greedy_core.cuh"
#include "similarity_gemm.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cfloat>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace
{

constexpr float kNormEps = 1e-12f;
constexpr int kRowThreads = 256;
// One block per problem; __launch_bounds__(kGreedyThreads, 1) lets the greedy use up to 128 registers (it needs
// ~72 with the fresh recomputation of near-best gains): one resident greedy block per SM, which only matters for
// batches larger than the SM count. The compile check (-warn-spills) guards it.
constexpr int kGreedyThreads = 512;
constexpr unsigned kFullMask = 0xffffffffu;

thread_local std::string g_last_error;

int fail(int status, std::string const& message)
{
    g_last_error = message;
    return status;
}

// Checked mode (cp_set_checked_mode, or COVERPRUNER_CUDA_CHECKED=1 in the environment): synchronise the stream
// after each launch, so an error raised while a kernel runs is reported with that kernel's name instead of at
// the caller's next synchronisation. Skipped on a stream being captured into a CUDA graph (a capture may not
// synchronise; its launches only record).
std::atomic<int> g_checked{-1};

bool checked_mode()
{
    int v = g_checked.load();
    if (v < 0)
    {
        char const* env = std::getenv("COVERPRUNER_CUDA_CHECKED");
        v = env != nullptr && env[0] != '\0' && env[0] != '0' ? 1 : 0;
        g_checked.store(v);
    }
    return v == 1;
}

// After a launch (or an async call) named `what`: the launch error, and in checked mode the execution error.
int after_launch(char const* what, cudaStream_t stream)
{
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
        return fail(CP_ERR_CUDA, std::string(what) + ": " + cudaGetErrorString(err));
    if (!checked_mode())
        return CP_OK;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) == cudaSuccess && capture != cudaStreamCaptureStatusNone)
        return CP_OK;
    err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess)
        return fail(CP_ERR_CUDA, std::string(what) + " (checked mode: failed while running): "
                + cudaGetErrorString(err));
    return CP_OK;
}

// Before the first launch: an error already pending on this thread belongs to earlier work (or says that no
// device is usable); report it as such instead of blaming the first kernel of this call.
int before_first_launch()
{
    const cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? CP_OK
        : fail(CP_ERR_CUDA, std::string("CUDA error pending before cp_coverage_select launched anything (from "
                   "earlier work on this thread, or no usable device): ") + cudaGetErrorString(err));
}

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

// Sum over a block of up to 1024 threads; every thread gets the result.
__device__ float block_sum(float v, float* scratch /* [32] shared */)
{
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_down_sync(kFullMask, v, off);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0)
        scratch[warp] = v;
    __syncthreads();
    const int warps = (blockDim.x + 31) >> 5;
    v = (threadIdx.x < warps) ? scratch[threadIdx.x] : 0.f;
    if (warp == 0)
        for (int off = 16; off > 0; off >>= 1)
            v += __shfl_down_sync(kFullMask, v, off);
    if (threadIdx.x == 0)
        scratch[0] = v;
    __syncthreads();
    v = scratch[0];
    __syncthreads(); // scratch may be reused right after
    return v;
}

// Min and max over a block; every thread gets both.
__device__ void block_min_max(float& lo, float& hi, float* scratch_lo, float* scratch_hi)
{
    for (int off = 16; off > 0; off >>= 1)
    {
        lo = fminf(lo, __shfl_down_sync(kFullMask, lo, off));
        hi = fmaxf(hi, __shfl_down_sync(kFullMask, hi, off));
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0)
    {
        scratch_lo[warp] = lo;
        scratch_hi[warp] = hi;
    }
    __syncthreads();
    if (threadIdx.x == 0)
    {
        const int warps = (blockDim.x + 31) >> 5;
        for (int w = 1; w < warps; ++w)
        {
            scratch_lo[0] = fminf(scratch_lo[0], scratch_lo[w]);
            scratch_hi[0] = fmaxf(scratch_hi[0], scratch_hi[w]);
        }
    }
    __syncthreads();
    lo = scratch_lo[0];
    hi = scratch_hi[0];
    __syncthreads();
}

template <typename T>
__global__ void normalize_rows(T const* __restrict__ x, T* __restrict__ y, int d)
{
    __shared__ float scratch[32];
    const size_t row = blockIdx.x;
    T const* xr = x + row * d;
    T* yr = y + row * d;
    float ss = 0.f;
    for (int j = threadIdx.x; j < d; j += blockDim.x)
    {
        const float v = to_float(xr[j]);
        ss += v * v;
    }
    ss = block_sum(ss, scratch);
    const float inv = 1.f / fmaxf(sqrtf(ss), kNormEps);
    for (int j = threadIdx.x; j < d; j += blockDim.x)
        yr[j] = from_float<T>(to_float(xr[j]) * inv);
}

// A[i, :] = max(0, M[i, :] - mean(M[i, :])), one block per row i.
__global__ void center_clip_rows(float* __restrict__ sim, int n)
{
    __shared__ float scratch[32];
    float* row = sim + static_cast<size_t>(blockIdx.x) * n;
    float s = 0.f;
    for (int k = threadIdx.x; k < n; k += blockDim.x)
        s += row[k];
    const float mean = block_sum(s, scratch) / static_cast<float>(n);
    for (int k = threadIdx.x; k < n; k += blockDim.x)
        row[k] = fmaxf(0.f, row[k] - mean);
}

// Block-wide stable compaction: returns, for a thread whose flag is set, its rank among the
// flagged threads of this chunk (in thread order), and via *total the chunk's flagged count.
__device__ int block_rank(bool flag, int* warp_counts /* [33] shared */, int* total)
{
    const unsigned ballot = __ballot_sync(kFullMask, flag);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0)
        warp_counts[warp] = __popc(ballot);
    __syncthreads();
    if (threadIdx.x == 0)
    {
        const int warps = (blockDim.x + 31) >> 5;
        int run = 0;
        for (int w = 0; w < warps; ++w)
        {
            const int c = warp_counts[w];
            warp_counts[w] = run;
            run += c;
        }
        warp_counts[32] = run;
    }
    __syncthreads();
    const int rank = warp_counts[warp] + __popc(ballot & ((1u << lane) - 1u));
    *total = warp_counts[32];
    __syncthreads(); // warp_counts is reused by the next chunk
    return rank;
}

// Block-wide reduction with a binary op (fmax for floats and doubles, min for ints); every thread gets the result.
// scratch: one slot per warp in shared memory (>= 32).
template <typename T, typename Op>
__device__ T block_reduce(T v, T* scratch, Op op)
{
    for (int off = 16; off > 0; off >>= 1)
        v = op(v, __shfl_down_sync(kFullMask, v, off));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0)
        scratch[warp] = v;
    __syncthreads();
    if (threadIdx.x == 0)
    {
        const int warps = (blockDim.x + 31) >> 5;
        for (int w = 1; w < warps; ++w)
            scratch[0] = op(scratch[0], scratch[w]);
    }
    __syncthreads();
    v = scratch[0];
    __syncthreads();
    return v;
}

struct MaxOp
{
    __device__ double operator()(double a, double b) const { return fmax(a, b); }
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct PlusOp
{
    __device__ double operator()(double a, double b) const { return a + b; }
};
struct MinOp
{
    __device__ int operator()(int a, int b) const { return min(a, b); }
};

namespace greedy = coverpruner::greedy;
using greedy::ProblemView;
using greedy::Scratch;

// The cooperative primitives greedy_core.cuh asks for, on one CUDA block (shared-memory scratch
// declared by the kernel). blockDim.x must be a multiple of 32: the ballots and shuffles cover whole warps.
struct DeviceBlock
{
    float* f_lo;      // [32]
    float* f_hi;      // [32]
    double* d;        // [32]
    int* i;           // [33]
    int* warp_counts; // [33]

    __device__ int tid() const { return threadIdx.x; }
    __device__ int size() const { return blockDim.x; }
    __device__ void sync() { __syncthreads(); }
    __device__ float sum(float v) { return block_sum(v, f_lo); }
    __device__ void min_max(float& lo, float& hi) { block_min_max(lo, hi, f_lo, f_hi); }
    __device__ double sum_d(double v) { return block_reduce(v, d, PlusOp{}); }
    __device__ double max(double v) { return block_reduce(v, d, MaxOp{}); }
    __device__ float max(float v) { return block_reduce(v, f_hi, MaxOp{}); }
    __device__ int min_int(int v) { return block_reduce(v, i, MinOp{}); }
    __device__ int rank(bool flag, int* total) { return block_rank(flag, warp_counts, total); }
};

#define CP_DEVICE_BLOCK(name)                                                                              \
    __shared__ float name##_f_lo[32], name##_f_hi[32];                                                     \
    __shared__ double name##_d[32];                                                                        \
    __shared__ int name##_i[33], name##_counts[33];                                                        \
    DeviceBlock name{name##_f_lo, name##_f_hi, name##_d, name##_i, name##_counts}

// m = min(budget, n) with the budget on the host (budget_device == nullptr) or on the device.
__device__ __forceinline__ int device_keep_count(int64_t const* budget_device, int64_t budget_host, int n)
{
    return greedy::keep_count(budget_device != nullptr ? *budget_device : budget_host, n);
}

// Step 1 of the greedy, one block per problem: m, keep = 0..n-1 when budget >= n (the other kernels then
// return at once), demand weights, c = 0, nothing selected.
__global__ void prepare_greedy(float const* __restrict__ sim_all, float const* __restrict__ relevance_all,
    float tau_host, float const* __restrict__ tau_device, int64_t budget_host,
    int64_t const* __restrict__ budget_device, int n, Scratch s, int64_t* __restrict__ keep_all,
    int32_t* __restrict__ keep_length)
{
    CP_DEVICE_BLOCK(blk);
    const size_t b = blockIdx.x;
    const int m = device_keep_count(budget_device, budget_host, n);
    if (b == 0 && threadIdx.x == 0 && keep_length != nullptr)
        *keep_length = m;
    const float tau = tau_device != nullptr ? *tau_device : tau_host;
    float const* r = relevance_all != nullptr ? relevance_all + b * n : nullptr;
    greedy::prepare(blk, r, tau, ProblemView(sim_all, s, b, n), n, m, keep_all + b * m);
}

// Step 2, over the whole grid (x: column tiles, y: problems): the O(n^2) initial gains get every SM.
__global__ void initial_gain(float const* __restrict__ sim_all, int64_t budget_host,
    int64_t const* __restrict__ budget_device, int n, Scratch s)
{
    if (device_keep_count(budget_device, budget_host, n) == n)
        return;
    const int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k < n)
        greedy::initial_gain_column(ProblemView(sim_all, s, blockIdx.y, n), n, k);
}

// Step 3, one block per problem: the m sequential picks and the sorted output; keep is [B, m].
__global__ void __launch_bounds__(kGreedyThreads, 1) greedy_select(float const* __restrict__ sim_all,
    int64_t budget_host, int64_t const* __restrict__ budget_device, int n, Scratch s, int64_t* __restrict__ keep_all)
{
    CP_DEVICE_BLOCK(blk);
    const size_t b = blockIdx.x;
    const int m = device_keep_count(budget_device, budget_host, n);
    if (m == n)
        return; // prepare_greedy wrote keep
    greedy::select(blk, ProblemView(sim_all, s, b, n), n, m, keep_all + b * m);
}

// budget >= n keeps every token: keep[b, i] = i.
__global__ void iota_rows(int64_t* keep, int n, size_t total, int32_t* keep_length)
{
    const size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx < total)
        keep[idx] = static_cast<int64_t>(idx % n);
    if (idx == 0 && keep_length != nullptr)
        *keep_length = n;
}

} // namespace

extern "C" size_t cp_coverage_workspace_size(int64_t batch, int64_t n, int64_t d, int dtype)
{
    cp_workspace_layout layout;
    return cp_workspace_layout_for(batch, n, d, dtype, &layout) == 0 ? layout.total : 0;
}

extern "C" const char* cp_status_string(int status)
{
    switch (status)
    {
    case CP_OK: return "CP_OK";
    case CP_ERR_INVALID_ARGUMENT: return "CP_ERR_INVALID_ARGUMENT";
    case CP_ERR_WORKSPACE_TOO_SMALL: return "CP_ERR_WORKSPACE_TOO_SMALL";
    case CP_ERR_CUDA: return "CP_ERR_CUDA";
    case CP_ERR_CUBLAS: return "CP_ERR_CUBLAS";
    default: return "CP_UNKNOWN_STATUS";
    }
}

extern "C" const char* cp_last_error(void) { return g_last_error.c_str(); }

extern "C" int cp_abi_version(void) { return CP_ABI_VERSION; }

extern "C" void cp_set_checked_mode(int on) { g_checked.store(on ? 1 : 0); }

extern "C" int cp_release_handles(void) { return coverpruner::release_handles(); }

extern "C" int cp_cublas_create(void** handle)
{
    g_last_error.clear();
    if (handle == nullptr)
        return fail(CP_ERR_INVALID_ARGUMENT, "cp_cublas_create: handle must be non-NULL");
    std::string error;
    const int status = coverpruner::create_handle(handle, &error);
    return status == CP_OK ? CP_OK : fail(status, error);
}

extern "C" void cp_cublas_destroy(void* handle) { coverpruner::destroy_handle(handle); }

extern "C" int cp_coverage_select(const void* features, int dtype, const float* relevance, int64_t batch, int64_t n,
    int64_t d, int64_t budget, const int64_t* budget_device, float tau, const float* tau_device, int64_t* keep,
    int32_t* keep_length_device, void* workspace, size_t workspace_bytes, void* stream_ptr, void* cublas_ptr)
{
    g_last_error.clear();
    if (batch < 0 || n < 0 || d < 0 || (budget_device == nullptr && budget < 0))
        return fail(CP_ERR_INVALID_ARGUMENT, "batch, n, d and budget must be >= 0 (got batch=" + std::to_string(batch)
                + ", n=" + std::to_string(n) + ", d=" + std::to_string(d) + ", budget=" + std::to_string(budget) + ")");
    if (dtype != CP_DTYPE_FLOAT32 && dtype != CP_DTYPE_FLOAT16)
        return fail(CP_ERR_INVALID_ARGUMENT, "dtype must be CP_DTYPE_FLOAT32 (0) or CP_DTYPE_FLOAT16 (1), got "
                + std::to_string(dtype));
    if (n > INT_MAX / 2 || d > INT_MAX / 2)
        return fail(CP_ERR_INVALID_ARGUMENT, "n and d must fit cuBLAS int dimensions");
    if (batch > 65535)
        return fail(CP_ERR_INVALID_ARGUMENT, "batch must be <= 65535 (a CUDA grid's y dimension), got "
                + std::to_string(batch));
    cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
    cudaError_t err = cudaSuccess;

    // A host budget that keeps nothing or everything needs no similarity at all.
    if (budget_device == nullptr && (batch == 0 || n == 0 || budget == 0 || budget >= n))
    {
        const size_t total = budget >= n ? static_cast<size_t>(batch) * n : 0;
        if (total > 0)
        {
            if (keep == nullptr)
                return fail(CP_ERR_INVALID_ARGUMENT, "keep must be a non-NULL device pointer");
            if (before_first_launch() != CP_OK)
                return CP_ERR_CUDA;
            iota_rows<<<static_cast<unsigned>((total + 255) / 256), 256, 0, stream>>>(
                keep, static_cast<int>(n), total, keep_length_device);
            return after_launch("iota_rows (budget >= n)", stream);
        }
        if (keep_length_device != nullptr)
            err = cudaMemsetAsync(keep_length_device, 0, sizeof(int32_t), stream);
        return err == cudaSuccess ? CP_OK : fail(CP_ERR_CUDA, std::string("trivial budget: ") + cudaGetErrorString(err));
    }
    if (batch == 0 || n == 0)
    {
        if (keep_length_device != nullptr)
            err = cudaMemsetAsync(keep_length_device, 0, sizeof(int32_t), stream);
        return err == cudaSuccess ? CP_OK : fail(CP_ERR_CUDA, std::string("empty input: ") + cudaGetErrorString(err));
    }
    if (keep == nullptr || features == nullptr)
        return fail(CP_ERR_INVALID_ARGUMENT, "features and keep must be non-NULL device pointers");

    cp_workspace_layout layout;
    if (cp_workspace_layout_for(batch, n, d, dtype, &layout) != 0)
        return fail(CP_ERR_INVALID_ARGUMENT, "workspace size overflows for this shape");
    if (workspace == nullptr || workspace_bytes < layout.total)
        return fail(CP_ERR_WORKSPACE_TOO_SMALL, "workspace needs " + std::to_string(layout.total) + " bytes, got "
                + std::to_string(workspace_bytes));

    if (before_first_launch() != CP_OK)
        return CP_ERR_CUDA;
    char* ws = static_cast<char*>(workspace);
    void* normalized = ws + layout.normalized;
    float* sim = reinterpret_cast<float*>(ws + layout.similarity);
    const unsigned rows = static_cast<unsigned>(batch * n);

    if (dtype == CP_DTYPE_FLOAT16)
        normalize_rows<__half><<<rows, kRowThreads, 0, stream>>>(
            static_cast<__half const*>(features), static_cast<__half*>(normalized), static_cast<int>(d));
    else
        normalize_rows<float><<<rows, kRowThreads, 0, stream>>>(
            static_cast<float const*>(features), static_cast<float*>(normalized), static_cast<int>(d));
    if (after_launch("normalize_rows", stream) != CP_OK)
        return CP_ERR_CUDA;

    std::string gemm_error;
    const int gemm_status = coverpruner::similarity_gemm(cublas_ptr, stream, normalized, dtype == CP_DTYPE_FLOAT16,
        static_cast<int>(batch), static_cast<int>(n), static_cast<int>(d), sim, &gemm_error);
    if (gemm_status != CP_OK)
        return fail(gemm_status, gemm_error);
    if (after_launch("cuBLAS similarity GEMM", stream) != CP_OK)
        return CP_ERR_CUDA;
    const int ni = static_cast<int>(n);

    center_clip_rows<<<rows, kRowThreads, 0, stream>>>(sim, ni);
    if (after_launch("center_clip_rows", stream) != CP_OK)
        return CP_ERR_CUDA;

    Scratch scratch;
    scratch.weights = reinterpret_cast<float*>(ws + layout.weights);
    scratch.cover = reinterpret_cast<float*>(ws + layout.cover);
    scratch.gain = reinterpret_cast<float*>(ws + layout.gain);
    scratch.gain_error = reinterpret_cast<float*>(ws + layout.gain_error);
    scratch.fresh = reinterpret_cast<double*>(ws + layout.fresh);
    scratch.changed_row = reinterpret_cast<int*>(ws + layout.changed_row);
    scratch.changed_old = reinterpret_cast<float*>(ws + layout.changed_old);
    scratch.changed_new = reinterpret_cast<float*>(ws + layout.changed_new);
    scratch.selected = reinterpret_cast<unsigned char*>(ws + layout.selected);
    // Fewer threads for small n: idle warps would only add barrier cost. Multiple of 32.
    int threads = static_cast<int>(((n + 31) / 32) * 32);
    threads = threads > kGreedyThreads ? kGreedyThreads : threads;
    prepare_greedy<<<static_cast<unsigned>(batch), threads, 0, stream>>>(
        sim, relevance, tau, tau_device, budget, budget_device, ni, scratch, keep, keep_length_device);
    if (after_launch("prepare_greedy", stream) != CP_OK)
        return CP_ERR_CUDA;
    const dim3 gain_grid(static_cast<unsigned>((n + kRowThreads - 1) / kRowThreads), static_cast<unsigned>(batch));
    initial_gain<<<gain_grid, kRowThreads, 0, stream>>>(sim, budget, budget_device, ni, scratch);
    if (after_launch("initial_gain", stream) != CP_OK)
        return CP_ERR_CUDA;
    greedy_select<<<static_cast<unsigned>(batch), threads, 0, stream>>>(
        sim, budget, budget_device, ni, scratch, keep);
    if (after_launch("greedy_select", stream) != CP_OK)
        return CP_ERR_CUDA;
    return CP_OK;
}
