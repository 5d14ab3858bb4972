"""Next-token choice from last-position logits: greedy, temperature and top-p (nucleus).

All randomness comes from one ``numpy.random.Generator(seed)`` per request, so a seed
reproduces a sample exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coverpruner.runtime.options import check_seed, check_temperature, check_top_p


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 -> greedy (argmax, lowest id on ties); top_p in (0, 1]."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        check_temperature(self.temperature)  # finite, >= 0 (runtime.options)
        check_top_p(self.top_p)  # finite, in (0, 1]
        check_seed(self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class Sampler:
    """Call with logits float [V] (any float dtype) -> next token id (int)."""

    def __init__(self, config: SamplingConfig):
        self.config = config
        self.rng = np.random.default_rng(config.seed)

    def __call__(self, logits: np.ndarray) -> int:
        logits = np.asarray(logits, dtype=np.float32).reshape(-1)
        if self.config.greedy:
            return int(np.argmax(logits))
        z = logits.astype(np.float64) / self.config.temperature
        z -= z.max()
        p = np.exp(z)
        p /= p.sum()
        if self.config.top_p < 1.0:
            p = top_p_filter(p, self.config.top_p)
        return int(self.rng.choice(p.size, p=p))


def top_p_filter(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Keep the smallest set of highest-probability tokens whose mass reaches ``top_p``; renormalize.

    probs: float64 [V] summing to 1. The most likely token is always kept.
    """
    order = np.argsort(-probs, kind="stable")
    cum = np.cumsum(probs[order])
    # a token stays if the mass before it is still below top_p
    keep_sorted = (cum - probs[order]) < top_p
    keep_sorted[0] = True
    out = np.zeros_like(probs)
    kept = order[keep_sorted]
    out[kept] = probs[kept]
    return out / out.sum()
