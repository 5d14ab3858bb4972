"""Qwen3-VL: the adapter (family.py, export time), its run-time rules (runtime.py), its preprocessor defaults
(preprocess.py), video sampling and timestamps (video.py), the vision graph's host tables (vision.py), all numpy; the
export-time torch vision wrapper (graphs.py). DeepStack levels are decoder extras (contract v4). Image preprocessing
and M-RoPE positions are shared with Qwen2.5-VL (families/qwen_vl.py)."""

from coverpruner.families.contract import FamilyEntry
from coverpruner.families.qwen3_vl.family import Qwen3VLFamily
from coverpruner.families.qwen3_vl.runtime import IMAGE_TOKEN, Qwen3VLRuntime

# Found by the registry (families/__init__.py): adapter, HF model types, coverpruner-export aliases.
FAMILY = FamilyEntry("coverpruner.families.qwen3_vl:Qwen3VLFamily", ("qwen3_vl",), {
    "qwen3-vl-8b": "Qwen/Qwen3-VL-8B-Instruct",
    "qwen3-vl-4b": "Qwen/Qwen3-VL-4B-Instruct",
    "qwen3-vl-2b": "Qwen/Qwen3-VL-2B-Instruct",
})

__all__ = ["FAMILY", "IMAGE_TOKEN", "Qwen3VLFamily", "Qwen3VLRuntime"]
