"""Write a random-weight checkpoint of any preset (testing/presets.py) with its family's writer.

`write_checkpoint(output, preset="tiny", layers=None, seed=0, vision_layers=None)` is what tests, demos and
benchmarks call; the writers live in testing/<family>_checkpoints.py and are imported when needed.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from coverpruner.testing.presets import PRESETS

# family (registry name) -> "module:function" of its checkpoint writer
WRITERS = {
    "llava": "coverpruner.testing.llava_checkpoints:write_llava_checkpoint",
    "llava_next": "coverpruner.testing.llava_next_checkpoints:write_next_checkpoint",
    "qwen2_5_vl": "coverpruner.testing.qwen_checkpoints:write_qwen_checkpoint",
}
VISION_LAYER_FAMILIES = ("llava_next",)  # writers that take vision_layers


def all_presets() -> list[str]:
    """Every preset the CLI can write (LLaVA-1.5, LLaVA-NeXT and Qwen2.5-VL)."""
    return sorted(PRESETS)


def write_checkpoint(output: str | Path, preset: str = "tiny", layers: int | None = None, seed: int = 0,
                     vision_layers: int | None = None) -> Path:
    """Write a random-weight checkpoint of `preset` into `output`; returns the directory.

    `layers` overrides the number of decoder layers, `vision_layers` the CLIP layers (LLaVA-NeXT presets).
    Weights are deterministic for a given seed. ValueError (one line) for an unknown preset or option.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; expected one of {all_presets()}")
    family = PRESETS[preset].family
    kwargs = {"layers": layers, "seed": seed}
    if family in VISION_LAYER_FAMILIES:
        kwargs["vision_layers"] = vision_layers
    elif vision_layers is not None:
        raise ValueError(f"--vision-layers is only supported for the LLaVA-NeXT presets, not {preset!r}")
    module, func = WRITERS[family].split(":")
    return getattr(importlib.import_module(module), func)(output, preset=preset, **kwargs)
