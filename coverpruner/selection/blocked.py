"""The coverage greedy at video sizes: one [n, n] similarity buffer, work in row blocks, exact picks.

`similarity(features, dtype)` builds the cosine similarity M (exactly symmetric) and its row means mu; the
utilities are A[i, k] = max(0, M[i, k] - mu_i). float64 up to FLOAT64_MAX_N candidates, float32 above: float32
utilities follow the float32 rule (the literal float64 greedy's indices, or a set whose float64 objective is >= the
literal's x (1 - 1e-7)). Gains are always float64 sums of exact terms: coverage c holds values of A, and a float32
utility minus a float32 coverage value is exact in float64.

Two greedies, both with the reference's picks (`greedy_reference`: the best gain, ties within `tie_rtol` /
`zero_level` of it to the lowest index):
- `greedy_symmetric` (the "numpy" backend): coverage.greedy_incremental's update -- subtract from the gain vector
  only what the rows whose coverage rose contribute, clip(a, c_old, c_new) - c_old -- in row blocks of STEP_ROWS,
  reading A's rows and columns as rows of M (M symmetric), so A itself is never formed. A step costs O(|R| n),
  R = rows whose coverage rose.
- `greedy_lazy` (the "lazy" backend, on A^T from `utilities`): the objective is monotone submodular, so a gain
  computed at an earlier step bounds the gain now (up to rounding, `_slack`); each step re-sums candidates in order
  of their bounds until no stale bound reaches the tie threshold of the best fresh gain. O(n) per re-summed
  candidate. On clustered features it re-sums more candidates per step (86 at n = 2,880, 118 at 8,192, m = 10 %)
  than the incremental update touches rows (50 resp. 60), so it is not the default.
"""
from __future__ import annotations

import heapq

import numpy as np

from .ties import EPS64, NORM_EPS, incremental_margin, lowest_tied, tie_rtol, zero_level

#: the similarity is float64 up to this many candidates and float32 above (the float32 rule): numpy's float32
#: syrk takes half the float64 one's time (n = 2,880, d = 4,096: 190 vs 405 ms on this project's 2-core CPU)
FLOAT64_MAX_N = 2048
#: rows per block when a float32 A^T is summed in float64 (a [rows, n] float64 temporary: 32 MiB at n = 16,384)
BLOCK_BYTES = 32 << 20
#: rows per block in greedy_symmetric's steps: [rows, n] float32 + float64 temporaries that stay in cache
#: (128 rows: 1.5 + 2.9 MB at n = 2,880)
STEP_ROWS = 128
#: candidates re-evaluated one by one in a step before the rest go in blocks (each block as large as all before)
SINGLE_EVALUATIONS = 32


def utilities_dtype(n: int):
    """float64 up to FLOAT64_MAX_N candidates, float32 above."""
    return np.float64 if n <= FLOAT64_MAX_N else np.float32


def similarity(v: np.ndarray, dtype=None) -> tuple[np.ndarray, np.ndarray]:
    """v: [n, d] float features (checked finite) -> (M [n, n], mu [n]) in `dtype` (default utilities_dtype(n)).

    M is the cosine similarity, exactly symmetric (M[i, k] == M[k, i] bit for bit), mu_i its row mean
    (accumulated in float64). The utilities are A[i, k] = max(0, M[i, k] - mu_i) with the subtraction rounded in
    `dtype`; M is the only [n, n] array. float64: rows normalized in a float64 copy of v, then one GEMM (numpy runs
    x @ x.T as syrk: exactly symmetric). float32: the GEMM runs on v itself (no copy when v is float32
    C-contiguous), the norms are its diagonal, and each row block of its result is scaled by 1 / (|v_i| |v_k|),
    products that are the same for (i, k) and (k, i), so the scaled M stays symmetric."""
    n = v.shape[0]
    dtype = np.dtype(utilities_dtype(n) if dtype is None else dtype)
    if dtype == np.float64:
        norms = np.sqrt(np.einsum("ij,ij->i", v, v, dtype=np.float64))
        vn = v.astype(np.float64)  # the one [n, d] float64 copy, normalized in place
        vn *= (1.0 / np.maximum(norms, NORM_EPS))[:, None]
        m = vn @ vn.T
        del vn
        mu = m.sum(axis=1) / n
        return m, mu
    vf = np.ascontiguousarray(v, dtype=dtype)
    m = vf @ vf.T
    # |v_i|^2 is the GEMM's own diagonal (float32 sums: within the float32 rule)
    inv = (1.0 / np.maximum(np.sqrt(np.diagonal(m).astype(np.float64)), NORM_EPS)).astype(dtype)
    scale = np.empty((STEP_ROWS, n), dtype)
    sums = np.empty(n)
    for s in range(0, n, STEP_ROWS):
        blk = m[s:s + STEP_ROWS]
        blk *= np.multiply(inv[s:s + STEP_ROWS, None], inv[None, :], out=scale[:blk.shape[0]])
        blk.sum(axis=1, dtype=np.float64, out=sums[s:s + STEP_ROWS])  # while the block is in cache
    mu = (sums / n).astype(dtype)
    return m, mu


