"""LLaVA-1.5 session fixtures (loaded by tests/conftest.py for every folder) and HF-side helpers.

`tiny_checkpoint` -> llava-hf-format checkpoint (preset "tiny": 144 visual tokens, Llama with GQA 4 heads / 2 kv
heads, 2 layers, hidden 64, locally trained BPE tokenizer); `tiny_export` -> its fp32 engine dir (every graph,
manifest.json); both from the shared `builds` chain. `hf_model` / `hf_processor` / `hf` / `request_inputs`: the
HF-side references of the parity tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

PROMPT = "What color is the bus on the left side of the street?"


@pytest.fixture(scope="session")
def tiny_checkpoint(builds) -> Path:
    return builds.checkpoint("tiny")


@pytest.fixture(scope="session")
def tiny_export(builds) -> Path:
    return builds.export("tiny")


@pytest.fixture(scope="session")
def tiny_pipe(tiny_export):
    from coverpruner.runtime import Pipeline

    return Pipeline.load(tiny_export, provider="cpu", threads=1)


@pytest.fixture(scope="session")
def hf(tiny_checkpoint):
    """(LlavaForConditionalGeneration with eager attention, its HF processor)."""
    transformers = pytest.importorskip("transformers")
    model = transformers.LlavaForConditionalGeneration.from_pretrained(
        str(tiny_checkpoint), attn_implementation="eager").eval()
    return model, transformers.AutoProcessor.from_pretrained(str(tiny_checkpoint))


@pytest.fixture(scope="session")
def hf_model(tiny_checkpoint):
    """The HF model with its default attention (sdpa): an independent reference for the eager export."""
    from transformers import LlavaForConditionalGeneration

    return LlavaForConditionalGeneration.from_pretrained(str(tiny_checkpoint)).eval()


@pytest.fixture(scope="session")
def hf_processor(tiny_checkpoint):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(str(tiny_checkpoint))


def sample_image(seed: int = 0, size=(200, 240)):
    """A smooth random RGB image (gradients + blobs) so visual tokens differ but are correlated."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    h, w = size
    y, x = np.mgrid[0:h, 0:w] / max(h, w)
    img = np.stack([np.sin(6 * x + rng.random() * 6), np.cos(5 * y + rng.random() * 6), x * y], -1)
    for _ in range(6):
        cy, cx, r = rng.random() * h, rng.random() * w, 10 + rng.random() * 30
        mask = (np.mgrid[0:h, 0:w][0] - cy) ** 2 + (np.mgrid[0:h, 0:w][1] - cx) ** 2 < r * r
        img[mask] = rng.random(3)
    img = (img - img.min()) / (img.max() - img.min())
    return Image.fromarray((img * 255).astype(np.uint8))


@dataclass
class Request:
    """One native (un-pruned) request. pixel_values f32 [1,3,H,W]; input_ids int64 [1,L];
    visual / instruction positions int64 [n] / [T]."""

    pixel_values: np.ndarray
    input_ids: np.ndarray
    visual_positions: np.ndarray
    instruction_positions: np.ndarray


def family_runtime(checkpoint: Path, family_name: str = "llava"):
    """The family's run-time rules bound to the manifest fields it would export for ``checkpoint`` (no graphs)."""
    from types import SimpleNamespace

    from transformers import AutoConfig

    from coverpruner.engine_dir import PRECISIONS
    from coverpruner.families import get_family

    fam = get_family(family_name)
    fields = fam.manifest_fields(AutoConfig.from_pretrained(str(checkpoint)), Path(checkpoint))
    manifest = SimpleNamespace(**fields, max_visual_tokens=fields["visual"]["max_visual_tokens"],
                               position_rank=fields["visual"]["position_rank"], float_dtype=PRECISIONS["fp32"])
    return fam.runtime(manifest)


@pytest.fixture(scope="session")
def request_inputs(hf_processor, tiny_checkpoint) -> Request:
    """Processor output for (sample image, PROMPT) plus the family's visual / instruction positions."""
    from tokenizers import Tokenizer

    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}]
    text = hf_processor.apply_chat_template(messages, add_generation_prompt=True)
    enc = hf_processor(images=sample_image(), text=text, return_tensors="np")
    cfg = hf_processor.image_processor.crop_size["height"] // hf_processor.patch_size
    n = cfg * cfg
    tokenizer = Tokenizer.from_file(str(Path(tiny_checkpoint) / "tokenizer.json"))
    layout = family_runtime(tiny_checkpoint).conversation_layout(tokenizer, messages, [n])
    assert (layout.input_ids == enc["input_ids"][0]).all(), "family layout must tokenize like the HF processor"
    return Request(enc["pixel_values"].astype(np.float32), enc["input_ids"].astype(np.int64),
                   layout.visual_positions, layout.instruction_positions)


def ort_session(path: Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
