"""Shared session fixtures: one tiny random LLaVA checkpoint and its fp32 engine dir, built once per run.

`tiny_checkpoint` -> Path of a llava-hf-format checkpoint (preset "tiny": 144 visual tokens, Llama with
GQA 4 heads / 2 kv heads, 2 layers, hidden 64, locally trained BPE tokenizer).
`tiny_export` -> Path of its engine dir (fp32; all five graphs; manifest.json).
Both take a few seconds and are reused by the export and runtime tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    pytest.importorskip("transformers", reason="building a checkpoint needs transformers (export extra)")
    from coverpruner.testing.checkpoints import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("tiny_checkpoint"), preset="tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_export(tiny_checkpoint, tmp_path_factory) -> Path:
    from coverpruner.export.exporter import ExportOptions, export_model

    out = tmp_path_factory.mktemp("tiny_export")
    export_model(tiny_checkpoint, out, "tiny", ExportOptions(dtype="fp32", progress=False))
    return out


@pytest.fixture(scope="session")
def trt_rtx():
    """TensorRT-RTX (builds engines without a GPU); skips with what to install when it is missing."""
    from tests.trt_plans import load_trt_rtx

    return load_trt_rtx()