def utilities(v: np.ndarray, dtype=None, transposed: bool = False) -> np.ndarray:
    """v: [n, d] float features (checked finite) -> A [n, n] `dtype` (default utilities_dtype(n)), or A^T.

    A[i, k] = max(0, M[i, k] - mu_i) from `similarity`. M is symmetric, so A^T[k, i] = max(0, M[k, i] - mu_i):
    either layout is one in-place pass over M."""
    m, mu = similarity(v, dtype)
    np.subtract(m, mu[None, :] if transposed else mu[:, None], out=m)
    np.maximum(m, 0.0, out=m)
    return m


def _block_rows(n: int) -> int:
    return max(1, min(n, BLOCK_BYTES // (8 * max(n, 1))))


class _Gains:
    """Fresh gains gain_k = sum_i w_i max(0, A^T[k, i] - c_i) -> float64, in reused buffers (a fresh large
    allocation per call costs page faults): one [n] row and a [rows, n] float64 block of at most BLOCK_BYTES.
    at [n, n] float32|float64, c float64 [n] (values of at, so at - c is exact in float64), w float64 [n]."""

    def __init__(self, at: np.ndarray, c: np.ndarray, w: np.ndarray):
        n = at.shape[1]
        self.at, self.c, self.w = at, c, w
        self.rows = _block_rows(n)
        self.row = np.empty(n)
        self.block = np.empty((self.rows, n))
        self.taken = self.block if at.dtype == np.float64 else np.empty((self.rows, n), at.dtype)

    def one(self, k: int) -> float:
        d = np.subtract(self.at[k], self.c, out=self.row)
        return float(np.maximum(d, 0.0, out=d) @ self.w)

    def many(self, idx) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.intp)
        out = np.empty(idx.size)
        for s in range(0, idx.size, self.rows):
            part = idx[s:s + self.rows]
            taken = np.take(self.at, part, axis=0, out=self.taken[:part.size])
            d = np.subtract(taken, self.c, out=self.block[:part.size])
            np.maximum(d, 0.0, out=d)
            np.matmul(d, self.w, out=out[s:s + part.size])
        return out


def _first_gains(at: np.ndarray, w: np.ndarray) -> np.ndarray:
    """c = 0 and A >= 0: gain_k = A^T[k] @ w for every k, float64 [n], in row blocks."""
    n = at.shape[0]
    out = np.empty(n)
    step = _block_rows(n)
    for s in range(0, n, step):
        out[s:s + step] = at[s:s + step].astype(np.float64, copy=False) @ w
    return out


def _slack(n: int) -> float:
    """A gain computed now is <= (1 + _slack(n)) x the same gain computed at any earlier step.

    Each term max(0, a - c_i) is exact (or correctly rounded, monotone in c_i) and only falls as c rises; the
    n-term sums differ from their exact values by at most (n + 1) u relative in either direction (u = eps / 2),
    so two sums in any order and their ratio: 2 (n + 1) eps, doubled for margin. Only costs a re-evaluation."""
    return 4 * (n + 1) * EPS64


def tie_window(n: int, w: np.ndarray, dtype) -> tuple[float, float]:
    """(rtol, atol) of the reference's tie rule for gains from `dtype` utilities: float64 as coverage.py;
    float32 utilities use the float32 window (their gains are exact sums of float32 values, zero when covered)."""
    if np.dtype(dtype) == np.float64:
        return tie_rtol(n), zero_level(w)
    return tie_rtol(n, np.float32), 0.0


def greedy_lazy(at: np.ndarray, w: np.ndarray, budget: int, rtol: float | None = None,
                atol: float | None = None) -> np.ndarray:
    """Lazy (upper-bound) greedy: Same picks as greedy_reference(A, w, budget) from A^T = `at` [n, n] (float64 or float32) and w float64
    [n]. Returns int64 [m] in pick order, m = min(budget, n)."""
    n = at.shape[0]
    m = min(int(budget), n)
    w = np.asarray(w, dtype=np.float64)
    default_rtol, default_atol = tie_window(n, w, at.dtype)
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    grow = 1.0 + _slack(n)
    c = np.zeros(n)
    fresh = _Gains(at, c, w)
    heap = [(-g, k) for k, g in enumerate(_first_gains(at, w).tolist())]
    heapq.heapify(heap)
    picks = []
    for _ in range(m):
        # re-evaluate in order of the bounds until no stale bound reaches the tie threshold of the best fresh gain;
        # one at a time (usually a handful), in growing blocks on a plateau of equal gains (duplicates, exhausted
        # coverage), where nearly every candidate must be summed afresh
        idx, gains, best = [], [], -np.inf
        threshold = -np.inf
        while heap and -heap[0][0] * grow >= threshold:
            if len(idx) < SINGLE_EVALUATIONS:
                k = heapq.heappop(heap)[1]
                g = fresh.one(k)
                idx.append(k)
                gains.append(g)
                best = max(best, g)
            else:
                more = []
                while heap and len(more) < len(idx) and -heap[0][0] * grow >= threshold:
                    more.append(heapq.heappop(heap)[1])
                g = fresh.many(more)
                idx += more
                gains += g.tolist()
                best = max(best, float(g.max()))
            threshold = best - (rtol * abs(best) + atol)
        k = min(i for i, g in zip(idx, gains) if g >= threshold)
        for i, g in zip(idx, gains):
            if i != k:
                heapq.heappush(heap, (-g, i))
        picks.append(k)
        np.maximum(c, at[k], out=c)
    return np.asarray(picks, dtype=np.int64)


def greedy_symmetric(m: np.ndarray, mu: np.ndarray, w: np.ndarray, budget: int) -> np.ndarray:
    """greedy_reference's picks on A[i, k] = max(0, fl(m[i, k] - mu_i)) without forming A: m the exactly symmetric
    similarity [n, n] (float32 or float64) and mu its row means [n] of the same dtype (`similarity`), w float64
    [n]. Returns int64 [m] in pick order, m = min(budget, n).

    coverage.greedy_incremental's update: since m is symmetric, column k of A is max(0, m[k] - mu), a contiguous
    row of m, as are the candidates' columns re-summed on a near tie; the rows whose coverage rose are rows of m
    minus their own mu. Each subtracted term is clip(a, lo, hi) - lo, exact in float64, so a gain's rounding is
    that of its sums (coverage.incremental_margin). Temporaries: [STEP_ROWS, n] blocks in `dtype` and float64."""
    n = m.shape[0]
    steps = min(int(budget), n)
    w = np.asarray(w, dtype=np.float64)
    rtol, atol = tie_window(n, w, m.dtype)
    rows_per = min(STEP_ROWS, n)
    stage = np.empty((rows_per, n), m.dtype)
    block = np.empty((rows_per, n))
    gain = np.zeros(n)
    for s in range(0, n, rows_per):  # c = 0: gain = w @ A, block by block
        a = np.subtract(m[s:s + rows_per], mu[s:s + rows_per, None], out=stage[:min(rows_per, n - s)])
        gain += w[s:s + rows_per] @ np.maximum(a, 0.0, out=a)
    g0 = float(gain.max())
    c = np.zeros(n)  # coverage, float64 (values of A: exact)
    c_own = np.zeros(n, m.dtype)  # the same values in m's dtype, the lower clip bound
    col_own = np.empty(n, m.dtype)
    updates = 0  # subtractions from the gain vector so far: each adds one rounding of at most u * g0
    picks = []
    for _ in range(steps):
        # candidates that may be the exact best or tied with it: within twice the incremental rounding bound b of
        # the best incremental gain, plus the tie window of the best exact gain (<= that best + b)
        bound = incremental_margin(n, updates, g0, atol)
        best = float(gain.max())
        cand = np.flatnonzero(gain >= best - (bound + rtol * (max(best, 0.0) + bound)))
        if cand.size > 1:  # near-tie or exhausted coverage: decide on fresh sums, as the reference does
            fresh = np.empty(cand.size)
            for s in range(0, cand.size, rows_per):
                part = cand[s:s + rows_per]
                a = np.take(m, part, axis=0, out=stage[:part.size], mode="clip")  # rows k of m = columns k of M
                np.subtract(a, mu, out=a)
                np.maximum(a, 0.0, out=a)
                d = np.subtract(a, c, out=block[:part.size])
                np.maximum(d, 0.0, out=d)
                np.matmul(d, w, out=fresh[s:s + part.size])
            gain[cand] = fresh
            k = int(cand[lowest_tied(fresh, rtol, atol)])
        else:
            k = int(cand[0])
        picks.append(k)
        np.subtract(m[k], mu, out=col_own)
        np.maximum(col_own, 0.0, out=col_own)  # column k of A
        col = col_own.astype(np.float64)
        rows = np.flatnonzero(col > c)
        for s in range(0, rows.size, rows_per):
            r = rows[s:s + rows_per]
            a = np.take(m, r, axis=0, out=stage[:r.size], mode="clip")
            np.subtract(a, mu[r, None], out=a)  # rows r of A before max(0, .): clip below at c >= 0 does that
            np.clip(a, c_own[r, None], col_own[r, None], out=a)
            t = np.subtract(a, c[r, None], out=block[:r.size])  # clip(a, lo, hi) - lo: exact in float64
            gain -= w[r] @ t
            updates += 1
        c[rows] = col[rows]
        c_own[rows] = col_own[rows]
        gain[k] = -np.inf  # stays -inf: later updates subtract finite amounts
    return np.asarray(picks, dtype=np.int64)
