"""Qwen3-VL and Qwen3.5 image preprocessing: transformers' Qwen2-VL image processor (families/qwen_vl.py, shared
with Qwen2.5-VL) as the Qwen3-VL and Qwen3.5 checkpoints configure it: 16-px patches, merge 2 (one visual token
per 32x32 px, so smart resize at 32 px), mean = std = 0.5 -> patches [N, C*T*P*P] = [N, 1536], grid_thw = (1, H/16, W/16).
"""

from __future__ import annotations

from dataclasses import dataclass

from coverpruner.families.qwen_vl import QwenImageSettings


@dataclass(frozen=True)
class Qwen3ImageSettings(QwenImageSettings):
    """QwenImageSettings with the Qwen3-VL Instruct checkpoints' preprocessor_config.json values as defaults (a
    checkpoint's own file overrides them: QwenImageSettings.from_dict)."""

    min_pixels: int = 65536
    max_pixels: int = 16777216
    patch_size: int = 16
    image_mean: tuple = (0.5, 0.5, 0.5)
    image_std: tuple = (0.5, 0.5, 0.5)
