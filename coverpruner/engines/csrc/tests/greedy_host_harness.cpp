// The GPU selector's greedy (kernels/greedy_core.cuh) on the host, with a one-thread "block", for
// tests/engines/test_greedy_host.py: the same prepare / initial-gain / select code the CUDA kernels run,
// checked against the numpy reference without a GPU. Built by g++ as a shared library (ctypes).
#include "../kernels/greedy_core.cuh"

#include <cstdint>
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
    void min_max(float&, float&) {}
    double max(double v) { return v; }
    int min_int(int v) { return v; }
    int rank(bool flag, int* total)
    {
        *total = flag ? 1 : 0;
        return 0;
    }
};

} // namespace

// A: utilities [n, n] float32 (row-major); relevance [n] or NULL; keep: int64 [min(budget, n)].
// Returns m (the number of indices written).
extern "C" int cp_greedy_host(float const* A, float const* relevance, int n, int64_t budget, float tau, int64_t* keep)
{
    using namespace coverpruner::greedy;
    std::vector<float> w(n), c(n), old_c(n), new_c(n);
    std::vector<double> gain(n);
    std::vector<int> rows(n);
    std::vector<unsigned char> sel(n);
    Scratch s{w.data(), c.data(), gain.data(), rows.data(), old_c.data(), new_c.data(), sel.data()};
    ProblemView const p(A, s, 0, n);
    HostBlock blk;
    const int m = keep_count(budget, n);
    if (prepare(blk, relevance, tau, p, n, m, keep))
        return m;
    for (int k = 0; k < n; ++k)
        initial_gain_column(p, n, k);
    select(blk, p, n, m, keep);
    return m;
}
