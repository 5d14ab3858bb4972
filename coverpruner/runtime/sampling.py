"""Next-token choice from last-position logits: greedy, temperature and top-p (nucleus), after OpenAI's logit
adjustments (frequency / presence penalties over the tokens generated so far, logit_bias).

All randomness comes from one ``numpy.random.Generator`` per answer, so a seed reproduces a sample exactly. A
request with n answers (OpenAI's ``n``, runtime.engine forks it) gives answer i its own stream: answer 0 draws from
``default_rng(seed)`` (the same stream as a request with n = 1), answer i > 0 from ``default_rng([seed, i])``
(numpy's SeedSequence of the pair: independent of the others and reproducible); without a seed each answer
draws fresh entropy.

Sampling is total: every temperature the options accept (finite, >= 0) and every finite logit gives a valid
distribution. A temperature below GREEDY_BELOW is greedy: at 1e-5 a logit gap of 0.001 is already a probability
ratio of e^-100, so the choice is the argmax anyway (only exact ties differ, taken at the lowest id), and a smaller
one (down to 1e-310, a subnormal) overflowed logits / temperature to inf and the softmax to NaN. Above it the
logits are shifted by their maximum before the division, so z <= 0 and exp(z) never overflows. A logit row with
NaN or no finite maximum (a decoder fault) raises SamplingError (coverpruner.errors) for that answer alone, never a
draw from a NaN distribution.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from coverpruner.runtime.errors import OptionError, SamplingError
from coverpruner.runtime.options import check_logit_bias, check_penalty, check_seed, check_temperature, check_top_p

#: temperatures below this are greedy (module docstring; vLLM's _SAMPLING_EPS is the same 1e-5)
GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class SamplingConfig:
    """temperature below GREEDY_BELOW (0 included) -> greedy (argmax, lowest id on ties); top_p in (0, 1]."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict = field(default_factory=dict, hash=False)  # {token id: bias}

    def __post_init__(self):
        check_temperature(self.temperature)  # finite, >= 0 (runtime.options)
        check_top_p(self.top_p)  # finite, in (0, 1]
        check_seed(self.seed)
        check_penalty("frequency_penalty", self.frequency_penalty)  # finite, in [-2, 2]
        check_penalty("presence_penalty", self.presence_penalty)
        object.__setattr__(self, "logit_bias", check_logit_bias(self.logit_bias))

    @property
    def adjusts(self) -> bool:
        return bool(self.frequency_penalty or self.presence_penalty or self.logit_bias)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


class Sampler:
    """Call with logits float [V] (any float dtype) and optionally ``allowed`` bool [V] (a grammar's mask,
    runtime.grammar: every other token is -inf, after the penalties and logit_bias, so neither can bring one back)
    -> next token id (int). Called once per generated token, so it counts the tokens it returned (the penalties'
    history). stream: the answer's index among a request's n (module docstring: how its generator is seeded)."""

    def __init__(self, config: SamplingConfig, stream: int = 0):
        self.config = config
        self.rng = np.random.default_rng(config.seed if stream == 0 or config.seed is None
                                         else [config.seed, int(stream)])
        self.counts: dict[int, int] = {}

    def __call__(self, logits: np.ndarray, allowed: np.ndarray | None = None) -> int:
        logits = np.asarray(logits, dtype=np.float32).reshape(-1)
        if self.config.adjusts:
            logits = adjust_logits(logits, self.counts, self.config)
        if allowed is not None:
            if not allowed.any():
                raise OptionError("response_format: no token of the model's vocabulary continues the grammar",
                                  param="response_format")
            logits = np.where(allowed, logits, -np.inf)
        token = self._choose(logits)
        self.counts[token] = self.counts.get(token, 0) + 1
        return token

    def _choose(self, logits: np.ndarray) -> int:
        top = np.max(logits)
        if not np.isfinite(top):  # NaN anywhere, +inf, or every token -inf: a decoder fault, not a distribution
            raise SamplingError(f"the decoder's logits cannot be sampled (largest {top}); this answer is abandoned")
        if self.config.greedy:
            return int(np.argmax(logits))
        # shifted first: z <= 0 (-inf for a masked token), so neither the division nor exp overflows; the best
        # token has z = 0, so the sum is >= 1
        z = logits.astype(np.float64) - top
        p = np.exp(z / self.config.temperature)
        p /= p.sum()
        if self.config.top_p < 1.0:
            p = top_p_filter(p, self.config.top_p)
        return int(self.rng.choice(p.size, p=p))


def adjust_logits(logits: np.ndarray, counts: dict[int, int], config: SamplingConfig) -> np.ndarray:
    """OpenAI's definition: logits[j] - c[j] * frequency_penalty - (c[j] > 0) * presence_penalty + logit_bias[j],
    c[j] how often token j was generated so far (the prompt does not count). logits float32 [V] -> a new float64 [V]
    (float64: a bias of 100 on float32 logits would round away the differences sampling reads)."""
    out = logits.astype(np.float64)
    if counts:
        ids = np.fromiter(counts, dtype=np.int64, count=len(counts))
        c = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
        out[ids] -= c * config.frequency_penalty + config.presence_penalty
    if config.logit_bias:
        ids = np.fromiter(config.logit_bias, dtype=np.int64, count=len(config.logit_bias))
        out[ids] += np.fromiter(config.logit_bias.values(), dtype=np.float64, count=len(ids))
    return out


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
