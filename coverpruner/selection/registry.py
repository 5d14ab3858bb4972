"""Selector registry and the backend dispatch of the coverage selector."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ._inputs import is_torch_tensor
from .baselines import attention_select, divprune_select, random_select, uniform_select
from .cdpruner import RELEVANCE_WEIGHT, cdpruner_select, check_relevance_weight
from .coverage import coverage_select_numpy
from .dart import DART_PIVOTS, check_pivots, dart_select

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


@dataclass(frozen=True)
class MethodOption:
    """A selection option only some methods take (``relevance_weight`` for cdpruner). check(value) -> the value,
    or ValueError with one line naming the option, the expected range and the value given."""

    name: str
    default: object
    check: Callable[[object], object]
    help: str


@dataclass(frozen=True)
class Method:
    """A registered selection method: its selector, whether it reads the layer-0 probe's relevance (the runtime
    runs the probe only for those), and the method options it takes (passed to select as keywords).
    tau and seed are not listed: every selector takes and ignores them (the request's own arguments)."""

    select: Callable[..., np.ndarray]
    uses_relevance: bool
    options: tuple[MethodOption, ...] = ()


PIVOTS = MethodOption("pivots", DART_PIVOTS, check_pivots,
                      f"dart: pivot tokens (largest L1 norm), default {DART_PIVOTS}")
RELEVANCE_WEIGHT_OPTION = MethodOption("relevance_weight", RELEVANCE_WEIGHT, check_relevance_weight,
                                       "cdpruner: weight of the instruction relevance in the DPP kernel, in [0, 1] "
                                       f"(default {RELEVANCE_WEIGHT}: the paper's kernel)")

METHODS: dict[str, Method] = {
    "coverpruner": Method(coverage_select, uses_relevance=True),
    "divprune": Method(divprune_select, uses_relevance=False),
    "attention": Method(attention_select, uses_relevance=True),
    "uniform": Method(uniform_select, uses_relevance=False),
    "random": Method(random_select, uses_relevance=False),
    "dart": Method(dart_select, uses_relevance=False, options=(PIVOTS,)),
    "cdpruner": Method(cdpruner_select, uses_relevance=True, options=(RELEVANCE_WEIGHT_OPTION,)),
}
#: name -> selector (the registry's selectors, in the order above)
SELECTORS: dict[str, Callable[..., np.ndarray]] = {name: m.select for name, m in METHODS.items()}
#: every method option any method declares: {name: MethodOption}
METHOD_OPTIONS: dict[str, MethodOption] = {o.name: o for m in METHODS.values() for o in m.options}


def get_method(name: str) -> Method:
    """The registry entry called `name`; ValueError naming the choices for an unknown one."""
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown selection method {name!r}; choose one of {sorted(METHODS)}") from None


def uses_relevance(name: str) -> bool:
    """Whether method `name` reads the layer-0 relevance (its declaration)."""
    return get_method(name).uses_relevance


def method_options(name: str, given: dict) -> dict:
    """The method options of `name` for a request: given values (checked) over the declared defaults; a value None
    counts as not given. ValueError (one line) for an option of another method, or a bad value."""
    method = get_method(name)
    own = {o.name: o for o in method.options}
    given = {k: v for k, v in given.items() if v is not None}
    for key in given:
        if key not in own:
            takers = sorted(n for n, m in METHODS.items() if key in {o.name for o in m.options})
            takes = ", ".join(sorted(own)) or "no method options"
            raise ValueError(f"option {key} is not taken by method {name!r} (it takes {takes}); "
                             f"{key} is an option of {', '.join(repr(t) for t in takers) or 'no method'}")
    return {o.name: o.check(given[o.name]) if o.name in given else o.default for o in method.options}


def get_selector(name: str) -> Callable[..., np.ndarray]:
    """The selector called `name`: f(features, relevance=None, budget=64, **options) -> int64 [m] ascending.

    Each selector ignores the options it does not take (tau / backend are coverpruner's, seed random's, pivots
    dart's, relevance_weight cdpruner's); the runtime refuses another method's option first (method_options).
    """
    return get_method(name).select
