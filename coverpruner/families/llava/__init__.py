"""LLaVA-1.5: the adapter (family.py, export time) and its run-time rules (runtime.py, numpy only)."""

from coverpruner.families.contract import FamilyEntry
from coverpruner.families.llava.family import LlavaFamily
from coverpruner.families.llava.runtime import IMAGE_TOKEN, LlavaRuntime

# Found by the registry (families/__init__.py): adapter, HF model types, coverpruner-export aliases.
FAMILY = FamilyEntry("coverpruner.families.llava:LlavaFamily", ("llava",), {
    "llava-1.5-7b": "llava-hf/llava-1.5-7b-hf",
    "llava-1.5-13b": "llava-hf/llava-1.5-13b-hf",
})

__all__ = ["FAMILY", "IMAGE_TOKEN", "LlavaFamily", "LlavaRuntime"]
