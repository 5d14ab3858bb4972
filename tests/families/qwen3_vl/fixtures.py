"""Session fixtures for the Qwen3-VL tests (loaded by tests/conftest.py): one tiny random checkpoint and its HF
model. `qwen3_checkpoint` -> Path of a `qwen3-vl-tiny` checkpoint (3 vision blocks, DeepStack after blocks 0 and 1,
2 decoder layers with q/k norm, GQA 4/2 heads, interleaved mrope_section [2, 3, 3]); built once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


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


def our_request(engine_dir: Path, image, prompt: str):
    """The family runtime's view of one request: (VisionInputs, ConversationLayout, native positions int64 [3, L])."""
    from tokenizers import Tokenizer

    from coverpruner.engine_dir import load_manifest
    from coverpruner.families import get_family

    rt = get_family("qwen3_vl").runtime(load_manifest(engine_dir))
    vision = rt.prepare_image(image, {})
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    layout = rt.conversation_layout(Tokenizer.from_file(str(Path(engine_dir) / "tokenizer.json")), messages,
                                    [vision.num_candidates])
    return vision, layout, rt.native_positions(layout, vision)
