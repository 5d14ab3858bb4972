"""CDPruner (Zhang et al. 2025, "Beyond Attention or Similarity: Maximizing Conditional Diversity for Token
Pruning in MLLMs"): the m tokens of (approximately) largest determinant of a conditional DPP kernel, found by the
fast greedy MAP inference of Chen et al. 2018 ("Fast Greedy MAP Inference for Determinantal Point Process").

Kernel (docs/peers.md):
    S = Vn Vn^T (cosine similarity of the rows of V),  q = minmax(relevance) in [0, 1]
    L = w * diag(q) S diag(q) + (1 - w) * S,           w = relevance_weight in [0, 1]
w = 1 is the paper's kernel L = diag(q) S diag(q); OpenVINO GenAI exposes w as ``relevance_weight`` (its kernel
K = w R R^T o S + (1 - w) S). The paper's q is the negated mean CLIP text-image similarity, min-max normalised;
here it is the layer-0 probe's attention of the instruction to each visual token (the demand coverpruner reads),
min-max normalised the same way; None or a constant relevance gives q = 1 (diversity alone).

Greedy MAP: d_i^2 = L_ii; each step takes j = argmax d_i^2 over the unpicked tokens, then for every i
e_i = (L_ji - <c_j, c_i>) / d_j, c_i <- [c_i, e_i], d_i^2 <- d_i^2 - e_i^2 (d_i^2 is the gain
det(L_{Y+i}) / det(L_Y)). S is one GEMM (selection.blocked.similarity: float64 up to 2,048 tokens, float32 above,
exactly symmetric): measured faster than forming a row of S per pick (m memory-bound [n, d] passes) at n = 576 and
2,880 (docs/performance.md); the gains are float64. Ties: gains within (n + d) * eps64 * max(diag L) of the best
(8 float32 ulps of it when S is float32) are tied, the lowest index wins. When the best gain
falls to EXHAUSTED_RTOL * max(diag L) or below, the kernel has no volume left (rank(L) <= picks, e.g. d < m or
duplicated tokens); the remaining picks are the unpicked tokens of largest quality L_ii, lowest index on ties
(Chen et al. stop there; a selector must return m tokens).
"""

from __future__ import annotations

import numbers

import numpy as np

from ._inputs import check_budget, check_features, check_relevance
from .blocked import similarity, utilities_dtype
from .ties import EPS32, EPS64

#: the paper's kernel (OpenVINO GenAI's docs give 1.0 as relevance_weight's default too)
RELEVANCE_WEIGHT = 1.0
#: a gain at or below this fraction of the largest quality L_ii counts as no volume left (see the module doc): 1e-4
#: rather than float64's 1e-15 so that the float32 selector graph (export/peer_graphs.py), whose incremental gains
#: carry ~m * eps32 (up to ~4e-5 at m = 320) of rounding, draws the same line; a token below it adds a factor
#: under 1e-4 to det(L_Y), i.e. is (nearly) in the span of the kept ones
EXHAUSTED_RTOL = 1e-4


def check_relevance_weight(weight) -> float:
    ok = isinstance(weight, numbers.Real) and not isinstance(weight, bool) and np.isfinite(weight) \
        and 0.0 <= weight <= 1.0
    if not ok:
        raise ValueError(f"relevance_weight must be a finite number in [0, 1], got {weight!r}")
    return float(weight)


def instruction_quality(relevance, n: int) -> np.ndarray:
    """q = (r - min r) / (max r - min r) float64 [n]; ones for None or a constant r."""
    if relevance is None:
        return np.ones(n)
    r = np.asarray(relevance, dtype=np.float64)
    lo, hi = r.min(), r.max()
    return np.ones(n) if hi == lo else (r - lo) / (hi - lo)


def cdpruner_select(features, relevance=None, budget: int = 64, relevance_weight: float = RELEVANCE_WEIGHT,
                    **_) -> np.ndarray:
    """Conditional-DPP greedy MAP selection. features [n, d], relevance [n] | None. Returns int64 [min(budget, n)]
    ascending."""
    v = check_features(features)
    n, d = v.shape
    m = check_budget(budget)
    r = check_relevance(relevance, n)
    w = check_relevance_weight(relevance_weight)
    if m >= n:
        return np.arange(n, dtype=np.int64)
    dtype = utilities_dtype(n)
    sim, _ = similarity(v, dtype)  # [n, n] cosine similarity
    q = instruction_quality(r, n)
    mix = w * q  # L_ji = S_ji * (mix_j * q_i + (1 - w))
    nonzero = np.linalg.norm(v, axis=1) > 0
    diag = nonzero * (mix * q + (1.0 - w))  # S_ii = 1 exactly (0 for an all-zero row): equal qualities tie
    top = float(diag.max())
    window = ((n + d) * EPS64 if dtype == np.float64 else 8 * EPS32) * top
    gain = diag.copy()
    c = np.empty((m, n))  # row t = e of step t
    picks: list[int] = []
    for t in range(m):
        best = gain.max()
        if best <= EXHAUSTED_RTOL * top:
            quality = diag.copy()
            quality[picks] = -np.inf
            for _ in range(m - t):
                k = int(np.flatnonzero(quality >= quality.max() - window)[0])
                picks.append(k)
                quality[k] = -np.inf
            break
        j = int(np.flatnonzero(gain >= best - window)[0])
        row = sim[j].astype(np.float64) * (mix[j] * q + (1.0 - w))
        # the strided column c[:t, j] copied first: numpy's BLAS path then runs (measured 4x faster at n = 2,880)
        e = (row - np.ascontiguousarray(c[:t, j]) @ c[:t]) / np.sqrt(gain[j])
        c[t] = e
        gain -= e * e
        picks.append(j)
        gain[picks] = -np.inf
    return np.sort(np.asarray(picks, dtype=np.int64))
