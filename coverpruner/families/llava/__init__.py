"""LLaVA-1.5: the adapter (family.py, export time) and its run-time rules (runtime.py, numpy only)."""

from coverpruner.families.llava.family import LlavaFamily
from coverpruner.families.llava.runtime import IMAGE_TOKEN, LlavaRuntime

__all__ = ["IMAGE_TOKEN", "LlavaFamily", "LlavaRuntime"]
