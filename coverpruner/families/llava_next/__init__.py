"""LLaVA-NeXT: the adapter (family.py, export time), its run-time rules (runtime.py) and the anyres
preprocessing and packing (anyres.py), numpy only."""

from coverpruner.families.llava_next.family import LlavaNextFamily
from coverpruner.families.llava_next.runtime import NEWLINE_OPTION, LlavaNextRuntime, panels

__all__ = ["LlavaNextFamily", "LlavaNextRuntime", "NEWLINE_OPTION", "panels"]
