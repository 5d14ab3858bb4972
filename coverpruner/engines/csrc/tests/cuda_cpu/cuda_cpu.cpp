// Fiber scheduler of the CUDA-on-CPU emulation (see cuda_cpu.h for the model).
#include "cuda_cpu.h"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <vector>

#if defined(__x86_64__)
// A fiber switch that saves only the callee-saved registers (System V ABI): swapcontext also saves the signal
// mask with a system call, 20x slower; the emulation switches millions of times per test.
// void cp_fiber_switch(void** save_sp, void* load_sp)
asm(R"(
    .text
    .p2align 4
    .type cp_fiber_switch, @function
cp_fiber_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cp_fiber_switch, .-cp_fiber_switch
)");
extern "C" void cp_fiber_switch(void** save_sp, void* load_sp);
#endif

namespace cuda_cpu
{
namespace
{

constexpr size_t kStackBytes = 256 * 1024; // the kernels need a few KiB; pages are only touched when used
constexpr unsigned kMaxThreads = 1024;

enum State
{
    kReady,
    kAtBarrier,
    kAtWarp,
    kDone
};

struct Fiber
{
#if defined(__x86_64__)
    void* sp = nullptr;
#else
    ucontext_t ctx;
#endif
    std::unique_ptr<char[]> stack;
    State state = kDone;
    dim3 tid;
    char const* file = "";
    int line = 0;
    WarpOp op = kShflDown;
    unsigned mask = 0;
    int arg = 0, width = 32;
    uint64_t value = 0, result = 0;
};

struct Scheduler
{
    std::vector<Fiber> fibers;
#if defined(__x86_64__)
    void* main_sp = nullptr;
#else
    ucontext_t main_ctx;
#endif
    Fiber* current = nullptr;
    std::function<void()> const* body = nullptr;
    int order = kForward;
    std::mt19937 rng{12345};
    cudaError_t sticky = cudaSuccess; // a fault: every later launch fails too, as on a device
    cudaError_t last = cudaSuccess;   // cudaGetLastError's value
    std::string fault;
    long launches = 0;
    long synchronizations = 0;
    bool capturing = false;
};

thread_local Scheduler g;

void switch_to_scheduler()
{
    Fiber* f = g.current;
#if defined(__x86_64__)
    cp_fiber_switch(&f->sp, g.main_sp);
#else
    swapcontext(&f->ctx, &g.main_ctx);
#endif
}

void switch_to(Fiber& f)
{
#if defined(__x86_64__)
    cp_fiber_switch(&g.main_sp, f.sp);
#else
    swapcontext(&g.main_ctx, &f.ctx);
#endif
}

void fiber_entry()
{
    (*g.body)();
    g.current->state = kDone;
    switch_to_scheduler(); // never resumed: the next launch re-initialises this fiber's stack
    std::abort();
}

void init_fiber(Fiber& f)
{
#if defined(__x86_64__)
    // Top of stack: [S] = fiber_entry (popped by ret), [S + 8] = a null return address for fiber_entry, with
    // S 16-byte aligned so fiber_entry starts with the ABI's alignment; below S the six registers popped first.
    auto top = reinterpret_cast<uintptr_t>(f.stack.get() + kStackBytes) & ~uintptr_t{15};
    auto* s = reinterpret_cast<void**>(top - 16);
    s[0] = reinterpret_cast<void*>(&fiber_entry);
    s[1] = nullptr;
    for (int r = 1; r <= 6; ++r)
        s[-r] = nullptr;
    f.sp = s - 6;
#else
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.get();
    f.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.uc_link = &g.main_ctx;
    makecontext(&f.ctx, fiber_entry, 0);
#endif
}

std::string site(Fiber const& f) { return std::string(f.file) + ":" + std::to_string(f.line); }

char const* op_name(WarpOp op)
{
    switch (op)
    {
    case kShflDown: return "__shfl_down_sync";
    case kShflXor: return "__shfl_xor_sync";
    case kShfl: return "__shfl_sync";
    case kBallot: return "__ballot_sync";
    }
    return "?";
}

std::string describe(Fiber const& f)
{
    switch (f.state)
    {
    case kReady: return "running";
    case kAtBarrier: return "at __syncthreads " + site(f);
    case kAtWarp: return std::string("at ") + op_name(f.op) + " " + site(f);
    case kDone: return "exited";
    }
    return "?";
}

// "threads 0-31 at X; 32-63 exited" for a fault message: runs of equal descriptions.
std::string describe_block(size_t first, size_t count)
{
    std::string out;
    size_t i = first;
    while (i < first + count)
    {
        const std::string what = describe(g.fibers[i]);
        size_t j = i;
        while (j + 1 < first + count && describe(g.fibers[j + 1]) == what)
            ++j;
        if (!out.empty())
            out += "; ";
        out += "thread " + std::to_string(i) + (j > i ? "-" + std::to_string(j) : "") + " " + what;
        i = j + 1;
    }
    return out;
}

// Completes warp w's operation when all its mask lanes are parked at it; "" or a fault description.
std::string resolve_warp(size_t w, size_t nthreads, bool* resolved)
{
    const size_t base = w * 32;
    Fiber* lead = nullptr;
    for (size_t t = base; t < std::min(base + 32, nthreads); ++t)
        if (g.fibers[t].state == kAtWarp)
        {
            lead = &g.fibers[t];
            break;
        }
    if (lead == nullptr)
        return "";
    const unsigned mask = lead->mask;
    for (unsigned lane = 0; lane < 32; ++lane)
    {
        if (!(mask >> lane & 1u))
            continue;
        const size_t t = base + lane;
        if (t >= nthreads)
            return std::string(op_name(lead->op)) + " at " + site(*lead) + " with mask 0x"
                + [&] { char b[16]; std::snprintf(b, sizeof b, "%08x", mask); return std::string(b); }()
                + " but the block has only " + std::to_string(nthreads)
                + " threads: a partial warp (block size not a multiple of 32)";
        Fiber const& f = g.fibers[t];
        if (f.state != kAtWarp || f.op != lead->op || f.file != lead->file || f.line != lead->line
            || f.mask != mask)
            return std::string("divergent warp operation in warp ") + std::to_string(w) + ": "
                + describe_block(base, std::min<size_t>(32, nthreads - base));
    }
    const int width = lead->width == 0 ? 32 : lead->width;
    for (unsigned lane = 0; lane < 32; ++lane)
    {
        if (!(mask >> lane & 1u))
            continue;
        Fiber& f = g.fibers[base + lane];
        const int seg = static_cast<int>(lane) / width * width, in = static_cast<int>(lane) % width;
        int src = static_cast<int>(lane);
        switch (f.op)
        {
        case kShflDown: src = in + f.arg < width ? static_cast<int>(lane) + f.arg : static_cast<int>(lane); break;
        case kShflXor: src = seg + ((in ^ f.arg) & (width - 1)); break;
        case kShfl: src = seg + (f.arg % width + width) % width; break;
        case kBallot: break;
        }
        if (f.op == kBallot)
        {
            uint64_t bits = 0;
            for (unsigned l = 0; l < 32; ++l)
                if ((mask >> l & 1u) && g.fibers[base + l].value != 0)
                    bits |= uint64_t{1} << l;
            f.result = bits;
        }
        else
        {
            if (!(mask >> src & 1u))
                return std::string(op_name(f.op)) + " at " + site(f) + ": lane " + std::to_string(lane)
                    + " reads lane " + std::to_string(src) + ", which is not in the mask";
            f.result = g.fibers[base + src].value;
        }
    }
    for (unsigned lane = 0; lane < 32; ++lane)
        if (mask >> lane & 1u)
            g.fibers[base + lane].state = kReady;
    *resolved = true;
    return "";
}

// Runs one block to completion; "" or a fault description.
std::string run_block(size_t nthreads)
{
    std::vector<size_t> order(nthreads);
    for (;;)
    {
        for (size_t i = 0; i < nthreads; ++i)
            order[i] = g.order == kReverse ? nthreads - 1 - i : i;
        if (g.order == kRandom)
            std::shuffle(order.begin(), order.end(), g.rng);
        for (size_t t : order)
        {
            Fiber& f = g.fibers[t];
            if (f.state != kReady)
                continue;
            g.current = &f;
            t_thread_idx = f.tid;
            switch_to(f);
        }
        g.current = nullptr;
        bool resolved = false;
        for (size_t w = 0; w * 32 < nthreads; ++w)
        {
            const std::string err = resolve_warp(w, nthreads, &resolved);
            if (!err.empty())
                return err;
        }
        if (resolved)
            continue;
        size_t done = 0, at_barrier = 0;
        Fiber const* first = nullptr;
        bool same_site = true;
        for (size_t t = 0; t < nthreads; ++t)
        {
            Fiber const& f = g.fibers[t];
            if (f.state == kDone)
                ++done;
            else if (f.state == kAtBarrier)
            {
                ++at_barrier;
                if (first == nullptr)
                    first = &f;
                else if (f.file != first->file || f.line != first->line)
                    same_site = false;
            }
        }
        if (done == nthreads)
            return "";
        if (at_barrier == nthreads && same_site)
        {
            for (auto& f : g.fibers)
                if (f.state == kAtBarrier)
                    f.state = kReady;
            continue;
        }
        return "deadlock at a block barrier: " + describe_block(0, nthreads);
    }
}

} // namespace

cudaError_t run_launch(char const* name, LaunchConfig const& cfg, std::function<void()> const& body)
{
    ++g.launches;
    if (g.sticky != cudaSuccess)
        return g.last = g.sticky;
    const size_t nthreads = static_cast<size_t>(cfg.block.x) * cfg.block.y * cfg.block.z;
    if (nthreads == 0 || nthreads > kMaxThreads || cfg.grid.x == 0 || cfg.grid.y == 0 || cfg.grid.z == 0
        || cfg.grid.y > 65535 || cfg.grid.z > 65535)
        return g.last = cudaErrorInvalidConfiguration;
    if (g.fibers.size() < nthreads)
        g.fibers.resize(nthreads);
    t_block_dim = cfg.block;
    t_grid_dim = cfg.grid;
    g.body = &body;
    for (unsigned bz = 0; bz < cfg.grid.z; ++bz)
        for (unsigned by = 0; by < cfg.grid.y; ++by)
            for (unsigned bx = 0; bx < cfg.grid.x; ++bx)
            {
                t_block_idx = dim3(bx, by, bz);
                for (size_t t = 0; t < nthreads; ++t)
                {
                    Fiber& f = g.fibers[t];
                    if (!f.stack)
                        f.stack.reset(new char[kStackBytes]);
                    init_fiber(f);
                    f.state = kReady;
                    f.tid = dim3(static_cast<unsigned>(t % cfg.block.x),
                        static_cast<unsigned>(t / cfg.block.x % cfg.block.y),
                        static_cast<unsigned>(t / (static_cast<size_t>(cfg.block.x) * cfg.block.y)));
                }
                const std::string err = run_block(nthreads);
                if (!err.empty())
                {
                    // The parked fibers are abandoned (their stacks are reused by the next launch).
                    g.fault = std::string(name) + " block (" + std::to_string(bx) + "," + std::to_string(by) + ","
                        + std::to_string(bz) + "): " + err;
                    g.sticky = cudaErrorLaunchFailure;
                    return g.last = g.sticky;
                }
            }
    return cudaSuccess;
}

void park_barrier(char const* file, int line)
{
    Fiber* f = g.current;
    f->state = kAtBarrier;
    f->file = file;
    f->line = line;
    switch_to_scheduler();
}

uint64_t park_warp(WarpOp op, unsigned mask, uint64_t value, int arg, int width, char const* file, int line)
{
    Fiber* f = g.current;
    f->state = kAtWarp;
    f->op = op;
    f->mask = mask;
    f->value = value;
    f->arg = arg;
    f->width = width == 0 ? 32 : width;
    f->file = file;
    f->line = line;
    switch_to_scheduler();
    return f->result;
}

} // namespace cuda_cpu

