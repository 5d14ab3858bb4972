"""Session fixtures for the Qwen2.5-VL tests: one tiny random checkpoint, sample images.

`qwen_checkpoint` -> Path of a `qwen2.5-vl-tiny` checkpoint (window attention over 3x3 merged patches,
full-attention blocks 1 and 3, GQA 4/2 heads, q/k/v bias, mrope_section [2, 3, 3]); built once (~5 s).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers", reason="the Qwen2.5-VL tests build a checkpoint with transformers")


@pytest.fixture(scope="session")
def qwen_checkpoint(tmp_path_factory) -> Path:
    from coverpruner.testing.qwen_checkpoints import write_qwen_checkpoint

    return write_qwen_checkpoint(tmp_path_factory.mktemp("qwen_tiny"), preset="qwen2.5-vl-tiny", seed=0)


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
    from tests.qwen.hf_qwen import hf_model  # noqa: PLC0415

    return hf_model(str(qwen_checkpoint), "eager")


@pytest.fixture(scope="session")
def qwen_graphs(qwen_checkpoint, tmp_path_factory) -> Path:
    """Directory with vision/embed/probe/decoder .onnx of the tiny checkpoint (fp32), exported with the
    family's own wrappers and example inputs through export.onnx_io (dynamo exporter)."""
    import torch

    from coverpruner.export.onnx_io import export_graph
    from coverpruner.families import get_family

    family = get_family("qwen2_5_vl")
    model = family.load_model(qwen_checkpoint, "float32")
    dims = family.dims(model.config)
    out = tmp_path_factory.mktemp("qwen_graphs")
    for name in ("vision", "embed", "probe", "decoder"):
        args, names_in, names_out, shapes = family.example_inputs(name, dims, torch.float32)
        export_graph(family.graph_module(name, model), args, out / f"{name}.onnx", names_in, names_out, shapes,
                     opset=18, external_data=False)
    return out


def ort_session(path: Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
