"""Qwen2.5-VL: the adapter (family.py, export time), its run-time rules (runtime.py), preprocessing
(preprocess.py: smart resize, patchify), the vision graph's host tables (vision.py), M-RoPE positions
(positions.py), all numpy; the export-time torch vision wrapper (graphs.py, imports torch)."""

from coverpruner.families.qwen2_5_vl.family import IMAGE_SIZE_OPTION, Qwen25VLFamily
from coverpruner.families.qwen2_5_vl.runtime import IMAGE_TOKEN, QwenRuntime

__all__ = ["IMAGE_SIZE_OPTION", "IMAGE_TOKEN", "Qwen25VLFamily", "QwenRuntime"]
