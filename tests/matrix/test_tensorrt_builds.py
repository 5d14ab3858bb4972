"""TensorRT-RTX builds an engine for every exported graph of every family's tiny engine dir (no GPU needed),
through coverpruner-build (profiles from the manifest's generic and family axes); the family's own profile facts
are checked by tests/families/<family>/matrix.py:check_trt_profiles."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from tests.trt_plans import is_trt_rtx_plan

pytestmark = [pytest.mark.tensorrt, pytest.mark.slow]
GRAPHS = {"vision", "embed", "probe", "selector", "selector_dart", "selector_cdpruner", "decoder"}


def test_every_graph_builds(trt_rtx, family, tmp_path, monkeypatch):
    from coverpruner.engines import build_cli

    work = tmp_path / "engine_dir"
    shutil.copytree(family.export, work)  # building writes engines and the manifest: a private copy
    manifest = json.loads((work / "manifest.json").read_text())
    assert set(manifest["graphs"]) == GRAPHS
    assert manifest.get("selector_form", "loop") == "loop"
    if family.form == "ort":  # TensorRT cannot parse the contrib ops: refused in one line, nothing written
        with pytest.raises(SystemExit) as info:
            build_cli.main([str(work), "--backend", "tensorrt", "--flavour", "tensorrt_rtx",
                            *family.facts.TRT_BUILD_ARGS])
        assert info.value.code == 2
        assert json.loads((work / "manifest.json").read_text()) == manifest
        return
    returned = []
    real_build = build_cli.build_engine_dir
    monkeypatch.setattr(build_cli, "build_engine_dir", lambda *a, **k: returned.append(real_build(*a, **k))
                        or returned[-1])
    # the command users run: coverpruner-build DIR --backend tensorrt
    assert build_cli.main([str(work), "--backend", "tensorrt", "--flavour", "tensorrt_rtx",
                           *family.facts.TRT_BUILD_ARGS]) == 0
    (section,) = returned
    assert set(section["engines"]) == GRAPHS
    assert section["flavour"] == "tensorrt_rtx" and section["version"] == trt_rtx.version
    written = json.loads((work / "manifest.json").read_text())
    assert written["tensorrt"] == section
    assert written["graphs"] == manifest["graphs"]  # the export's own fields are untouched
    for graph, rec in section["engines"].items():
        blob = (work / rec["file"]).read_bytes()
        assert is_trt_rtx_plan(blob), (graph, blob[:24])
        assert hashlib.sha256(blob).hexdigest() == rec["sha256"]
    n, hidden = manifest["visual"]["max_visual_tokens"], manifest["dims"]["hidden_size"]
    assert section["engines"]["probe"]["profile"]["visual_positions"] == {"min": [1], "opt": [n], "max": [n]}
    for graph in ("selector", "selector_dart", "selector_cdpruner"):  # every selector graph takes the budgets
        sel = section["engines"][graph]
        assert sel["shape_inputs"] == {"budget": {"min": [16], "opt": [16], "max": [64]}}, graph
        assert sel["profile"]["image_features"]["max"] == [n, hidden], graph
    family.facts.check_trt_profiles(section, manifest)
