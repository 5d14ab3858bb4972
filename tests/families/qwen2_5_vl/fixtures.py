"""Session fixtures for the Qwen2.5-VL tests (loaded by tests/conftest.py): one tiny random checkpoint, sample images.

`qwen_checkpoint` -> Path of a `qwen2.5-vl-tiny` checkpoint (window attention over 3x3 merged patches,
full-attention blocks 1 and 3, GQA 4/2 heads, q/k/v bias, mrope_section [2, 3, 3]); built once (~5 s).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.families.qwen_common import our_request as qwen_request
from tests.families.qwen_common import sample_image  # noqa: F401  (imported from here by the family's tests)


@pytest.fixture(scope="session")
def qwen_checkpoint(builds) -> Path:
    return builds.checkpoint("qwen2.5-vl-tiny")


@pytest.fixture(scope="session")
def qwen_hf(qwen_checkpoint):
    """HF model, eager attention (output_attentions under sdpa returns nothing), float32."""
    from tests.families.qwen2_5_vl.hf_qwen import hf_model  # noqa: PLC0415

    return hf_model(str(qwen_checkpoint), "eager")


@pytest.fixture(scope="session")
def qwen_export(builds) -> Path:
    """fp32 engine dir of the tiny checkpoint (all five graphs + manifest), through the real exporter."""
    return builds.export("qwen2.5-vl-tiny")


def ort_session(path: Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def our_request(engine_dir: Path, image, prompt: str, options: dict | None = None):
    """The family runtime's view of one request: (VisionInputs, ConversationLayout, native positions int64 [3, L])."""
    return qwen_request("qwen2_5_vl", engine_dir, image, prompt, options)
