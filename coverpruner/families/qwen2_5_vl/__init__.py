"""Qwen2.5-VL: the adapter (family.py, export time), its run-time rules (runtime.py), video sampling (video.py), the
vision graph's window tables (vision.py), all numpy; the export-time torch vision wrapper (graphs.py, imports
torch). Image preprocessing and M-RoPE positions are shared with Qwen3-VL (families/qwen_vl.py)."""

from coverpruner.families.contract import FamilyEntry
from coverpruner.families.qwen2_5_vl.family import Qwen25VLFamily
from coverpruner.families.qwen2_5_vl.runtime import IMAGE_TOKEN, QwenRuntime

# Found by the registry (families/__init__.py): adapter, HF model types, coverpruner-export aliases.
FAMILY = FamilyEntry("coverpruner.families.qwen2_5_vl:Qwen25VLFamily", ("qwen2_5_vl",), {
    "qwen2.5-vl-7b": "Qwen/Qwen2.5-VL-7B-Instruct",
    "qwen2.5-vl-3b": "Qwen/Qwen2.5-VL-3B-Instruct",
})

__all__ = ["FAMILY", "IMAGE_TOKEN", "Qwen25VLFamily", "QwenRuntime"]
