"""The tie rule and rounding bounds every coverage greedy shares (coverage.py, blocked.py, torch_backend.py).

Only gains equal within the rounding of the arithmetic that computed them, relative to the current best gain, are
tied; then the lowest index wins. Kept apart from coverage.py so blocked.py can use it without an import cycle.
"""

from __future__ import annotations

import numpy as np

NORM_EPS = 1e-12
EPS64 = float(np.finfo(np.float64).eps)  # 2^-52 = 2u, u the float64 unit roundoff
EPS32 = float(np.finfo(np.float32).eps)  # 2^-23


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


def incremental_margin(n: int, m: int, first_best: float, atol: float) -> float:
    """Gains within this margin of the best incremental gain may be the exact best or tied with it.

    An incremental gain (first gain w @ A[:, k], then m subtractions of non-negative deltas that sum to at most
    the first gain) lies within b = (2n + m + 2) u g0 of its exact value, g0 = the largest first-step gain.
    A gain more than 2b + tie_rtol(n) * g0 + atol below the incremental best is below the exact best by more
    than the tie window, so it can be neither the pick nor tied with it: (6n + 2m + 6) * eps * g0 + atol.
    """
    return (6 * n + 2 * m + 6) * EPS64 * max(first_best, 0.0) + atol
