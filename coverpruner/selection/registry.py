"""Selector registry and the backend dispatch of the coverage selector."""

from __future__ import annotations

from typing import Callable

import numpy as np

from ._inputs import is_torch_tensor
from .baselines import attention_select, divprune_select, random_select, uniform_select
from .coverage import coverage_select_numpy

BACKENDS = ("auto", "reference", "numpy", "lazy", "torch")


def coverage_select(features, relevance=None, budget: int = 64, tau: float = 0.3, backend: str = "auto",
                    dtype=None, **_):
    """Pick `budget` visual tokens maximizing demand-weighted coverage (paper Eq. 6-7).

    features: [n, d] (numpy or torch; torch also [B, n, d]); relevance: [n] or None (uniform demand).
    Returns int64 indices [m] sorted ascending (m = min(budget, n)); a torch tensor in gives a torch tensor out
    on the same device. backend: "reference" (literal O(m n^2) float64), "numpy" (incremental gain update in
    row blocks, one [n, n] buffer: float64 up to n = 2,048, float32 above), "lazy" (upper-bound greedy, same
    buffer), "torch", or "auto" (torch for torch tensors, numpy otherwise). dtype: the numpy backends' utility
    buffer (np.float64 / np.float32; None: by n).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        backend = "torch" if is_torch_tensor(features) else "numpy"
    if backend == "torch":
        from .torch_backend import coverage_select_torch

        return coverage_select_torch(features, relevance, budget, tau)
    return coverage_select_numpy(features, relevance, budget, tau, backend=backend, dtype=dtype)


SELECTORS: dict[str, Callable[..., np.ndarray]] = {
    "coverpruner": coverage_select,
    "divprune": divprune_select,
    "attention": attention_select,
    "uniform": uniform_select,
    "random": random_select,
}


def get_selector(name: str) -> Callable[..., np.ndarray]:
    """The selector called `name`: f(features, relevance=None, budget=64, **options) -> int64 [m] ascending.

    Options a selector does not use are ignored (tau/backend for coverpruner, seed for random).
    """
    try:
        return SELECTORS[name]
    except KeyError:
        raise ValueError(f"unknown selection method {name!r}; choose one of {sorted(SELECTORS)}") from None
