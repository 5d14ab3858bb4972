"""Qwen2.5-VL's facts for the family matrix (tests/matrix/): what the generic tests ask of this family."""

from __future__ import annotations

TRT_BUILD_ARGS = ["--budgets", "16,64", "--max-context", "512"]


def check_trt_profiles(section: dict, manifest: dict) -> None:
    """Dynamic patch / window / visual-token axes (the manifest's family axes) and 3-row M-RoPE positions."""
    vision_axes = {a for spec in manifest["graphs"]["vision"]["inputs"] for a in spec["shape"] if isinstance(a, str)}
    assert vision_axes == {"num_patches", "num_visual", "num_windows", "window_slots"}
    vision = section["engines"]["vision"]["profile"]
    # tiny preset: up to 160 visual tokens = 640 patches; windows of 3x3 merged tokens = 36 patches
    assert vision["pixel_values"]["max"] == [640, 1176] and vision["window_gather"]["max"] == [160, 36]
    assert section["engines"]["decoder"]["profile"]["position_ids"]["max"] == [3, 1, 512]
