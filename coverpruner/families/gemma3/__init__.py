"""Gemma 3: the adapter (family.py, export time), its run-time rules (runtime.py) and the Gemma3ImageProcessor
preprocessing with pan-and-scan (preprocess.py), numpy only."""

from coverpruner.families.contract import FamilyEntry
from coverpruner.families.gemma3.family import Gemma3Family
from coverpruner.families.gemma3.runtime import PAN_AND_SCAN_OPTION, Gemma3Runtime

# Found by the registry (families/__init__.py): adapter, HF model types, coverpruner-export aliases.
FAMILY = FamilyEntry("coverpruner.families.gemma3:Gemma3Family", ("gemma3",), {
    "gemma-3-4b": "google/gemma-3-4b-it",
    "gemma-3-12b": "google/gemma-3-12b-it",
    "gemma-3-27b": "google/gemma-3-27b-it",
})

__all__ = ["FAMILY", "Gemma3Family", "Gemma3Runtime", "PAN_AND_SCAN_OPTION"]
