// CUDA on the CPU, for the emulation tests (tests/engines/test_cuda_emulation.py).
//
// Runs the real kernels of coverage_select.cu, compiled by g++, with each CUDA block as cooperative fibers
// (ucontext): one fiber per thread, switched only at __syncthreads and warp operations (shuffles, ballots).
// A block runs until every fiber is parked or done; then
//   - a warp whose lanes are all parked at the same warp operation completes it (the exchange is computed
//     while all lanes are parked, so a lane reads what its partner passed at that very instruction);
//   - otherwise, every thread parked at the same __syncthreads releases the barrier;
//   - anything else is a deadlock on real hardware (a barrier some threads skip or reach from another line,
//     a warp operation with a lane missing, exited or elsewhere, a block size that is not a whole number of
//     warps): the launch fails with a fault naming the kernel, the line and what each thread was doing.
// The order in which parked-then-released fibers run between sync points is forward, reverse or seeded
// random (cp_emu_set_order): code that reads shared or global memory another thread writes without a
// barrier in between gives order-dependent results, which the tests compare.
//
// `kernel<<<grid, block, shmem, stream>>>(args)` is not C++: tests/engines/cuda_emulation.py rewrites each
// launch into cuda_cpu::launch("kernel", LaunchConfig(grid, block, shmem, stream), kernel, args) before g++
// sees the file. Launches run synchronously on the calling thread; a fault is sticky, as on a device.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// Shared memory: one instance per host thread; blocks of a launch run one after another on that thread.
#define __shared__ static thread_local

struct dim3
{
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1)
        : x(x_)
        , y(y_)
        , z(z_)
    {
    }
};
using uint3 = dim3;

typedef struct CUstream_st* cudaStream_t;

enum cudaError_t
{
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorLaunchFailure = 719, // what a device reports after a kernel fault (sticky)
};

namespace cuda_cpu
{

enum Order
{
    kForward = 0,
    kReverse = 1,
    kRandom = 2
};

struct LaunchConfig
{
    dim3 grid, block;
    size_t shmem;
    cudaStream_t stream;
    LaunchConfig(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = nullptr)
        : grid(g)
        , block(b)
        , shmem(s)
        , stream(st)
    {
    }
};

// Coordinates of the running fiber, set by the scheduler at every switch.
inline thread_local dim3 t_thread_idx, t_block_idx, t_block_dim, t_grid_dim;

// Runs body() as one CUDA launch of cfg; returns cudaSuccess or the (sticky) error. Defined in cuda_cpu.cpp.
cudaError_t run_launch(char const* name, LaunchConfig const& cfg, std::function<void()> const& body);

// Parks the calling fiber at a block barrier / a warp operation. Defined in cuda_cpu.cpp.
void park_barrier(char const* file, int line);
enum WarpOp
{
    kShflDown = 0,
    kShflXor = 1,
    kShfl = 2,
    kBallot = 3
};
uint64_t park_warp(WarpOp op, unsigned mask, uint64_t value, int arg, int width, char const* file, int line);

template <class T>
T warp_exchange(WarpOp op, unsigned mask, T v, int arg, int width, char const* file, int line)
{
    static_assert(sizeof(T) <= sizeof(uint64_t), "warp operations exchange at most 8 bytes");
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    bits = park_warp(op, mask, bits, arg, width, file, line);
    T out;
    std::memcpy(&out, &bits, sizeof(T));
    return out;
}

template <class... P, class... A>
cudaError_t launch(char const* name, LaunchConfig const& cfg, void (*kernel)(P...), A&&... args)
{
    // Kernel parameters are passed by value, converted once at the launch (as cudaLaunchKernel does).
    std::tuple<P...> params(std::forward<A>(args)...);
    return run_launch(name, cfg, [&] { std::apply(kernel, params); });
}

} // namespace cuda_cpu

#define threadIdx (::cuda_cpu::t_thread_idx)
#define blockIdx (::cuda_cpu::t_block_idx)
#define blockDim (::cuda_cpu::t_block_dim)
#define gridDim (::cuda_cpu::t_grid_dim)
#define __syncthreads() ::cuda_cpu::park_barrier(__FILE__, __LINE__)
#define __shfl_down_sync(mask, v, delta, ...)                                                                   \
    ::cuda_cpu::warp_exchange(::cuda_cpu::kShflDown, (mask), (v), (delta), (__VA_ARGS__ + 0), __FILE__, __LINE__)
#define __shfl_xor_sync(mask, v, lane_mask, ...)                                                                \
    ::cuda_cpu::warp_exchange(::cuda_cpu::kShflXor, (mask), (v), (lane_mask), (__VA_ARGS__ + 0), __FILE__, __LINE__)
#define __shfl_sync(mask, v, src, ...)                                                                          \
    ::cuda_cpu::warp_exchange(::cuda_cpu::kShfl, (mask), (v), (src), (__VA_ARGS__ + 0), __FILE__, __LINE__)
#define __ballot_sync(mask, pred)                                                                               \
    static_cast<unsigned>(::cuda_cpu::park_warp(::cuda_cpu::kBallot, (mask), (pred) ? 1u : 0u, 0, 32, __FILE__, __LINE__))

inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
using std::fmax;
using std::fmin;
using std::fmaxf;
using std::fminf;

cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
char const* cudaGetErrorString(cudaError_t err);
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream = nullptr);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaGetDevice(int* device);
enum cudaStreamCaptureStatus
{
    cudaStreamCaptureStatusNone = 0,
    cudaStreamCaptureStatusActive = 1
};
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status);

// Test hooks (extern "C" so ctypes reaches them): thread order, the last fault's description, reset.
extern "C" void cp_emu_set_order(int order, unsigned seed);
extern "C" char const* cp_emu_fault(void);
extern "C" void cp_emu_reset(void);
extern "C" long cp_emu_launches(void);
// Every stream reports an active capture (1) or none (0); synchronising a capturing stream is an error, as on a
// device. cp_emu_set_pending_error leaves a (non-sticky) error for cudaGetLastError, as a failed earlier call would.
extern "C" void cp_emu_set_capturing(int on);
extern "C" void cp_emu_set_pending_error(int err);
extern "C" long cp_emu_synchronizations(void);
