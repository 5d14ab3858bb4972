"""The one check of every numeric request option, shared by coverpruner-run, the server's schema and
``Pipeline.generate`` / ``stream``: right type (an int is not a bool or a float; a number is not a string),
finite, in range. Each failure is an OptionError whose one-line message names the option and says what was
expected and what came.

Bounds, and why:
- tau (demand temperature): weights are exp(tau * minmax(r)) with r scaled to [0, 1]; float32 overflows at
  tau > 88.7 and the greedy sums up to n weights, so tau <= TAU_MAX = 64 keeps e^64 * 10^6 candidates
  (~6e33) below float32's 3.4e38. Negative tau would favour the tokens the prompt ignores: refused.
- budget: 1 .. MAX_BUDGET (a budget >= the image's candidates keeps them all, so larger values mean nothing
  and an unbounded int overflowed the int64 feed of selector.onnx).
- seed: 0 .. 2**63 - 1 (numpy's generator refuses negatives; int64 bound for any backend).
- max_new_tokens: 1 .. MAX_NEW_TOKENS (the context ends decoding long before).
- temperature: finite, >= 0; top_p: finite, in (0, 1].
- method options (coverpruner.selection's declarations: dart's pivots, cdpruner's relevance_weight): each
  method's own check; an option of another method is refused by name (check_method_options).
"""

from __future__ import annotations

import math
import numbers

from coverpruner.runtime.errors import OptionError
from coverpruner.selection import METHOD_OPTIONS, METHODS, method_options

TAU_MAX = 64.0
MAX_BUDGET = 2 ** 31 - 1
MAX_SEED = 2 ** 63 - 1
MAX_NEW_TOKENS = 2 ** 31 - 1


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_int(name: str, value, lo: int, hi: int) -> int:
    """An integer in [lo, hi] (not a bool, not a float, not a string) -> int."""
    if not _is_int(value) or not lo <= value <= hi:
        raise OptionError(f"{name} must be an integer in {lo}..{hi}, got {value!r}")
    return int(value)


def check_float(name: str, value, lo: float, hi: float, lo_open: bool = False) -> float:
    """A finite real number in [lo, hi] ((lo, hi] with lo_open) -> float."""
    ok = _is_number(value) and math.isfinite(value) and (lo < value if lo_open else lo <= value) and value <= hi
    if not ok:
        rng = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise OptionError(f"{name} must be a finite number in {rng}, got {value!r}")
    return float(value)


def check_tau(tau) -> float:
    return check_float("tau", tau, 0.0, TAU_MAX)


def check_seed(seed) -> int | None:
    return None if seed is None else check_int("seed", seed, 0, MAX_SEED)


def check_max_new_tokens(value) -> int:
    return check_int("max_new_tokens", value, 1, MAX_NEW_TOKENS)


def check_temperature(value) -> float:
    return check_float("temperature", value, 0.0, 1e6)  # any finite temperature >= 0; 1e6 is already uniform


def check_top_p(value) -> float:
    return check_float("top_p", value, 0.0, 1.0, lo_open=True)


def check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise OptionError(f"{name} must be true or false, got {value!r}")
    return value


def parse_budget(budget) -> int | None:
    """None / "full" -> None (no pruning); an integer in 1..MAX_BUDGET (or its decimal string) -> int; anything
    else (bools, floats, "1e3", out of range) -> OptionError."""
    if budget is None or (isinstance(budget, str) and budget.strip().lower() == "full"):
        return None
    value = budget
    if isinstance(budget, str) and budget.strip().isdigit():
        value = int(budget.strip())
    if not _is_int(value) or not 1 <= value <= MAX_BUDGET:
        raise OptionError(f"budget must be a positive integer or 'full', got {budget!r} (integers 1..{MAX_BUDGET})")
    return int(value)


def split_method_options(options: dict) -> tuple[dict, dict]:
    """Request keywords -> (family options, method options): the names some selection method declares
    (coverpruner.selection.METHOD_OPTIONS) go to the second dict."""
    return ({k: v for k, v in options.items() if k not in METHOD_OPTIONS},
            {k: v for k, v in options.items() if k in METHOD_OPTIONS})


def check_method_options(method: str, given: dict) -> dict:
    """The method options of ``method``: given values (checked) over its declared defaults -> {name: value}.
    OptionError (one line) for an option the method does not take or a bad value; {} for an unknown method
    (refused where it prunes)."""
    if method not in METHODS:
        return {}
    try:
        return method_options(method, given)
    except ValueError as exc:
        raise OptionError(str(exc)) from None
