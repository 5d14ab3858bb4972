"""TensorRT-RTX parses and builds every Qwen2.5-VL graph of the engine dir (coverpruner-build's path) with
dynamic patch / window / visual-token / sequence axes, profiles from the manifest's family axes."""

import json
import shutil

import pytest

from coverpruner.engines.tensorrt import BuildOptions, build_engine_dir
from tests.trt_plans import is_trt_rtx_plan

pytestmark = [pytest.mark.tensorrt, pytest.mark.slow]


def test_every_graph_builds_with_dynamic_axes(trt_rtx, qwen_export, tmp_path):
    engine_dir = tmp_path / "engine_dir"
    shutil.copytree(qwen_export, engine_dir)
    manifest = json.loads((engine_dir / "manifest.json").read_text())
    vision_axes = {a for spec in manifest["graphs"]["vision"]["inputs"] for a in spec["shape"] if isinstance(a, str)}
    assert vision_axes == {"num_patches", "num_visual", "num_windows", "window_slots"}
    section = build_engine_dir(engine_dir, BuildOptions(budgets=(16, 64), max_context=512), trt_rtx)
    assert set(section["engines"]) == set(manifest["graphs"]) == {"vision", "embed", "probe", "selector", "decoder"}
    vision = section["engines"]["vision"]["profile"]
    # tiny preset: up to 160 visual tokens = 640 patches; windows of 3x3 merged tokens = 36 patches
    assert vision["pixel_values"]["max"] == [640, 1176] and vision["window_gather"]["max"] == [160, 36]
    assert section["engines"]["decoder"]["profile"]["position_ids"]["max"] == [3, 1, 512]
    for rec in section["engines"].values():
        assert is_trt_rtx_plan(engine_dir / rec["file"])
