"""TensorRT-RTX parses and builds every LLaVA-NeXT graph (no GPU needed), the vision engine over 1-5 tiles."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.trt_plans import is_trt_rtx_plan

pytestmark = [pytest.mark.tensorrt, pytest.mark.slow]


def test_every_next_graph_builds_with_the_tile_axis(trt_rtx, next_export, tmp_path):
    from coverpruner.engines.build_cli import main as build_main

    work = tmp_path / "engine_dir"
    shutil.copytree(next_export, work)
    # the CLI users run: coverpruner-build DIR --backend tensorrt (profiles from the manifest's axes)
    assert build_main([str(work), "--backend", "tensorrt", "--flavour", "tensorrt_rtx", "--budgets", "16,64",
                       "--max-context", "256"]) == 0
    manifest = json.loads((work / "manifest.json").read_text())
    engines = manifest["tensorrt"]["engines"]
    assert set(engines) == set(manifest["graphs"]) == {"vision", "embed", "probe", "selector", "decoder"}
    for rec in engines.values():
        assert is_trt_rtx_plan(work / rec["file"])
    assert engines["vision"]["profile"]["pixel_values"] == {"min": [1, 3, 84, 84], "opt": [5, 3, 84, 84],
                                                            "max": [5, 3, 84, 84]}
    n = manifest["visual"]["max_visual_tokens"]
    assert n == 180 and engines["probe"]["profile"]["visual_positions"]["max"] == [n]
    assert engines["selector"]["profile"]["image_features"]["max"][0] == n
