/*
 * Workspace layout of the CUDA coverage selector (plain C99, no CUDA or TensorRT headers).
 *
 * Shared by the kernels (coverage_select.cu), the C API's size query and the TensorRT plugin's
 * getWorkspaceSize, so the three can never disagree. Every region starts on a 256-byte boundary
 * (cudaMalloc's alignment, and what cuBLAS wants for its operands).
 *
 * Regions, for a batch of B problems of n tokens with d features:
 *   normalized   [B, n, d]  feature dtype (float32 or float16): rows divided by max(||v||, 1e-12)
 *   similarity   [B, n, n]  float32: cosine M, then A = max(0, M - rowmean(M)) in place
 *   weights      [B, n]     float32: exp(tau * minmax(r)), 1 where r is absent or constant
 *   cover        [B, n]     float32: c_i, best utility row i already has from the picks
 *   gain         [B, n]     float32: sum_i w_i max(0, A_ik - c_i), kept by float32 incremental updates
 *                           (Orin runs float64 at 1/64 of float32)
 *   gain_error   [B, n]     float32: a bound on |gain - exact gain|, grown with each update
 *   fresh        [B, n]     float64: gains recomputed exactly (float64 sums) for the candidates whose
 *                           error interval reaches the best one's tie window
 *   changed_row  [B, n]     int32:   rows whose c_i rose at this step
 *   changed_old  [B, n]     float32: their c_i before the step
 *   changed_new  [B, n]     float32: their c_i after the step
 *   selected     [B, n]     uint8:   1 for picked tokens
 */
#ifndef COVERPRUNER_COVERAGE_WORKSPACE_H
#define COVERPRUNER_COVERAGE_WORKSPACE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CP_WORKSPACE_ALIGN 256u

/* Element types of the features tensor. Values are part of the C ABI (ctypes uses them). */
typedef enum cp_dtype
{
    CP_DTYPE_FLOAT32 = 0,
    CP_DTYPE_FLOAT16 = 1
} cp_dtype;

typedef struct cp_workspace_layout
{
    size_t normalized;
    size_t similarity;
    size_t weights;
    size_t cover;
    size_t gain;
    size_t gain_error;
    size_t fresh;
    size_t changed_row;
    size_t changed_old;
    size_t changed_new;
    size_t selected;
    size_t total; /* bytes the caller must provide */
} cp_workspace_layout;

static inline size_t cp_align_up(size_t bytes)
{
    return (bytes + (CP_WORKSPACE_ALIGN - 1u)) / CP_WORKSPACE_ALIGN * CP_WORKSPACE_ALIGN;
}

static inline size_t cp_dtype_size(int dtype)
{
    return dtype == CP_DTYPE_FLOAT16 ? 2u : 4u;
}

/*
 * Fills *out with byte offsets for (batch, n, d, dtype). Returns 0 on success, -1 for a
 * negative dimension, an unknown dtype or a size that overflows size_t.
 */
static inline int cp_workspace_layout_for(int64_t batch, int64_t n, int64_t d, int dtype,
                                          cp_workspace_layout* out)
{
    if (out == NULL || batch < 0 || n < 0 || d < 0)
        return -1;
    if (dtype != CP_DTYPE_FLOAT32 && dtype != CP_DTYPE_FLOAT16)
        return -1;
    /* Guard the largest product (B*n*n*4 or B*n*d*4) against size_t overflow. */
    {
        const double big = (double)batch * (double)n * (double)(n > d ? n : d) * 8.0;
        if (big > (double)SIZE_MAX / 2.0)
            return -1;
    }
    const size_t B = (size_t)batch, N = (size_t)n, D = (size_t)d;
    size_t off = 0;
    out->normalized = off;  off += cp_align_up(B * N * D * cp_dtype_size(dtype));
    out->similarity = off;  off += cp_align_up(B * N * N * 4u);
    out->weights = off;     off += cp_align_up(B * N * 4u);
    out->cover = off;       off += cp_align_up(B * N * 4u);
    out->gain = off;        off += cp_align_up(B * N * 4u);
    out->gain_error = off;  off += cp_align_up(B * N * 4u);
    out->fresh = off;       off += cp_align_up(B * N * 8u);
    out->changed_row = off; off += cp_align_up(B * N * 4u);
    out->changed_old = off; off += cp_align_up(B * N * 4u);
    out->changed_new = off; off += cp_align_up(B * N * 4u);
    out->selected = off;    off += cp_align_up(B * N);
    out->total = off;
    return 0;
}

#ifdef __cplusplus
}
#endif

#endif /* COVERPRUNER_COVERAGE_WORKSPACE_H */
