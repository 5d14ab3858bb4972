import numpy as np


def make_case(kind: str, seed: int):
    """(features [n, d] float32, relevance [n] | None, budget, tau) for one seeded parity case."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(12, 120))
    d = int(rng.integers(4, 48))
    budget = int(rng.integers(1, n + 5))  # sometimes >= n
    relevance = rng.random(n)
    tau = 0.3
    if kind == "random":
        v = rng.standard_normal((n, d))
    elif kind == "clustered":
        centres = rng.standard_normal((max(2, n // 10), d))
        v = centres[rng.integers(0, len(centres), n)] + 0.05 * rng.standard_normal((n, d))
    elif kind == "duplicated":
        base = rng.standard_normal((max(2, n // 4), d))
        v = base[rng.integers(0, len(base), n)]  # exact copies: exact gain ties
    elif kind == "constant_relevance":
        v = rng.standard_normal((n, d))
        relevance = np.full(n, 0.7)
    elif kind == "tau0":
        v = rng.standard_normal((n, d))
        tau = 0.0
    elif kind == "tau1":
        v = rng.standard_normal((n, d))
        tau = 1.0
    elif kind == "no_relevance":
        v = rng.standard_normal((n, d))
        relevance = None
    else:
        raise ValueError(kind)
    return v.astype(np.float32), relevance, budget, tau


KINDS = ["random", "clustered", "duplicated", "constant_relevance", "tau0", "tau1", "no_relevance"]
