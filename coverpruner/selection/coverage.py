"""Representational Coverage Maximization (paper Sec. 3, Algorithm 1) in numpy.

Two greedy implementations with one contract:
- `greedy_reference`: the literal step, gain_k = sum_i w_i max(0, A_ik - c_i) recomputed over all (i, k)
  every step: O(m n^2), float64. It is the definition the other backends are tested against.
- `greedy_incremental`: keeps the gain vector and subtracts, after each pick, only the contribution of rows
  whose coverage rose. For c_new >= c_old,
      max(0, a - c_old) - max(0, a - c_new) = clip(a, c_old, c_new) - c_old,
  so a step costs O(|R| n) with R = {i : A_ik* > c_i}, which shrinks quickly as coverage saturates.

Ties: the pick is the lowest index among gains within `tie_atol(w)` = 1e-6 * sum(w) of the maximum. Gains are
at most sum(w), so this treats as tied only differences that float32 implementations (selector.onnx, the CUDA
kernel) cannot resolve anyway: it makes them, the float64 reference and the incremental update (whose sums
differ in the last bits) agree on exact ties (duplicated tokens) and on exhausted coverage, where the remaining
gains are rounding noise.
"""

from __future__ import annotations

import numpy as np

from ._inputs import check_budget, check_features, check_relevance, check_tau, to_numpy

NORM_EPS = 1e-12
TIE_RTOL = 1e-6


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


def tie_atol(weights: np.ndarray) -> float:
    """Absolute tolerance under which two gains count as tied: gains are at most sum(w) * max(A) <= sum(w)."""
    return TIE_RTOL * float(np.sum(weights))


def _pick(gain: np.ndarray, atol: float) -> int:
    """Lowest index among the gains within atol of the best (selected ones hold -inf)."""
    return int(np.flatnonzero(gain >= gain.max() - atol)[0])


def greedy_reference(a: np.ndarray, w: np.ndarray, budget: int) -> np.ndarray:
    """Literal greedy on utilities a [n, n] and weights w [n]; returns the picks in pick order (int64 [m])."""
    n = a.shape[0]
    c = np.zeros(n)
    selected = np.zeros(n, dtype=bool)
    picks = []
    atol = tie_atol(w)
    uncovered = np.empty_like(a)  # one [n, n] buffer reused by every step
    for _ in range(min(budget, n)):
        np.subtract(a, c[:, None], out=uncovered)
        gain = w @ np.maximum(uncovered, 0.0, out=uncovered)
        gain[selected] = -np.inf
        k = _pick(gain, atol)
        picks.append(k)
        selected[k] = True
        c = np.maximum(c, a[:, k])
    return np.asarray(picks, dtype=np.int64)


def greedy_incremental(a: np.ndarray, w: np.ndarray, budget: int) -> np.ndarray:
    """Same picks as `greedy_reference`, updating the gain only from rows whose coverage rose."""
    n = a.shape[0]
    c = np.zeros(n)
    gain = w @ a  # c = 0 and a >= 0: the first gains are plain weighted column sums
    picks = []
    atol = tie_atol(w)
    for _ in range(min(budget, n)):
        k = _pick(gain, atol)
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


_GREEDY = {"reference": greedy_reference, "numpy": greedy_incremental}


def coverage_select_numpy(features, relevance=None, budget: int = 64, tau: float = 0.3,
                          backend: str = "numpy") -> np.ndarray:
    """Coverage selection for one image. features [n, d]; relevance [n] or None. Returns int64 [m] ascending."""
    v = check_features(features)
    n = v.shape[0]
    budget = check_budget(budget)
    tau = check_tau(tau)
    r = check_relevance(relevance, n)
    if budget >= n:
        return np.arange(n, dtype=np.int64)
    w = np.ones(n) if r is None else demand_weights(r, tau)
    a = coverage_utilities(v)
    return np.sort(_GREEDY[backend](a, w, budget))
