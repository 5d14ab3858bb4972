"""Independent float64 references of the peers' selectors, written in the tests from the papers' equations.

Nothing here imports coverpruner (see literal_selection.py for why). Each is the slow, literal form:

    dart_reference(features [n, d], budget, pivots=8) -> sorted int64
        DART (Wen et al. 2025) on V: pivots = the `pivots` largest L1 norms; the other budget - P picks split over
        the pivots in pivot order (floor share, one more for the first ones); each pivot keeps, one at a time,
        the unkept token with the lowest cosine similarity to it, every cosine a fresh pairwise
        dot(a, b) / (|a| |b|).
    cdpruner_reference(features, relevance [n] | None, budget, relevance_weight=1.0) -> sorted int64
        CDPruner (Zhang et al. 2025): L = w diag(q) S diag(q) + (1 - w) S, q = minmax(relevance) (ones when
        None / constant); greedy MAP: each step the token of largest det(L_{Y+i}) / det(L_Y), computed literally
        as the Schur complement L_ii - L_iY L_YY^-1 L_Yi with a fresh linear solve (Chen et al. 2018's
        definition of the gain, not its incremental Cholesky update).

Tie rules (the product documents the same ones): a value within the rounding window of the best is tied, the
lowest index wins. DART: (d + 2) * eps * scale; CDPruner: (n + d) * eps * max(diag L). A CDPruner gain at or
below 1e-4 * max(diag L) means the kernel has no volume left: the rest are the largest L_ii, lowest index first.
"""

from __future__ import annotations

import numpy as np

EPS = float(np.finfo(np.float64).eps)


def _best(values: dict, window: float, largest: bool) -> int:
    """The key of the best value (largest or smallest), the lowest key among values within `window` of it."""
    best = max(values.values()) if largest else min(values.values())
    tied = [k for k, x in values.items() if (x >= best - window if largest else x <= best + window)]
    return min(tied)


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = np.sqrt(np.dot(a, a)), np.sqrt(np.dot(b, b))
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.dot(a, b) / (na * nb))


def dart_reference(features, budget: int, pivots: int = 8) -> np.ndarray:
    v = np.asarray(features, dtype=np.float64)
    n, d = v.shape
    if budget >= n:
        return np.arange(n, dtype=np.int64)
    p = min(pivots, budget)
    l1 = {i: float(np.linalg.norm(v[i], ord=1)) for i in range(n)}
    window = (d + 2) * EPS * max(l1.values())
    piv = []
    for _ in range(p):
        k = _best({i: x for i, x in l1.items() if i not in piv}, window, largest=True)
        piv.append(k)
    kept = set(piv)
    rest = budget - p
    for j, pivot in enumerate(piv):
        quota = rest // p + (1 if j < rest % p else 0)
        for _ in range(quota):
            dup = {i: _cos(v[pivot], v[i]) for i in range(n) if i not in kept}
            kept.add(_best(dup, (d + 2) * EPS, largest=False))
    return np.asarray(sorted(kept), dtype=np.int64)


def cdpruner_kernel(features, relevance, relevance_weight: float = 1.0) -> np.ndarray:
    """L [n, n] float64 from the definition: w diag(q) S diag(q) + (1 - w) S."""
    v = np.asarray(features, dtype=np.float64)
    n = len(v)
    s = np.array([[_cos(v[i], v[j]) if i != j else float(np.dot(v[i], v[i]) > 0) for j in range(n)]
                  for i in range(n)])
    if relevance is None or np.ptp(np.asarray(relevance, dtype=np.float64)) == 0:
        q = np.ones(n)
    else:
        r = np.asarray(relevance, dtype=np.float64)
        q = (r - r.min()) / (r.max() - r.min())
    w = float(relevance_weight)
    return w * np.diag(q) @ s @ np.diag(q) + (1 - w) * s


def cdpruner_reference(features, relevance, budget: int, relevance_weight: float = 1.0) -> np.ndarray:
    v = np.asarray(features, dtype=np.float64)
    n, d = v.shape
    if budget >= n:
        return np.arange(n, dtype=np.int64)
    kernel = cdpruner_kernel(v, relevance, relevance_weight)
    top = float(np.max(np.diag(kernel)))
    window = (n + d) * EPS * top
    picks: list[int] = []
    while len(picks) < budget:
        cand = [i for i in range(n) if i not in picks]
        schur = np.diag(kernel)[cand].copy()
        if picks:  # L_ii - L_iY L_YY^-1 L_Yi for every candidate i: one solve, a column per candidate
            l_yc = kernel[np.ix_(picks, cand)]
            schur -= np.sum(l_yc * np.linalg.solve(kernel[np.ix_(picks, picks)], l_yc), axis=0)
        gains = dict(zip(cand, schur.tolist()))
        if max(gains.values()) <= 1e-4 * top:
            quality = {i: float(kernel[i, i]) for i in gains}
            while len(picks) < budget:
                k = _best(quality, window, largest=True)
                picks.append(k)
                del quality[k]
            break
        picks.append(_best(gains, window, largest=True))
    return np.asarray(sorted(picks), dtype=np.int64)
