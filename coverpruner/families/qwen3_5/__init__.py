"""Qwen3.5 (dense 0.8B-9B): the Qwen3-VL vision tower without DeepStack before a hybrid decoder of Gated DeltaNet and
gated full-attention layers. The adapter (family.py, export time), its run-time rules (runtime.py, numpy); the tower,
preprocessing, positions and video are shared with Qwen3-VL (families/qwen3_vision_base.py), the hybrid decoder's
export helpers with any Gated DeltaNet decoder (families/gated_delta.py)."""

from coverpruner.families.contract import FamilyEntry
from coverpruner.families.qwen3_5.family import Qwen35Family
from coverpruner.families.qwen3_5.runtime import Qwen35Runtime

# Found by the registry (families/__init__.py): adapter, HF model types, coverpruner-export aliases.
FAMILY = FamilyEntry("coverpruner.families.qwen3_5:Qwen35Family", ("qwen3_5",), {
    "qwen3.5-0.8b": "Qwen/Qwen3.5-0.8B",
    "qwen3.5-2b": "Qwen/Qwen3.5-2B",
    "qwen3.5-4b": "Qwen/Qwen3.5-4B",
    "qwen3.5-9b": "Qwen/Qwen3.5-9B",
})

__all__ = ["FAMILY", "Qwen35Family", "Qwen35Runtime"]