using cuda_cpu::g;

cudaError_t cudaGetLastError()
{
    const cudaError_t e = g.last;
    g.last = g.sticky;
    return e;
}

cudaError_t cudaPeekAtLastError() { return g.last; }

char const* cudaGetErrorString(cudaError_t err)
{
    switch (err)
    {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorLaunchFailure: return "unspecified launch failure (emulation fault)";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    }
    return "unknown error";
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t)
{
    if (g.sticky != cudaSuccess)
        return g.sticky;
    if (ptr == nullptr && bytes > 0)
        return cudaErrorInvalidValue;
    std::memset(ptr, value, bytes);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t)
{
    ++g.synchronizations;
    if (g.capturing)
        return cudaErrorStreamCaptureUnsupported;
    return g.sticky;
}

cudaError_t cudaDeviceSynchronize() { return cudaStreamSynchronize(nullptr); }

cudaError_t cudaGetDevice(int* device)
{
    *device = 0;
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus* status)
{
    *status = g.capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}

extern "C" void cp_emu_set_order(int order, unsigned seed)
{
    g.order = order;
    g.rng.seed(seed);
}

extern "C" char const* cp_emu_fault(void) { return g.fault.c_str(); }

extern "C" void cp_emu_reset(void)
{
    g.fault.clear();
    g.sticky = g.last = cudaSuccess;
    g.launches = g.synchronizations = 0;
    g.capturing = false;
}

extern "C" void cp_emu_set_capturing(int on) { g.capturing = on != 0; }

extern "C" void cp_emu_set_pending_error(int err) { g.last = static_cast<cudaError_t>(err); }

extern "C" long cp_emu_synchronizations(void) { return g.synchronizations; }

extern "C" long cp_emu_launches(void) { return g.launches; }
