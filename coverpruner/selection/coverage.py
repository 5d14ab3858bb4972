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
from .ties import (EPS32, EPS64, NORM_EPS, ZERO_ULPS, incremental_margin, lowest_tied,  # noqa: F401 (re-exported)
                   tie_rtol, zero_level)

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

    backend "reference": the literal greedy on float64 A [n, n] (plus one [n, n] step buffer). "numpy"
    (incremental update on the symmetric similarity) and "lazy" (upper-bound greedy), blocked.py: one [n, n]
    buffer of `dtype` (default: float64 up to n = 2,048, float32 above) and temporaries of at most
    blocked.BLOCK_BYTES; the reference's picks (float32: by the float32 rule)."""
    from .blocked import greedy_lazy, greedy_symmetric, similarity, utilities

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
    return np.sort(greedy_symmetric(*similarity(v, dtype), w, budget))
