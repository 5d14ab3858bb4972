"""DART (Wen et al. 2025, "Stop Looking for Important Tokens in Multimodal Language Models: Duplication Matters
More") in the pre-decoder form TensorRT Edge-LLM deploys: pivots and duplication scores on the projected visual
tokens V (the decoder's input rows), not on the layer-2 keys / hidden states of the paper.

Rule (docs/peers.md):
1. pivots: the P = min(pivots, m) tokens of largest L1 norm ||V_i||_1 (the paper's code ranks by the L1 norm of
   the keys, Edge-LLM by the L1 norm of the input embeddings); they are kept.
2. the other m - P picks are split over the pivots in pivot order (largest norm first), (m - P) // P each and one
   more for the first (m - P) % P pivots (the paper's per-pivot TOKEN_TOPK, made to add up to exactly m).
3. each pivot in turn keeps its quota of the not-yet-kept tokens with the LOWEST cosine similarity to it
   (least duplicated by the pivot).

Ties: values within (d + 2) * eps64 * scale of the best (the rounding of a float64 d-term dot product of unit
vectors, or of an L1 norm of scale `scale`) are tied and the lowest index wins. The paper's text pivots (the
instruction's highest-norm tokens) are not used: a selector sees only V (docs/peers.md says what that changes).
"""

from __future__ import annotations

import numbers

import numpy as np

from ._inputs import check_budget, check_features, check_relevance
from .ties import EPS64, NORM_EPS

#: the paper's pivot count for LLaVA-1.5 (4 image + 4 text pivots); all 8 are image pivots here
DART_PIVOTS = 8
#: upper bound of the pivots option (a pivot per kept token at most; larger values mean nothing)
MAX_PIVOTS = 4096


def check_pivots(pivots) -> int:
    if isinstance(pivots, bool) or not isinstance(pivots, numbers.Integral) or not 1 <= pivots <= MAX_PIVOTS:
        raise ValueError(f"pivots must be an integer in 1..{MAX_PIVOTS}, got {pivots!r}")
    return int(pivots)


def pivot_quotas(m: int, p: int) -> np.ndarray:
    """Picks each of the p pivots adds besides itself: (m - p) // p, one more for the first (m - p) % p. int64 [p]."""
    base, extra = divmod(m - p, p)
    return np.full(p, base, dtype=np.int64) + (np.arange(p) < extra)


def _lowest_index_best(score: np.ndarray, window: float, largest: bool) -> int:
    """Index of the best score (max if largest else min), the lowest index among those within `window` of it."""
    if largest:
        return int(np.flatnonzero(score >= score.max() - window)[0])
    return int(np.flatnonzero(score <= score.min() + window)[0])


def dart_select(features, relevance=None, budget: int = 64, pivots: int = DART_PIVOTS, **_) -> np.ndarray:
    """DART's duplication-aware selection on V. features [n, d]; relevance is ignored (DART reads no attention).
    Returns int64 [min(budget, n)] ascending."""
    v = check_features(features).astype(np.float64)
    n, d = v.shape
    m = check_budget(budget)
    check_relevance(relevance, n)
    p = check_pivots(pivots)
    if m >= n:
        return np.arange(n, dtype=np.int64)
    p = min(p, m)
    l1 = np.abs(v).sum(axis=1)
    free = l1.copy()
    order = []
    for _ in range(p):  # p argmaxes: the lowest index among norms equal up to their rounding
        k = _lowest_index_best(free, (d + 2) * EPS64 * float(l1.max()), largest=True)
        order.append(k)
        free[k] = -np.inf
    unit = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), NORM_EPS)
    kept = np.zeros(n, dtype=bool)
    kept[order] = True
    window = (d + 2) * EPS64
    for pivot, quota in zip(order, pivot_quotas(m, p)):
        if quota == 0:
            continue
        dup = unit @ unit[pivot]  # [n] cosine duplication with the pivot
        dup[kept] = np.inf
        for _ in range(int(quota)):
            k = _lowest_index_best(dup, window, largest=False)
            kept[k] = True
            dup[k] = np.inf
    return np.flatnonzero(kept).astype(np.int64)
