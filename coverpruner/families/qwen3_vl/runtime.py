"""Qwen3-VL's run-time rules (numpy only): those of every family on the Qwen3-VL vision tower
(qwen3_vision_base.Qwen3VisionRuntime: dynamic resolution at 32 px per visual token, host-side position-grid
interpolation tables, native M-RoPE positions, videos as timestamped temporal patches), with each merger output's
DeepStack rows as decoder extras (the manifest's dims.deepstack_levels)."""

from __future__ import annotations

from coverpruner.families.qwen3_vision_base import IMAGE_TOKEN, Qwen3VisionRuntime, extra_names

__all__ = ["IMAGE_TOKEN", "Qwen3VLRuntime", "extra_names"]


class Qwen3VLRuntime(Qwen3VisionRuntime):
    """contract.FamilyRuntime for a Qwen3-VL engine dir (its DeepStack extras: Qwen3VisionRuntime.extras)."""
