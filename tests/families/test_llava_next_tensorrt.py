"""TensorRT-RTX parses and builds every LLaVA-NeXT graph (no GPU needed), the vision engine over 1-5 tiles."""

from __future__ import annotations

import json
import shutil

import pytest

pytestmark = [pytest.mark.tensorrt, pytest.mark.slow]


@pytest.fixture(scope="module")
def trt_rtx():
    pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX python bindings are not installed "
                                               "(pip install tensorrt-rtx-cu13 tensorrt-rtx-cu13-libs "
                                               "tensorrt-rtx-cu13-bindings)")
    from coverpruner.engines.tensorrt import load_tensorrt

    return load_tensorrt("tensorrt_rtx")


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
        assert (work / rec["file"]).stat().st_size > 1000
    assert engines["vision"]["profile"]["pixel_values"] == {"min": [1, 3, 84, 84], "opt": [5, 3, 84, 84],
                                                            "max": [5, 3, 84, 84]}
    n = manifest["visual"]["max_visual_tokens"]
    assert n == 180 and engines["probe"]["profile"]["visual_positions"]["max"] == [n]
    assert engines["selector"]["profile"]["image_features"]["max"][0] == n
