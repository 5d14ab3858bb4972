"""Baseline selectors with the coverage selector's contract: (features [n, d], relevance [n] | None, budget)
-> int64 indices [m] sorted ascending; budget >= n keeps every token. Ties go to the lowest index."""

from __future__ import annotations

import numpy as np

from ._inputs import check_budget, check_features, check_relevance
from .coverage import NORM_EPS


def _prepare(features, relevance, budget):
    v = check_features(features)
    n = v.shape[0]
    return v, n, check_budget(budget), check_relevance(relevance, n)


def divprune_select(features, relevance=None, budget: int = 64, **_) -> np.ndarray:
    """DivPrune: greedy max-min diversity under cosine distance D = 1 - cos.

    First pick: the token whose nearest neighbour is farthest (argmax_i min_{j != i} D_ij); then repeatedly the
    unselected token farthest from its nearest selected token. relevance is ignored.
    """
    v, n, budget, _ = _prepare(features, relevance, budget)
    if budget >= n:
        return np.arange(n, dtype=np.int64)
    v = v.astype(np.float64)
    v = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), NORM_EPS)
    dist = 1.0 - v @ v.T
    off_diag = dist.copy()
    np.fill_diagonal(off_diag, np.inf)
    first = int(np.argmax(off_diag.min(axis=1)))
    picks = [first]
    nearest = dist[:, first].copy()
    nearest[first] = -np.inf
    for _ in range(budget - 1):
        k = int(np.argmax(nearest))  # np.argmax returns the first maximum: lowest index on ties
        picks.append(k)
        np.minimum(nearest, dist[:, k], out=nearest)
        nearest[picks] = -np.inf
    return np.sort(np.asarray(picks, dtype=np.int64))


def attention_select(features, relevance=None, budget: int = 64, **_) -> np.ndarray:
    """Top-m tokens by relevance (the layer-0 probe's attention)."""
    _, n, budget, r = _prepare(features, relevance, budget)
    if r is None:
        raise ValueError("relevance is required for method 'attention' (got None)")
    if budget >= n:
        return np.arange(n, dtype=np.int64)
    order = np.argsort(-r, kind="stable")  # stable: equal relevance keeps the lower index first
    return np.sort(order[:budget]).astype(np.int64)


def uniform_select(features, relevance=None, budget: int = 64, **_) -> np.ndarray:
    """m indices evenly spaced over the original order: the centre of each of m equal strides."""
    _, n, budget, _ = _prepare(features, relevance, budget)
    if budget >= n:
        return np.arange(n, dtype=np.int64)
    return ((np.arange(budget) * 2 + 1) * n // (2 * budget)).astype(np.int64)


def random_select(features, relevance=None, budget: int = 64, seed: int | None = 0, **_) -> np.ndarray:
    """m distinct indices drawn uniformly with numpy's Generator(seed); the same seed gives the same set."""
    _, n, budget, _ = _prepare(features, relevance, budget)
    if budget >= n:
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n, size=budget, replace=False)).astype(np.int64)
