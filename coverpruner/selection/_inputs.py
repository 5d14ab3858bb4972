"""Argument checks shared by every selector: one clear ValueError per bad input."""

from __future__ import annotations

import numbers

import numpy as np


def is_torch_tensor(x) -> bool:
    """True for a torch.Tensor, without importing torch (selection must stay torch-free)."""
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def to_numpy(x) -> np.ndarray:
    """A numpy view/copy of an array-like or torch tensor (moved to CPU)."""
    if is_torch_tensor(x):
        x = x.detach().cpu()
        if str(x.dtype) == "torch.bfloat16":
            x = x.float()
        return x.numpy()
    return np.asarray(x)


def check_budget(budget) -> int:
    """budget must be a positive integer (bool is rejected: True is not a budget)."""
    if isinstance(budget, bool) or not isinstance(budget, numbers.Integral) or int(budget) < 1:
        raise ValueError(f"budget must be a positive integer, got {budget!r}")
    return int(budget)


def check_tau(tau) -> float:
    if isinstance(tau, bool) or not isinstance(tau, numbers.Real) or not np.isfinite(tau):
        raise ValueError(f"tau must be a finite number, got {tau!r}")
    return float(tau)


def check_features(features, *, allow_batch: bool = False) -> np.ndarray:
    """features: [n, d] (or [B, n, d] when allow_batch), finite, n >= 1, d >= 1."""
    arr = to_numpy(features)
    ndims = (2, 3) if allow_batch else (2,)
    if arr.ndim not in ndims:
        want = "[n, d] or [B, n, d]" if allow_batch else "[n, d]"
        raise ValueError(f"features must have shape {want}, got ndim={arr.ndim} shape={tuple(arr.shape)}")
    if arr.shape[-2] < 1 or arr.shape[-1] < 1:
        raise ValueError(f"features must have at least one token and one channel, got shape {tuple(arr.shape)}")
    if not np.issubdtype(arr.dtype, np.number):
        raise ValueError(f"features must be numeric, got dtype {arr.dtype}")
    if not np.all(np.isfinite(arr)):
        bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
        raise ValueError(f"features contain {bad} NaN/inf value(s)")
    return arr


def check_relevance(relevance, n: int, *, batch: int | None = None) -> np.ndarray | None:
    """relevance: None or [n] ([B, n] or [n] when batch is given), finite."""
    if relevance is None:
        return None
    arr = to_numpy(relevance).astype(np.float64)
    ok = arr.ndim == 1 or (batch is not None and arr.ndim == 2 and arr.shape[0] == batch)
    if not ok:
        want = "[n]" if batch is None else f"[n] or [{batch}, n]"
        raise ValueError(f"relevance must have shape {want}, got shape {tuple(arr.shape)}")
    if arr.shape[-1] != n:
        raise ValueError(f"relevance length must equal the number of tokens n={n}, got {arr.shape[-1]}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("relevance contains NaN/inf value(s)")
    return arr
