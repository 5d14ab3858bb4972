"""Session fixtures for the Qwen3.5 tests (loaded by tests/conftest.py): one tiny random checkpoint and its HF model.
`qwen35_checkpoint` -> Path of a `qwen3.5-tiny` checkpoint (the Qwen3-VL tiny tower without DeepStack; 4 decoder
layers: 3 Gated DeltaNet + 1 gated full attention with q/k norm, GQA 4/2 heads of 64, partial rotary 16 dims with
interleaved mrope_section [2, 3, 3]); its engine dirs in both decoder forms; built once per run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.families.qwen_common import our_request as qwen_request

PRESET = "qwen3.5-tiny"


@pytest.fixture(scope="session")
def qwen35_checkpoint(builds) -> Path:
    return builds.checkpoint(PRESET)


@pytest.fixture(scope="session")
def qwen35_hf(qwen35_checkpoint):
    """HF model, eager attention (output_attentions needs it), float32."""
    from tests.families.qwen3_5.hf_reference import hf_model  # noqa: PLC0415

    return hf_model(str(qwen35_checkpoint))


@pytest.fixture(scope="session")
def qwen35_export(builds) -> Path:
    """fp32 engine dir of the tiny checkpoint, standard-form decoder (HF's modules; what TensorRT builds)."""
    return builds.export(PRESET)


@pytest.fixture(scope="session")
def qwen35_export_ort(builds) -> Path:
    """fp32 engine dir of the tiny checkpoint, ORT-form decoder (in-place KV and states, batching)."""
    return builds.export(PRESET, "ort")


def our_request(engine_dir: Path, image, prompt: str, options: dict | None = None):
    """The family runtime's view of one request: (VisionInputs, ConversationLayout, native positions int64 [3, L])."""
    return qwen_request("qwen3_5", engine_dir, image, prompt, options)
