"""Representational Coverage Maximization (paper Sec. 3, Algorithm 1) in numpy.

Two greedy implementations with one contract:
- `greedy_reference`: the literal step, gain_k = sum_i w_i max(0, A_ik - c_i) recomputed over all (i, k)
  every step: O(m n^2), float64. It is the definition the other backends are tested against.
- `greedy_incremental`: keeps the gain vector and subtracts, after each pick, only the contribution of rows
  whose coverage rose. For c_new >= c_old,
      max(0, a - c_old) - max(0, a - c_new) = clip(a, c_old, c_new) - c_old,
  so a step costs O(|R| n) with R = {i : A_ik* > c_i}, which shrinks quickly as coverage saturates.

Ties: the pick is the exact argmax of the gains; only gains equal within the rounding of the arithmetic that
computed them, relative to the current best gain, count as tied, and then the lowest index wins (see
`tie_rtol`). Duplicated tokens have identical utility columns, hence exactly equal gains, and go to the lowest
index; so do exhausted columns, whose gains are zero up to the rounding of the utilities themselves (`zero_level`:
64 float64 ulps per unit weight, so backends whose utilities differ in the last bits agree there). The incremental update's gains carry rounding relative
to the *first* step's gains, so before it picks it recomputes from scratch every candidate within that
rounding bound of its best and applies the reference's rule to the fresh sums: both backends pick the same
index at every step.
"""

from __future__ import annotations

import numpy as np

from ._inputs import check_budget, check_features, check_relevance, check_tau, to_numpy

NORM_EPS = 1e-12
EPS64 = float(np.finfo(np.float64).eps)  # 2^-52 = 2u, u the float64 unit roundoff
EPS32 = float(np.finfo(np.float32).eps)  # 2^-23


def coverage_utilities(features, dtype=np.float64) -> np.ndarray:
    """A = max(0, M - rowmean(M)), M = cosine similarity of the rows.

    features: [n, d] any float dtype. Returns A: [n, n] `dtype` (float64 by default), A[i, j] = how much
    better than the average token j represents token i.
    """
    v = check_features(features).astype(dtype, copy=False)
    v = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), NORM_EPS)
    m = v @ v.T
    m -= m.mean(axis=1, keepdims=True)
    return np.maximum(m, 0.0, out=m)


def demand_weights(relevance, tau: float = 0.3) -> np.ndarray:
    """w = exp(tau * minmax(relevance)); constant relevance gives uniform weights (all ones).

    relevance: [n]. Returns float64 [n] in [1, e^tau] for tau >= 0.
    """
    tau = check_tau(tau)
    r = to_numpy(relevance)
    r = check_relevance(r, n=r.shape[0] if r.ndim == 1 else -1)
    span = r.max() - r.min()
    scaled = (r - r.min()) / span if span > 0 else np.zeros_like(r)
    return np.exp(tau * scaled)


def tie_rtol(n: int, dtype=np.float64) -> float:
    """Relative tie window: gains g >= best - tie_rtol * best are tied with the best gain `best`.

    float64 (the reference, the numpy and torch backends, the CUDA kernel's double gains): a gain is a fresh
    sum of n terms w_i * max(0, A_ik - c_i) >= 0; each term carries 2 roundings and the sum n - 1, so a computed
    gain lies within (n + 1) u g of the exact one (u = eps / 2), and two gains with equal exact values differ
    by at most (n + 1) * eps * best: 1.3e-13 relative at n = 576, 6.4e-13 at n = 2,880.
    float32 (selector.onnx, torch in float32): min(n + 1, 8) * eps32 (<= 9.5e-7). The worst-case bound
    (n + 1) * eps32 would be 6.9e-5 at n = 576, as wide as the differences float32 resolves in practice
    (a float32 sum's typical error is ~sqrt(n) u); 8 ulps still ties duplicated tokens whose columns differ
    by an ulp of the GEMM, and never ties a 1e-5 relative difference.
    """
    dtype = np.dtype(dtype)
    if dtype == np.float64:
        return (n + 1) * EPS64
    if dtype == np.float32:
        return min(n + 1, 8) * EPS32
    raise ValueError(f"tie_rtol: gains must be float32 or float64, got {dtype}")


ZERO_ULPS = 64


def zero_level(weights) -> float:
    """Absolute part of the float64 tie window: 64 * eps * sum(w) (1.4e-14 * sum(w); the old rule used 1e-6).

    Once coverage is exhausted, a column's exact gain is 0 but its computed gain is a sum of max(0, A_ik - c_i)
    over differences of utilities that agree up to their own rounding (a few ulps of |A| <= 1 for float64
    cosines: different BLAS give different last bits). Such gains are at most a few eps * sum(w); they count
    as tied with each other (lowest index), and never with a gain that changes the objective's 12th digit.
    """
    return ZERO_ULPS * EPS64 * float(np.sum(weights))


