"""Independent float64 references of the selectors, written in the tests from the paper's definitions.

Nothing here imports coverpruner: the tests compare coverpruner.selection, selector.onnx, the CUDA greedy and the
pipeline with these literal versions, so a bug shared by the product's backends cannot hide behind a
self-comparison.

    utilities(features [n, d])         -> A [n, n] float64, A = max(0, M - rowmean(M)), M = cosine
    weights(relevance [n] | None, tau) -> w [n] float64, exp(tau * minmax(r)), ones for None / constant r
    literal_greedy(A, w, m)            -> picks int64 [m] in pick order: each step recomputes every gain
                                          sum_i w_i max(0, A_ik - c_i) and takes the exact argmax
    objective(A, w, picks)             -> f(S) = sum_i w_i max_{j in S} A_ij (paper Eq. 6), float
    coverage_reference / divprune_reference: features -> sorted int64 indices
"""

from __future__ import annotations

import numpy as np

EPS = float(np.finfo(np.float64).eps)


def utilities(features) -> np.ndarray:
    v = np.asarray(features, dtype=np.float64)
    norms = np.sqrt(np.einsum("ij,ij->i", v, v))
    unit = v / np.maximum(norms, 1e-12)[:, None]
    cos = unit @ unit.T
    return np.maximum(cos - cos.mean(axis=1)[:, None], 0.0)


def weights(relevance, tau: float, n: int) -> np.ndarray:
    if relevance is None:
        return np.ones(n)
    r = np.asarray(relevance, dtype=np.float64)
    lo, hi = r.min(), r.max()
    if hi == lo:
        return np.ones(n)
    return np.exp(tau * (r - lo) / (hi - lo))


def literal_greedy(a: np.ndarray, w: np.ndarray, m: int) -> np.ndarray:
    """Paper Algorithm 1 with every gain recomputed from scratch each step.

    Ties: gains within (n + 1) * eps * best (the rounding of two fresh float64 n-term sums) plus 64 * eps * sum(w)
    (exhausted columns: zero up to the utilities' own last bits) of the best are tied; the lowest index wins.
    """
    n = a.shape[0]
    c = np.zeros(n)
    taken = np.zeros(n, dtype=bool)
    window_abs = 64 * EPS * float(w.sum())
    picks = []
    excess = np.empty_like(a, dtype=np.float64)
    for _ in range(min(m, n)):
        np.subtract(a, c[:, None], out=excess)
        gains = w @ np.maximum(excess, 0.0, out=excess)
        gains[taken] = -np.inf
        best = gains.max()
        k = int(np.argmax(gains >= best - ((n + 1) * EPS * abs(best) + window_abs)))  # first True
        picks.append(k)
        taken[k] = True
        c = np.maximum(c, a[:, k])
    return np.asarray(picks, dtype=np.int64)


def objective(a: np.ndarray, w: np.ndarray, picks) -> float:
    picks = np.asarray(picks, dtype=np.int64)
    if picks.size == 0:
        return 0.0
    return float(w @ a[:, picks].max(axis=1))


def coverage_reference(features, relevance, budget: int, tau: float = 0.3) -> np.ndarray:
    n = len(features)
    if budget >= n:
        return np.arange(n, dtype=np.int64)
    return np.sort(literal_greedy(utilities(features), weights(relevance, tau, n), budget))


def divprune_reference(features, budget: int) -> np.ndarray:
    """DivPrune (max-min diversity, D = 1 - cosine): first the token whose nearest other token is farthest, then
    repeatedly the unpicked token farthest from its nearest picked token; lowest index on exact ties."""
    v = np.asarray(features, dtype=np.float64)
    n = len(v)
    if budget >= n:
        return np.arange(n, dtype=np.int64)
    unit = v / np.maximum(np.sqrt(np.einsum("ij,ij->i", v, v)), 1e-12)[:, None]
    dist = 1.0 - unit @ unit.T
    others = dist + np.diag(np.full(n, np.inf))  # a token is not its own neighbour
    picks = [int(np.argmax(others.min(axis=1)))]
    for _ in range(budget - 1):
        to_picked = dist[:, picks].min(axis=1)
        to_picked[picks] = -np.inf
        picks.append(int(np.argmax(to_picked)))
    return np.sort(np.asarray(picks, dtype=np.int64))


