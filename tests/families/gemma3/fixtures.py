"""Gemma 3 session fixtures (loaded by tests/conftest.py for every folder): the tiny random checkpoint
(`gemma3-tiny`: 336-px SigLIP pooled to 144 soft tokens per crop, a sliding layer 0 with window 160 and a full layer
1, q/k norm, byte-fallback BPE with Gemma's specials), its fp32 engine dirs (standard and ORT form) from the shared
`builds` chain, and the HF side (`gemma3_hf`: Gemma3Processor + eager float32 model)."""

from __future__ import annotations

from pathlib import Path

import pytest

PRESET = "gemma3-tiny"


@pytest.fixture(scope="session")
def gemma3_checkpoint(builds) -> Path:
    return builds.checkpoint(PRESET)


@pytest.fixture(scope="session")
def gemma3_export(builds) -> Path:
    return builds.export(PRESET)


@pytest.fixture(scope="session")
def gemma3_ort_export(builds) -> Path:
    return builds.export(PRESET, "ort")


@pytest.fixture(scope="session")
def gemma3_hf(gemma3_checkpoint):
    """(Gemma3Processor, eager float32 Gemma3ForConditionalGeneration)."""
    from tests.families.gemma3.hf_gemma3 import load

    return load(gemma3_checkpoint)


def wide_image(seed: int = 0, size=(300, 800)):
    """A smooth random RGB image (H, W) = size; 800 x 300 is elongated enough for 3 pan-and-scan crops."""
    from tests.families.qwen_common import sample_image

    return sample_image(seed, size)


def noise_image(seed: int = 0, size=(300, 800)):
    """Uniform RGB noise (H, W) = size: distinct soft tokens in every crop (a smooth image's flat crops pool to
    near-duplicate soft tokens whose selection gains tie below float32's resolution, so float32 and a float64
    reference may keep different ones of a tie)."""
    import numpy as np
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8))
