"""Session fixtures for the conversation references: the three tiny checkpoints with their HF processor and
eager float32 model (`hf_family(name)`), sample images of different sizes and conversations.

The checkpoints are tests/conftest.py's Builds of coverpruner.testing's tiny presets (fixtures only);
everything the references compute comes from transformers (tests/conversations/reference.py).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers", reason="the conversation references run the HF models")

PRESETS = {"llava": "tiny", "llava_next": "llava-next-tiny", "qwen2_5_vl": "qwen2.5-vl-tiny"}


@pytest.fixture(scope="session")
def conv_checkpoints(builds):
    """name -> Path of the family's tiny checkpoint (tests/conftest.py Builds: the one the matrix exports)."""
    return lambda name: builds.checkpoint(PRESETS[name])


@pytest.fixture(scope="session")
def hf_family(conv_checkpoints):
    """name -> reference.HFFamily (checkpoint, HF processor, eager float32 model), loaded once."""
    from tests.conversations.reference import load_family

    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = load_family(name, conv_checkpoints(name))
        return cache[name]

    return get


def smooth_image(width: int, height: int, seed: int = 0):
    """A smooth random RGB PIL image (gradients + blobs): neighbouring patches correlate but differ."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width] / max(height, width)
    img = np.stack([np.sin(6 * x + rng.random() * 6), np.cos(5 * y + rng.random() * 6), x * y], -1)
    for _ in range(6):
        cy, cx, r = rng.random() * height, rng.random() * width, 0.05 + rng.random() * 0.2
        img[((y - cy / max(height, width)) ** 2 + (x - cx / max(height, width)) ** 2) < r * r] = rng.random(3)
    img = (img - img.min()) / max(img.max() - img.min(), 1e-9)
    return Image.fromarray((img * 255).astype(np.uint8))
