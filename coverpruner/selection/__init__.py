"""The method: coverage utilities, demand weights, greedy selection (numpy, torch), baselines, the peers' DART
and CDPruner, the registry (each method's selector, whether it reads the probe, its options), selection inside
temporal windows.

No model code here; torch is imported only by the torch backend, on first use.
"""

from .baselines import attention_select, divprune_select, random_select, uniform_select
from .cdpruner import cdpruner_select
from .coverage import coverage_utilities, demand_weights, greedy_incremental, greedy_reference
from .dart import dart_select
from .registry import (BACKENDS, METHOD_OPTIONS, METHODS, SELECTORS, coverage_select, get_method, get_selector,
                       method_options, uses_relevance)
from .windowed import select_in_windows

__all__ = [
    "BACKENDS", "METHODS", "METHOD_OPTIONS", "SELECTORS", "attention_select", "cdpruner_select", "coverage_select",
    "coverage_utilities", "dart_select", "demand_weights", "divprune_select", "get_method", "get_selector",
    "method_options", "uses_relevance", "greedy_incremental", "greedy_reference", "random_select",
    "select_in_windows", "uniform_select",
]
