"""LLaVA-NeXT: the adapter (family.py, export time), its run-time rules (runtime.py) and the anyres
preprocessing and packing (anyres.py), numpy only."""

from coverpruner.families.contract import FamilyEntry
from coverpruner.families.llava_next.family import LlavaNextFamily
from coverpruner.families.llava_next.runtime import NEWLINE_OPTION, LlavaNextRuntime, panels

# Found by the registry (families/__init__.py): adapter, HF model types, coverpruner-export aliases.
FAMILY = FamilyEntry("coverpruner.families.llava_next:LlavaNextFamily", ("llava_next",), {
    "llava-next-7b": "llava-hf/llava-v1.6-vicuna-7b-hf",
    "llava-next-13b": "llava-hf/llava-v1.6-vicuna-13b-hf",
})

__all__ = ["FAMILY", "LlavaNextFamily", "LlavaNextRuntime", "NEWLINE_OPTION", "panels"]