def assert_same_or_not_worse(got, features, relevance, budget: int, tau: float = 0.3, rtol: float = 1e-7, want=None):
    """A float32 implementation's indices: the literal greedy's, or, where a genuine float32 near-tie sent the
    greedy down another path, a set whose float64 coverage objective is >= the literal's x (1 - rtol).

    rtol 1e-7: float32 utilities and sums move a near-tied gain by ~sqrt(n) * 6e-8 of one step's gain, and a step's
    gain is far below the whole objective; a 1e-4 relative loss at one late step (the old tie rule) exceeds it.
    want: the literal greedy's indices when already known. Returns them."""
    got = np.asarray(got, dtype=np.int64)
    want = coverage_reference(features, relevance, budget, tau) if want is None else want
    assert got.shape == want.shape and np.all(np.diff(got) > 0), got
    if np.array_equal(got, want):
        return want
    a, w = utilities(features), weights(relevance, tau, len(features))
    f_got, f_want = objective(a, w, got), objective(a, w, want)
    assert f_got >= f_want * (1 - rtol), (
        f"different set with a worse coverage objective: {f_got!r} < {f_want!r} x (1 - {rtol}) "
        f"(relative {(f_want - f_got) / f_want:.3g}); differing indices {np.setxor1d(got, want).tolist()}")
    return want


# --- a hand-built near tie --------------------------------------------------------------------------------------
# n: (hi, lo, eps, budget). Token lo = 0 becomes a near copy of token hi (the last pick of the unmodified input's
# greedy at 64 resp. 80 steps), moved by eps * |v_hi| along a random direction; eps was chosen so that at the final
# step of `budget` hi's gain beats lo's by ~1e-4 relative, where the old rule's window (1e-6 * sum(w)) was 3x to
# 7x wider than that gap. near_tie_case checks all of that on every run.
NEAR_TIES = {576: (239, 0, 4.575e-4, 44), 2880: (226, 0, -5.84e-4, 52)}


def _near_tie_input(n: int, seed: int = 0, d: int = 64):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n // 16, d))
    v = (centres[rng.integers(0, len(centres), n)] + 0.7 * rng.standard_normal((n, d))).astype(np.float32)
    relevance = rng.random(n).astype(np.float32)
    direction = rng.standard_normal(d)
    return v, relevance, direction


_CASES: dict = {}


def near_tie_case(n: int):
    """(features float32 [n, d], relevance float32 [n], budget, hi, lo, relative gap) where the literal greedy's
    final pick is hi, over lo < hi whose gain there is lower by `relative gap` (checked to lie in [5e-5, 2e-4])."""
    if n in _CASES:
        return _CASES[n]
    hi, lo, eps, budget = NEAR_TIES[n]
    v, relevance, direction = _near_tie_input(n)
    w = weights(relevance, 0.3, n)
    direction *= np.linalg.norm(v[hi]) / np.linalg.norm(direction)
    v[lo] = (v[hi] + eps * direction).astype(np.float32)
    a = utilities(v)
    picks = literal_greedy(a, w, budget)
    c = a[:, picks[:-1]].max(axis=1)
    gains = w @ np.maximum(a - c[:, None], 0.0)
    gap = (gains[hi] - gains[lo]) / gains[hi]
    assert picks[-1] == hi and lo not in picks and 5e-5 <= gap <= 2e-4, (picks[-1], hi, lo, gap)
    assert 1e-6 * w.sum() > 2.5 * gap * gains[hi], "the old rule's window would not have tied this gap"
    _CASES[n] = (v, relevance, budget, hi, lo, gap)
    return _CASES[n]


OBJECTIVE_CASES = ["random-n2880-d64-m144", "clustered-n2880-d128-m144", "duplicated-n1152-d32-m400",
                   "random-n576-d256-m288", "clustered-n576-d64-m64"]


def objective_case(label: str):
    """One of objective_cases() by label."""
    return next(case[1:] for case in objective_cases() if case[0] == label)


def objective_cases():
    """Seeded (label, features float32 [n, d], relevance, budget) at n up to 2,880: random, clustered, duplicated."""
    cases = []
    for kind, n, d, budget in (("random", 2880, 64, 144), ("clustered", 2880, 128, 144),
                               ("duplicated", 1152, 32, 400), ("random", 576, 256, 288),
                               ("clustered", 576, 64, 64)):
        rng = np.random.default_rng(n + d + budget)
        if kind == "random":
            v = rng.standard_normal((n, d))
        elif kind == "clustered":
            centres = rng.standard_normal((n // 12, d))
            v = centres[rng.integers(0, len(centres), n)] + 0.5 * rng.standard_normal((n, d))
        else:
            base = rng.standard_normal((n // 3, d))
            v = base[rng.integers(0, len(base), n)]
        cases.append((f"{kind}-n{n}-d{d}-m{budget}", v.astype(np.float32), rng.random(n).astype(np.float32),
                      budget))
    return cases
