// The greedy part of the coverage selector, written once for the GPU and the host.
//
// Every function here takes a "block" object that provides the cooperative primitives:
//   tid(), size()              this thread's index and the number of threads
//   sync()                     barrier (also makes global-memory writes visible)
//   sum(float) / sum_d(double) / max(float) / max(double) / min_int(int) / min_max(float&, float&)
//                              block-wide reductions
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
// The gain update's loop over changed rows: unrolled 4x, not fully. Blackwell's ptxas (sm_120, CUDA 13.0)
// otherwise unrolls it to the 128-register cap of __launch_bounds__(512, 1) and spills.
#define CP_UNROLL_4 _Pragma("unroll 4")
#else
#define CP_HD
#define CP_HD_TEMPLATE
#define CP_UNROLL_4
#endif

namespace coverpruner
{
namespace greedy
{

// The tie rule of coverpruner.selection (coverage.tie_rtol / zero_level) for float64 gains: a gain
// within (n + 1) * eps * |best| + kZeroUlps * eps * sum(w) of the best gain is tied with it, and the lowest
// tied index wins. (n + 1) * eps * best bounds the rounding of two fresh n-term sums of non-negative terms;
// the absolute part is the rounding level of exhausted columns (exact gain 0). The picks are decided on
// fresh double sums of the float32 utilities, so with the same utilities this greedy picks what the float64
// reference picks; float32 utilities themselves can move genuine near-ties (tested by the coverage objective).
//
// Precision (Jetson Orin runs float64 at 1/64 of float32): the O(n^2) initial gains and the O(n |R|) updates
// per step (R = rows whose cover rose) are float32, each gain with a float32 bound e_k on its error. A step
// recomputes exactly (float64 sums, O(n) each) only the candidates whose interval [g_k - e_k, g_k + e_k]
// reaches the tie window of the largest lower bound; every other column is provably neither the best nor tied
// with it. A recomputed gain restarts its bound at its float32 rounding.
constexpr double kZeroUlps = 64.0;
// Bound factors use FLT_EPSILON = 2 u32: twice the first-order rounding bound, which also covers the second-
// order terms and the rounding of the bound arithmetic itself.
constexpr float kEps32 = FLT_EPSILON;

// Workspace regions of the greedy, each [B, n] (see coverage_workspace.h).
struct Scratch
{
    float* weights;
    float* cover;
    float* gain;
    float* gain_error;
    double* fresh;
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
    float* gain;
    float* err;
    double* fresh;
    int* chg_row;
    float* chg_old;
    float* chg_new;
    unsigned char* sel;

