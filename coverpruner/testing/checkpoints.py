"""Write a random-weight checkpoint of any preset (testing/presets.py) with its family's writer.

`write_checkpoint(output, preset="tiny", layers=None, seed=0, vision_layers=None)` is what tests, demos and
benchmarks call; each preset row names its writer (testing/<family>_checkpoints.py), imported when needed.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

from coverpruner.testing.presets import PRESETS

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
    module, func = PRESETS[preset].writer.split(":")
    writer = getattr(importlib.import_module(module), func)
    kwargs = {"layers": layers, "seed": seed}
    if "vision_layers" in inspect.signature(writer).parameters:
        kwargs["vision_layers"] = vision_layers
    elif vision_layers is not None:
        raise ValueError(f"--vision-layers is only supported for the LLaVA-NeXT presets (writers that take "
                         f"vision_layers), not {preset!r}")
    return writer(output, preset=preset, **kwargs)
