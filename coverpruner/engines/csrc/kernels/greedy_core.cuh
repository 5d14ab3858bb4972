// The greedy part of the coverage selector, written once for the GPU and the host.
//
// Every function here takes a "block" object that provides the cooperative primitives:
//   tid(), size()              this thread's index and the number of threads
//   sync()                     barrier (also makes global-memory writes visible)
//   sum(float) / sum_d(double) / max(double) / min_int(int) / min_max(float&, float&)   block-wide reductions
//                              (sum_d folds in a fixed order: the same result on every run)
//   rank(bool flag, int* total) stable compaction rank of a flagged thread among this chunk's flags
// coverage_select.cu instantiates it with a CUDA block (shared memory, warp shuffles, ballots);
// tests/greedy_host_harness.cpp with a one-thread host block, so g++ runs the very same greedy logic
// against the numpy reference without a GPU. Without __CUDACC__ this header is plain C++.
#pragma once

#include <cfloat>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>

#ifdef __CUDACC__
#define CP_HD __host__ __device__
#define CP_HD_TEMPLATE _Pragma("nv_exec_check_disable")
#else
#define CP_HD
#define CP_HD_TEMPLATE
#endif

namespace coverpruner
{
namespace greedy
{

// The tie rule of coverpruner.selection (coverage.tie_rtol / zero_level) for float64 gains: a gain
// within (n + 1) * eps * |best| + kZeroUlps * eps * sum(w) of the best gain is tied with it, and the lowest
// tied index wins. (n + 1) * eps * best bounds the rounding of two fresh n-term sums of non-negative terms;
// the absolute part is the rounding level of exhausted columns (exact gain 0). The gains here are double
// sums of the float32 utilities, so with the same utilities this greedy picks what the float64 reference
// picks; float32 utilities themselves can move genuine near-ties (tested by the coverage objective).
constexpr double kZeroUlps = 64.0;

// Workspace regions of the greedy, each [B, n] (see coverage_workspace.h).
struct Scratch
{
    float* weights;
    float* cover;
    double* gain;
    int* changed_row;
    float* changed_old;
    float* changed_new;
    unsigned char* selected;
};

// Row b of every region, and A = utilities [n, n] of problem b.
struct ProblemView
{
    float const* A;
    float* w;
    float* c;
    double* gain;
    int* chg_row;
    float* chg_old;
    float* chg_new;
    unsigned char* sel;

