"""Session fixtures for the LLaVA-NeXT family (a plugin of tests/conftest.py): the tiny random checkpoint, its HF
model and processor.

`next_checkpoint` -> llava-hf-format LLaVA-NeXT checkpoint (preset "llava-next-tiny": 84-px tiles of
6x6 patches, pinpoints 1x2/2x1/2x2/3x1/1x3 tiles, Llama GQA 4/2 heads, hidden 64, local BPE tokenizer).
`next_export` -> its fp32 engine dir (export takes about a minute on 2 busy cores: built once per session);
`next_pipe` -> Pipeline.load of it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

# (width, height): square, portrait, landscape, smaller than a tile, 1 px, extreme aspect ratios.
IMAGE_SIZES = [(200, 240), (300, 420), (500, 120), (84, 84), (20, 30), (1, 1), (10000, 50), (50, 10000)]


@pytest.fixture(scope="session")
def next_checkpoint(builds) -> Path:
    return builds.checkpoint("llava-next-tiny")


@pytest.fixture(scope="session")
def next_processor(next_checkpoint):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(str(next_checkpoint))


@pytest.fixture(scope="session")
def next_hf_model(next_checkpoint):
    """HF model with its default (sdpa) attention: an independent reference for the eager export."""
    from transformers import LlavaNextForConditionalGeneration

    return LlavaNextForConditionalGeneration.from_pretrained(str(next_checkpoint)).eval()


@pytest.fixture(scope="session")
def next_eager_model(next_checkpoint):
    """The HF model with eager attention (output_attentions for the layer-0 demand reference)."""
    from transformers import LlavaNextForConditionalGeneration

    return LlavaNextForConditionalGeneration.from_pretrained(str(next_checkpoint), attn_implementation="eager").eval()


@pytest.fixture(scope="session")
def next_export(builds) -> Path:
    """fp32 engine dir of the tiny NeXT checkpoint (all graphs, manifest v2, image_newline.npy)."""
    return builds.export("llava-next-tiny")


@pytest.fixture(scope="session")
def next_pipe(next_export):
    from coverpruner.runtime import Pipeline

    return Pipeline.load(next_export)


@pytest.fixture(scope="session")
def next_settings(next_checkpoint):
    from coverpruner.families import get_family
    from coverpruner.families.llava_next.anyres import AnyresSettings

    return AnyresSettings.from_dict(get_family("llava_next").processor_settings(next_checkpoint))


def smooth_image(width: int, height: int, seed: int = 0):
    """A smooth random RGB PIL image (gradients + blobs): correlated but distinct patches."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width] / max(height, width)
    img = np.stack([np.sin(6 * x + rng.random() * 6), np.cos(5 * y + rng.random() * 6), x * y], -1)
    for _ in range(6):
        cy, cx, r = rng.random() * height, rng.random() * width, 0.05 + rng.random() * 0.2
        img[((y - cy / max(height, width)) ** 2 + (x - cx / max(height, width)) ** 2) < r * r] = rng.random(3)
    img = (img - img.min()) / max(img.max() - img.min(), 1e-9)
    return Image.fromarray((img * 255).astype(np.uint8))
