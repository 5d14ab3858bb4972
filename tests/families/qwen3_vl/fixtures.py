"""Session fixtures for the Qwen3-VL tests (loaded by tests/conftest.py): one tiny random checkpoint and its HF
model. `qwen3_checkpoint` -> Path of a `qwen3-vl-tiny` checkpoint (3 vision blocks, DeepStack after blocks 0 and 1,
2 decoder layers with q/k norm, GQA 4/2 heads, interleaved mrope_section [2, 3, 3]); built once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.families.qwen_common import our_request as qwen_request
from tests.families.qwen_common import sample_image  # noqa: F401  (imported from here by the family's tests)


@pytest.fixture(scope="session")
def qwen3_checkpoint(builds) -> Path:
    return builds.checkpoint("qwen3-vl-tiny")


@pytest.fixture(scope="session")
def qwen3_hf(qwen3_checkpoint):
    """HF model, eager attention (output_attentions needs it), float32."""
    from tests.families.qwen3_vl.hf_qwen3 import hf_model  # noqa: PLC0415

    return hf_model(str(qwen3_checkpoint))


@pytest.fixture(scope="session")
def qwen3_export(builds) -> Path:
    """fp32 engine dir of the tiny checkpoint (all graphs + manifest), through the real exporter."""
    return builds.export("qwen3-vl-tiny")


def our_request(engine_dir: Path, image, prompt: str, options: dict | None = None):
    """The family runtime's view of one request: (VisionInputs, ConversationLayout, native positions int64 [3, L])."""
    return qwen_request("qwen3_vl", engine_dir, image, prompt, options)
