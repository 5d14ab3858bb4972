"""Session fixtures for the Qwen2.5-VL tests (loaded by tests/conftest.py): one tiny random checkpoint, sample images.

`qwen_checkpoint` -> Path of a `qwen2.5-vl-tiny` checkpoint (window attention over 3x3 merged patches,
full-attention blocks 1 and 3, GQA 4/2 heads, q/k/v bias, mrope_section [2, 3, 3]); built once (~5 s).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

@pytest.fixture(scope="session")
def qwen_checkpoint(builds) -> Path:
    return builds.checkpoint("qwen2.5-vl-tiny")


def sample_image(seed: int = 0, size=(200, 240)):
    """A smooth random RGB image (gradients + blobs), (H, W) = size, so visual tokens differ but correlate."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    h, w = size
    yy, xx = np.mgrid[0:h, 0:w]
    y, x = yy / max(h, w), xx / max(h, w)
    img = np.stack([np.sin(6 * x + rng.random() * 6), np.cos(5 * y + rng.random() * 6), x * y], -1)
    for _ in range(6):
        cy, cx, r = rng.random() * h, rng.random() * w, 10 + rng.random() * 30
        img[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = rng.random(3)
    img = (img - img.min()) / (img.max() - img.min())
    return Image.fromarray((img * 255).astype(np.uint8))


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
    from tokenizers import Tokenizer

    from coverpruner.engine_dir import load_manifest
    from coverpruner.families import get_family

    manifest = load_manifest(engine_dir)
    rt = get_family("qwen2_5_vl").runtime(manifest)
    vision = rt.prepare_image(image, options or {})
    tok = Tokenizer.from_file(str(Path(engine_dir) / "tokenizer.json"))
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    layout = rt.conversation_layout(tok, messages, [vision.num_candidates])
    return vision, layout, rt.native_positions(layout, [vision])