def lowest_tied(gain: np.ndarray, rtol: float, atol: float = 0.0) -> int:
    """Position of the lowest-index gain within rtol * |best| + atol of the best (selected ones hold -inf)."""
    best = gain.max()
    return int(np.flatnonzero(gain >= best - (rtol * abs(best) + atol))[0])


def greedy_reference(a: np.ndarray, w: np.ndarray, budget: int) -> np.ndarray:
    """Literal greedy on utilities a [n, n] and weights w [n] (float64); returns the picks in pick order
    (int64 [m])."""
    n = a.shape[0]
    c = np.zeros(n)
    selected = np.zeros(n, dtype=bool)
    picks = []
    rtol, atol = tie_rtol(n), zero_level(w)
    uncovered = np.empty_like(a)  # one [n, n] buffer reused by every step
    for _ in range(min(budget, n)):
        np.subtract(a, c[:, None], out=uncovered)
        gain = w @ np.maximum(uncovered, 0.0, out=uncovered)
        gain[selected] = -np.inf
        k = lowest_tied(gain, rtol, atol)
        picks.append(k)
        selected[k] = True
        c = np.maximum(c, a[:, k])
    return np.asarray(picks, dtype=np.int64)


def incremental_margin(n: int, m: int, first_best: float, atol: float) -> float:
    """Gains within this margin of the best incremental gain may be the exact best or tied with it.

    An incremental gain (first gain w @ A[:, k], then m subtractions of non-negative deltas that sum to at most
    the first gain) lies within b = (2n + m + 2) u g0 of its exact value, g0 = the largest first-step gain.
    A gain more than 2b + tie_rtol(n) * g0 + atol below the incremental best is below the exact best by more
    than the tie window, so it can be neither the pick nor tied with it: (6n + 2m + 6) * eps * g0 + atol.
    """
    return (6 * n + 2 * m + 6) * EPS64 * max(first_best, 0.0) + atol


def greedy_incremental(a: np.ndarray, w: np.ndarray, budget: int) -> np.ndarray:
    """Same picks as `greedy_reference`, updating the gain only from rows whose coverage rose."""
    n = a.shape[0]
    m = min(budget, n)
    c = np.zeros(n)
    gain = w @ a  # c = 0 and a >= 0: the first gains are plain weighted column sums
    rtol, atol = tie_rtol(n), zero_level(w)
    margin = incremental_margin(n, m, float(gain.max()), atol)
    picks = []
    for _ in range(m):
        cand = np.flatnonzero(gain >= gain.max() - margin)
        if cand.size > 1:  # near-tie or exhausted coverage: decide on fresh sums, as the reference does
            fresh = w @ np.maximum(a[:, cand] - c[:, None], 0.0)
            gain[cand] = fresh
            k = int(cand[lowest_tied(fresh, rtol, atol)])
        else:
            k = int(cand[0])
        picks.append(k)
        col = a[:, k]
        rows = np.flatnonzero(col > c)
        if rows.size:
            lo = c[rows, None]
            hi = col[rows, None]
            gain -= w[rows] @ (np.clip(a[rows], lo, hi) - lo)
            c[rows] = col[rows]
        gain[k] = -np.inf  # stays -inf: later updates subtract finite amounts
    return np.asarray(picks, dtype=np.int64)


def coverage_select_numpy(features, relevance=None, budget: int = 64, tau: float = 0.3,
                          backend: str = "numpy", dtype=None) -> np.ndarray:
    """Coverage selection for one image or video. features [n, d]; relevance [n] or None. Returns int64 [m]
    ascending.

    backend "reference": the literal greedy on float64 A [n, n] (plus one [n, n] step buffer). "numpy" (blocked
    incremental update) and "lazy" (upper-bound greedy), blocked.py: one utility buffer [n, n] of `dtype`
    (default: float64 up to n = 11,585, float32 above) and temporaries of at most blocked.BLOCK_BYTES; the
    reference's picks (float32 utilities: by the float32 rule)."""
    from .blocked import greedy_blocked, greedy_lazy, utilities

    v = check_features(features)
    n = v.shape[0]
    budget = check_budget(budget)
    tau = check_tau(tau)
    r = check_relevance(relevance, n)
    if budget >= n:
        return np.arange(n, dtype=np.int64)
    w = np.ones(n) if r is None else demand_weights(r, tau)
    if backend == "reference":
        return np.sort(greedy_reference(coverage_utilities(v), w, budget))
    if backend == "lazy":
        return np.sort(greedy_lazy(utilities(v, dtype, transposed=True), w, budget))
    return np.sort(greedy_blocked(utilities(v, dtype), w, budget))
