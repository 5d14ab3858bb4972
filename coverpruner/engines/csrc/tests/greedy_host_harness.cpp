// The GPU selector's greedy (kernels/greedy_core.cuh) on the host, for tests/engines/test_greedy_host.py:
// the same prepare / initial-gain / select code the CUDA kernels run, checked against the numpy reference
// without a GPU. Two "blocks": one thread, and T std::threads with barriers (the strided loops, reductions
// and compaction ranks of a multi-thread block). Built by g++ (C++20) as a shared library (ctypes).
#include "../kernels/greedy_core.cuh"

#include <barrier>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

namespace
{

// One thread: every reduction is the thread's own value, every rank 0.
struct HostBlock
{
    int tid() const { return 0; }
    int size() const { return 1; }
    void sync() {}
    float sum(float v) { return v; }
    double sum_d(double v) { return v; }
    void min_max(float&, float&) {}
    double max(double v) { return v; }
    float max(float v) { return v; }
    int min_int(int v) { return v; }
    int rank(bool flag, int* total)
    {
        *total = flag ? 1 : 0;
        return 0;
    }
};

// T threads sharing one barrier and one slot per thread for every reduction; each thread folds all
// slots in thread order, so every thread gets the same value (as on the GPU).
struct Shared
{
    explicit Shared(int t)
        : bar(t)
        , f(t)
        , f2(t)
        , d(t)
        , i(t)
        , flags(t)
    {
    }
    std::barrier<> bar;
    std::vector<float> f, f2;
    std::vector<double> d;
    std::vector<int> i;
    std::vector<char> flags;
};

struct ThreadBlock
{
    Shared* sh;
    int t;
    int n;

    int tid() const { return t; }
    int size() const { return n; }
    void sync() { sh->bar.arrive_and_wait(); }
    // Every thread folds all slots in thread order: the same sum everywhere, on every run.
    template <class T>
    T fold_sum(std::vector<T>& slots, T v)
    {
        slots[t] = v;
        sync();
        T out = 0;
        for (T x : slots)
            out += x;
        sync();
        return out;
    }
    float sum(float v) { return fold_sum(sh->f, v); }
    double sum_d(double v) { return fold_sum(sh->d, v); }
    void min_max(float& lo, float& hi)
    {
        sh->f[t] = lo;
        sh->f2[t] = hi;
        sync();
        for (int k = 0; k < n; ++k)
        {
            lo = fminf(lo, sh->f[k]);
            hi = fmaxf(hi, sh->f2[k]);
        }
        sync();
    }
    // fmax as on the GPU: a NaN slot is ignored
    template <class T>
    T fold_max(std::vector<T>& slots, T v)
    {
        slots[t] = v;
        sync();
        for (T x : slots)
            v = std::fmax(v, x);
        sync();
        return v;
    }
    double max(double v) { return fold_max(sh->d, v); }
    float max(float v) { return fold_max(sh->f, v); }
    int min_int(int v)
    {
        sh->i[t] = v;
        sync();
        for (int x : sh->i)
            v = x < v ? x : v;
        sync();
        return v;
    }
    int rank(bool flag, int* total)
    {
        sh->flags[t] = flag;
        sync();
        int before = 0, all = 0;
        for (int k = 0; k < n; ++k)
        {
            all += sh->flags[k];
            before += k < t ? sh->flags[k] : 0;
        }
        sync();
        *total = all;
        return before;
    }
};

// The greedy's per-problem work arrays for one problem of n tokens, owned on the host.
struct HostScratch
{
    std::vector<float> w, c, old_c, new_c, gain, gain_error;
    std::vector<double> fresh;
    std::vector<int> rows;
    std::vector<unsigned char> sel;
    coverpruner::greedy::Scratch view; // declared last: initialised from the vectors above

    explicit HostScratch(int n)
        : w(n), c(n), old_c(n), new_c(n), gain(n), gain_error(n), fresh(n), rows(n), sel(n)
        , view{w.data(), c.data(), gain.data(), gain_error.data(), fresh.data(), rows.data(), old_c.data(),
              new_c.data(), sel.data()}
    {
    }
};

} // namespace

// Same as cp_greedy_host with a block of `threads` host threads.
extern "C" int cp_greedy_host_threads(float const* A, float const* relevance, int n, int64_t budget, float tau,
    int64_t* keep, int threads)
{
    using namespace coverpruner::greedy;
    HostScratch scratch(n);
    ProblemView const p(A, scratch.view, 0, n);
    const int m = keep_count(budget, n);
    bool done = false;
    auto run = [&](auto&& body) {
        Shared sh(threads);
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t)
            pool.emplace_back([&, t] {
                ThreadBlock blk{&sh, t, threads};
                body(blk);
            });
        for (auto& th : pool)
            th.join();
    };
    run([&](ThreadBlock& blk) {
        const bool all = prepare(blk, relevance, tau, p, n, m, keep);
        if (blk.tid() == 0)
            done = all;
    });
    if (done)
        return m;
    for (int k = 0; k < n; ++k)
        initial_gain_column(p, n, k);
    run([&](ThreadBlock& blk) { select(blk, p, n, m, keep); });
    return m;
}

// A: utilities [n, n] float32 (row-major); relevance [n] or NULL; keep: int64 [min(budget, n)].
// Returns m (the number of indices written).
extern "C" int cp_greedy_host(float const* A, float const* relevance, int n, int64_t budget, float tau, int64_t* keep)
{
    using namespace coverpruner::greedy;
    HostScratch scratch(n);
    ProblemView const p(A, scratch.view, 0, n);
    HostBlock blk;
    const int m = keep_count(budget, n);
    if (prepare(blk, relevance, tau, p, n, m, keep))
        return m;
    for (int k = 0; k < n; ++k)
        initial_gain_column(p, n, k);
    select(blk, p, n, m, keep);
    return m;
}