    CP_HD ProblemView(float const* sim_all, Scratch const& s, size_t b, int n)
        : A(sim_all + b * n * static_cast<size_t>(n))
        , w(s.weights + b * n)
        , c(s.cover + b * n)
        , gain(s.gain + b * n)
        , chg_row(s.changed_row + b * n)
        , chg_old(s.changed_old + b * n)
        , chg_new(s.changed_new + b * n)
        , sel(s.selected + b * n)
    {
    }
};

// m = min(budget, n); a budget <= 0 keeps nothing.
CP_HD inline int keep_count(int64_t budget, int n)
{
    return budget <= 0 ? 0 : (budget < n ? static_cast<int>(budget) : n);
}

// Step 1: keep = 0..n-1 when m == n (returns true: nothing else to do); otherwise demand weights
// w = exp(tau * minmax(r)) (r == nullptr or constant -> uniform, no 0/0), c = 0, nothing selected.
// r: this problem's relevance [n] or nullptr; keep: this problem's output row [m].
CP_HD_TEMPLATE
template <class Block>
CP_HD bool prepare(Block& blk, float const* r, float tau, ProblemView const& p, int n, int m, int64_t* keep)
{
    const int tid = blk.tid(), nthreads = blk.size();
    if (m == n)
    {
        for (int i = tid; i < n; i += nthreads)
            keep[i] = i;
        return true;
    }
    if (r != nullptr)
    {
        float lo = FLT_MAX, hi = -FLT_MAX;
        for (int i = tid; i < n; i += nthreads)
        {
            lo = fminf(lo, r[i]);
            hi = fmaxf(hi, r[i]);
        }
        blk.min_max(lo, hi);
        const float range = hi - lo;
        for (int i = tid; i < n; i += nthreads)
            p.w[i] = range > 0.f ? expf(tau * ((r[i] - lo) / range)) : 1.f;
    }
    else
    {
        for (int i = tid; i < n; i += nthreads)
            p.w[i] = 1.f;
    }
    for (int i = tid; i < n; i += nthreads)
    {
        p.c[i] = 0.f;
        p.sel[i] = 0;
    }
    return false;
}

// Step 2, one column k: gain_k = sum_i w_i A_ik while c = 0 (A >= 0).
CP_HD inline void initial_gain_column(ProblemView const& p, int n, int k)
{
    double g = 0.0;
    for (int i = 0; i < n; ++i) // on the GPU, a warp's threads read consecutive k of row i: coalesced
        g += static_cast<double>(p.w[i]) * p.A[static_cast<size_t>(i) * n + k];
    p.gain[k] = g;
}

// Step 3: m picks with the incremental gain update, then keep = the picks in ascending order.
CP_HD_TEMPLATE
template <class Block>
CP_HD void select(Block& blk, ProblemView const& p, int n, int m, int64_t* keep)
{
    const int tid = blk.tid(), nthreads = blk.size();
    float w_part = 0.f;
    double g0 = 0.0;
    for (int i = tid; i < n; i += nthreads)
    {
        w_part += p.w[i];
        g0 = fmax(g0, p.gain[i]);
    }
    const double w_sum = static_cast<double>(blk.sum(w_part));
    g0 = blk.max(g0);
    const double atol = kZeroUlps * DBL_EPSILON * w_sum;
    // The incremental gains lie within (2n + m + 2) u g0 of the exact sums (g0 = largest first gain, u =
    // eps / 2): a gain more than this margin below the incremental best can be neither the exact best nor
    // tied with it (coverage.incremental_margin). Gains inside it are recomputed from scratch before the pick.
    const double margin = (6.0 * n + 2.0 * m + 6.0) * DBL_EPSILON * g0 + atol;

    for (int step = 0; step < m; ++step)
    {
        double best = -DBL_MAX;
        for (int k = tid; k < n; k += nthreads)
            if (!p.sel[k])
                best = fmax(best, p.gain[k]);
        const double cand_threshold = blk.max(best) - margin;

        // Candidates (listed in chg_row, free until the rising rows are listed below): their gains become
        // fresh double sums sum_i w_i max(0, A_ik - c_i), summed by the whole block in a fixed order.
        int n_cand = 0;
        for (int start = 0; start < n; start += nthreads)
        {
            const int k = start + tid;
            const bool cand = k < n && !p.sel[k] && p.gain[k] >= cand_threshold;
            int chunk_total = 0;
            const int rank = blk.rank(cand, &chunk_total);
            if (cand)
                p.chg_row[n_cand + rank] = k;
            n_cand += chunk_total;
        }
        blk.sync();
        for (int j = 0; j < n_cand; ++j)
        {
            const int k = p.chg_row[j];
            double part = 0.0;
            for (int i = tid; i < n; i += nthreads)
            {
                const double excess = static_cast<double>(p.A[static_cast<size_t>(i) * n + k]) - p.c[i];
                if (excess > 0.0)
                    part += static_cast<double>(p.w[i]) * excess;
            }
            const double fresh = blk.sum_d(part);
            if (tid == 0)
                p.gain[k] = fresh;
        }
        blk.sync();

        // k* = lowest unselected index whose gain is within the tie window of the best unselected gain.
        best = -DBL_MAX;
        for (int k = tid; k < n; k += nthreads)
            if (!p.sel[k])
                best = fmax(best, p.gain[k]);
        best = blk.max(best);
        const double threshold = best - ((n + 1.0) * DBL_EPSILON * fabs(best) + atol);
        int first = INT_MAX;
        for (int k = tid; k < n && first == INT_MAX; k += nthreads)
            if (!p.sel[k] && p.gain[k] >= threshold)
                first = k;
        int pick = blk.min_int(first);
        if (pick == INT_MAX)
        {
            // No gain compares >= threshold: only NaN gains do that (NaN relevance). Take the lowest
            // unselected index rather than write out of bounds; the result is defined, if meaningless.
            int free_k = INT_MAX;
            for (int k = tid; k < n && free_k == INT_MAX; k += nthreads)
                if (!p.sel[k])
                    free_k = k;
            pick = blk.min_int(free_k);
        }
        if (tid == 0 && pick < n)
            p.sel[pick] = 1;
        blk.sync();

        // Rows whose cover rises (A_i,k* > c_i), listed in row order so every gain update below sums
        // in the same order on every run (deterministic results).
        int n_changed = 0;
        for (int start = 0; start < n; start += nthreads)
        {
            const int i = start + tid;
            float a = 0.f, old = 0.f;
            bool rises = false;
            if (i < n)
            {
                a = p.A[static_cast<size_t>(i) * n + pick];
                old = p.c[i];
                rises = a > old;
            }
            int chunk_total = 0;
            const int rank = blk.rank(rises, &chunk_total);
            if (rises)
            {
                p.chg_row[n_changed + rank] = i;
                p.chg_old[n_changed + rank] = old;
                p.chg_new[n_changed + rank] = a;
            }
            n_changed += chunk_total;
        }
        blk.sync();

        // Only the changed rows alter any gain: subtract w_i (max(0, A_ik - c_old) - max(0, A_ik - c_new)).
        for (int k = tid; k < n; k += nthreads)
        {
            if (p.sel[k])
                continue;
            double delta = 0.0;
            for (int j = 0; j < n_changed; ++j)
            {
                const float a = p.A[static_cast<size_t>(p.chg_row[j]) * n + k];
                // float differences are exact in double, so the incremental gain stays the plain sum
                // sum_i w_i max(0, A_ik - c_i) of the float32 utilities, without drift over the m steps
                const double ad = a;
                const double drop = fmax(0.0, ad - p.chg_old[j]) - fmax(0.0, ad - p.chg_new[j]);
                delta += static_cast<double>(p.w[p.chg_row[j]]) * drop;
            }
            // Residue where coverage is exhausted (exact gain 0) is recomputed as a fresh sum before the
            // next pick (it lies inside the margin), so those columns tie at 0 as in the reference.
            p.gain[k] -= delta;
        }
        for (int j = tid; j < n_changed; j += nthreads)
            p.c[p.chg_row[j]] = p.chg_new[j];
        blk.sync();
    }

    // Selected indices in ascending order: a stable compaction of the flags.
    int written = 0;
    for (int start = 0; start < n; start += nthreads)
    {
        const int i = start + tid;
        const bool picked = i < n && p.sel[i];
        int chunk_total = 0;
        const int rank = blk.rank(picked, &chunk_total);
        if (picked)
            keep[written + rank] = i;
        written += chunk_total;
    }
}

} // namespace greedy
} // namespace coverpruner