    CP_HD ProblemView(float const* sim_all, Scratch const& s, size_t b, int n)
        : A(sim_all + b * n * static_cast<size_t>(n))
        , w(s.weights + b * n)
        , c(s.cover + b * n)
        , gain(s.gain + b * n)
        , err(s.gain_error + b * n)
        , fresh(s.fresh + b * n)
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

// Step 2, one column k: gain_k = sum_i w_i A_ik while c = 0 (A >= 0), in float32. n non-negative products
// summed: the error is within (n + 1) u32 of the sum (n + 2 eps32 with the margin of kEps32).
CP_HD inline void initial_gain_column(ProblemView const& p, int n, int k)
{
    float g = 0.f;
    for (int i = 0; i < n; ++i) // on the GPU, a warp's threads read consecutive k of row i: coalesced
        g += p.w[i] * p.A[static_cast<size_t>(i) * n + k];
    p.gain[k] = g;
    p.err[k] = (static_cast<float>(n) + 2.f) * kEps32 * g;
}

// Step 3: m picks with the incremental gain update, then keep = the picks in ascending order.
CP_HD_TEMPLATE
template <class Block>
CP_HD void select(Block& blk, ProblemView const& p, int n, int m, int64_t* keep)
{
    const int tid = blk.tid(), nthreads = blk.size();
    float w_part = 0.f;
    for (int i = tid; i < n; i += nthreads)
        w_part += p.w[i];
    const double atol = kZeroUlps * DBL_EPSILON * static_cast<double>(blk.sum(w_part));

    for (int step = 0; step < m; ++step)
    {
        // lo: the largest lower bound of an unselected gain (<= the exact best); hi: the largest upper bound.
        // This scan visits all n columns every step, so it runs in float32 (float64 runs at 1/64 of the float32
        // rate on Jetson Orin); only its threshold below is widened for that, and only the candidates it admits
        // are re-summed exactly.
        float lo = -FLT_MAX, hi = -FLT_MAX;
        for (int k = tid; k < n; k += nthreads)
            if (!p.sel[k])
            {
                lo = fmaxf(lo, p.gain[k] - p.err[k]);
                hi = fmaxf(hi, p.gain[k] + p.err[k]);
            }
        lo = blk.max(lo);
        hi = blk.max(hi);
        // A column whose upper bound stays below lo - W is below the exact best by more than W. W covers the
        // tie window at an upper bound of the best, (n + 1) eps hi + atol, plus the rounding of the two fresh
        // sums (this kernel's and the reference's) that the window is applied to: 4 (n + 1) eps hi + 2 atol.
        // The scan's own float32 roundings are covered as well. Rounding is monotone: the float lo is the exact
        // max(g - e) rounded (off by <= u32 |lo|), and a column whose exact g + e reaches a float threshold T
        // still does after rounding. T = lo - X with X = 2 W + 8 eps32 M (M = max(|lo|, |hi|), eps32 = 2 u32)
        // stays below the exact max(g - e) - W: the roundings of lo, X and lo - X raise T by at most
        // 2 u32 M + u32 X + O(u32^2 M), well inside the W + 16 u32 M of extra room.
        // A wider window only re-sums more candidates; it never changes a pick.
        const double window = 4.0 * (n + 1.0) * DBL_EPSILON * fabs(static_cast<double>(hi)) + 2.0 * atol;
        const float scale = fmaxf(fabsf(lo), fabsf(hi));
        const float cand_threshold = lo - static_cast<float>(2.0 * window + 8.0 * kEps32 * scale);

        // Candidates (listed in chg_row, free until the rising rows are listed below): exact double sums
        // sum_i w_i max(0, A_ik - c_i), summed by the whole block in a fixed order.
        int n_cand = 0;
        for (int start = 0; start < n; start += nthreads)
        {
            const int k = start + tid;
            const bool cand = k < n && !p.sel[k] && p.gain[k] + p.err[k] >= cand_threshold;
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
            {
                p.fresh[k] = fresh;
                p.gain[k] = static_cast<float>(fresh);
                p.err[k] = kEps32 * static_cast<float>(fabs(fresh)); // float rounding of an exact-enough sum
            }
        }
        blk.sync();

        // k* = lowest candidate whose fresh gain is within the tie window of the best fresh gain.
        double best = -DBL_MAX;
        for (int j = tid; j < n_cand; j += nthreads)
            best = fmax(best, p.fresh[p.chg_row[j]]);
        best = blk.max(best);
        const double threshold = best - ((n + 1.0) * DBL_EPSILON * fabs(best) + atol);
        int first = INT_MAX;
        for (int j = tid; j < n_cand; j += nthreads)
        {
            const int k = p.chg_row[j];
            if (p.fresh[k] >= threshold && k < first)
                first = k;
        }
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

        // Only the changed rows alter any gain: subtract w_i (max(0, A_ik - c_old) - max(0, A_ik - c_new))
        // = w_i (clip(A_ik, c_old, c_new) - c_old), in float32: one rounded subtraction of non-negative
        // result, one product, |R| - 1 additions of non-negative terms, so the computed delta is within
        // (|R| + 2) u32 of the exact one; the subtraction from the gain adds u32 |gain|.
        for (int k = tid; k < n; k += nthreads)
        {
            if (p.sel[k])
                continue;
            float delta = 0.f;
            CP_UNROLL_4
            for (int j = 0; j < n_changed; ++j)
            {
                const float a = p.A[static_cast<size_t>(p.chg_row[j]) * n + k];
                const float clipped = fminf(fmaxf(a, p.chg_old[j]), p.chg_new[j]);
                delta += p.w[p.chg_row[j]] * (clipped - p.chg_old[j]);
            }
            const float g = p.gain[k] - delta;
            p.gain[k] = g;
            p.err[k] += kEps32 * ((static_cast<float>(n_changed) + 3.f) * delta + fabsf(g));
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
