"""fp16 graphs of the tiny Qwen2.5-VL track the fp32 HF model within fp16 rounding (measured in the report:
vision ~6e-4 of the output scale; HF itself keeps RMSNorm statistics, rotary and softmax in float32, and the
graphs keep attention scores in float32 too)."""

import json

import numpy as np
import pytest
import torch

from coverpruner.families import get_family
from coverpruner.families.qwen_vl import QwenImageSettings, preprocess_qwen_image
from coverpruner.families.qwen2_5_vl.vision import VISION_INPUTS, vision_inputs
from tests.families.qwen2_5_vl.fixtures import ort_session, sample_image

pytestmark = pytest.mark.slow
# fp16 keeps 11 significant bits (unit roundoff 4.9e-4); a few blocks of sequential rounding reach a few 1e-3
# of the output scale.
FP16_REL = 5e-3


@pytest.fixture(scope="module")
def fp16_graphs(qwen_checkpoint, tmp_path_factory):
    from coverpruner.export.exporter import ExportOptions, export_model

    out = tmp_path_factory.mktemp("qwen_fp16")
    export_model(qwen_checkpoint, out, "qwen2.5-vl-tiny", ExportOptions(dtype="fp16", progress=False))
    return out


def test_fp16_vision_and_prefill_track_fp32(qwen_checkpoint, qwen_hf, fp16_graphs):
    settings = QwenImageSettings.from_dict(json.loads((qwen_checkpoint / "preprocessor_config.json").read_text()))
    img = preprocess_qwen_image(sample_image(4, (300, 250)), settings)
    vc = qwen_hf.config.vision_config
    feeds = vision_inputs(img.pixel_values.astype(np.float16), img.grid_thw, 2, vc.window_size, vc.patch_size)
    (v16,) = ort_session(fp16_graphs / "vision.onnx").run(None, {k: feeds[k] for k in VISION_INPUTS})
    with torch.no_grad():
        v32 = qwen_hf.model.get_image_features(torch.from_numpy(img.pixel_values),
                                               torch.tensor([img.grid_thw])).pooler_output[0].numpy()
    assert v16.dtype == np.float16
    assert np.abs(v16.astype(np.float32) - v32).max() <= FP16_REL * np.abs(v32).max()

    # decoder prefill on the fp32 features laid into a short text sequence, 1-D-like positions are enough here
    dims = get_family("qwen2_5_vl").dims(qwen_hf.config)
    ids = torch.tensor([[5, 17, 300, 12, 901, 44, 7]])
    with torch.no_grad():
        emb = qwen_hf.model.get_input_embeddings()(ids)
        emb = torch.cat([emb[:, :3], torch.from_numpy(v32[None, :20]), emb[:, 3:]], 1)
        pos = torch.arange(emb.shape[1]).view(1, 1, -1).expand(3, 1, -1)
        ref = qwen_hf(inputs_embeds=emb, position_ids=pos).logits[0, -1].numpy()
    empty = np.zeros((1, dims["num_kv_heads"], 0, dims["head_dim"]), np.float16)
    feed = {"inputs_embeds": emb.numpy().astype(np.float16), "attention_mask": np.ones((1, emb.shape[1]), np.int64),
            "position_ids": pos.numpy()}
    feed.update({f"past_key_values.{i}.{kv}": empty for i in range(dims["num_layers"]) for kv in ("key", "value")})
    logits = ort_session(fp16_graphs / "decoder.onnx").run(None, feed)[0][0, -1].astype(np.float32)
    assert np.abs(logits - ref).max() <= FP16_REL * np.abs(ref).max()
    assert int(logits.argmax()) == int(ref.argmax())


def test_fp16_pipeline_tracks_fp32(fp16_graphs, qwen_export):
    """The fp16 engine dir through the Pipeline: same kept set and demand within fp16 rounding, same answer."""
    from coverpruner.runtime.pipeline import Pipeline

    image, prompt = sample_image(5, (300, 250)), "What is written on the sign next to the red car?"
    p16, p32 = Pipeline.load(fp16_graphs), Pipeline.load(qwen_export)
    for method in ("coverpruner", "divprune"):
        r16 = p16.generate(image, prompt, budget=16, method=method, max_new_tokens=6)
        r32 = p32.generate(image, prompt, budget=16, method=method, max_new_tokens=6)
        np.testing.assert_array_equal(r16.kept_indices, r32.kept_indices)
        assert r16.token_ids == r32.token_ids
        if method == "coverpruner":
            np.testing.assert_allclose(r16.relevance, r32.relevance, rtol=FP16_REL)
