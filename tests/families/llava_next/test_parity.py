"""Every exported LLaVA-NeXT graph against the HF PyTorch model (onnxruntime CPU, tiny GQA checkpoint, fp32).

Same tolerances as LLaVA-1.5's tests/families/llava/test_graph_parity.py; the vision graph's parity (over the
tile axis, with HF's packing) is in test_vision.py. Inputs are real NeXT requests: HF's processor and HF's packed
features (tests/families/llava_next/hf_reference.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.families.llava_next import hf_reference as ref
from tests.families.llava_next.fixtures import smooth_image

pytestmark = pytest.mark.slow
PROMPT = "What is on the left of the picture?"


def _session(path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def native(next_hf_model, next_processor):
    return ref.native_request(next_hf_model, next_processor, smooth_image(300, 120, seed=4), PROMPT)


def test_embed_is_exact(next_export, next_hf_model, native):
    ids = native.ids[None].numpy()
    (got,) = _session(next_export / "embed.onnx").run(None, {"input_ids": ids})
    with torch.no_grad():
        np.testing.assert_array_equal(got, next_hf_model.get_input_embeddings()(torch.from_numpy(ids)).numpy())


def test_probe_matches_hf_eager_layer0_attention_over_the_native_sequence(next_export, next_eager_model, native):
    """Newline rows stay in the sequence (they take attention mass); the demand is read at the candidates."""
    want = ref.layer0_relevance(next_eager_model, native)
    cand = native.image_pos[~native.newline]
    length = native.ids.shape[0]
    (got,) = _session(next_export / "probe.onnx").run(None, {
        "inputs_embeds": native.embeds.numpy(), "position_ids": np.arange(length, dtype=np.int64)[None],
        "visual_positions": cand, "instruction_positions": native.instr})
    assert got.shape == (cand.size,) and native.newline.sum() > 0
    assert np.abs(got - want).max() <= 1e-5
    assert want.std() > 0.05 * want.mean()  # not a uniform map: a wrong column would show


def test_selector_graph_matches_numpy_selector(next_export, native):
    from coverpruner.selection import coverage_select

    feats = native.embeds[0, torch.from_numpy(native.image_pos[~native.newline])].numpy()
    relevance = np.random.default_rng(0).random(feats.shape[0]).astype(np.float32)
    sess = _session(next_export / "selector.onnx")
    for budget in (64, 16, 500):
        (keep,) = sess.run(None, {"image_features": feats, "relevance": relevance,
                                  "budget": np.array(budget, np.int64), "tau": np.array(0.3, np.float32)})
        np.testing.assert_array_equal(keep, coverage_select(feats, relevance, budget=budget, tau=0.3))


def test_decoder_prefill_and_8_decode_steps_match_hf(next_export, next_hf_model, native):
    """A pruned NeXT sequence (every 3rd image row, newline rows among them) with compact positions."""
    from transformers import DynamicCache

    cfg = next_hf_model.config.text_config
    layers, hkv, hd = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    image = set(native.image_pos.tolist())
    rows = [i for i in range(native.ids.shape[0]) if i not in image or (i - native.image_pos[0]) % 3 == 0]
    step_in = native.embeds[:, torch.tensor(rows)]
    length = step_in.shape[1]
    pos = torch.arange(length)[None]
    sess = _session(next_export / "decoder.onnx")
    past = [np.zeros((1, hkv, 0, hd), np.float32) for _ in range(2 * layers)]
    cache = DynamicCache(config=cfg)
    tokens = []
    for step in range(9):
        mask = np.ones((1, length), np.int64)
        feed = {"inputs_embeds": step_in.numpy(), "attention_mask": mask, "position_ids": pos.numpy()}
        for i in range(layers):
            feed[f"past_key_values.{i}.key"], feed[f"past_key_values.{i}.value"] = past[2 * i], past[2 * i + 1]
        logits, *past = sess.run(None, feed)
        with torch.no_grad():
            want = next_hf_model(inputs_embeds=step_in, attention_mask=torch.from_numpy(mask), position_ids=pos,
                                 past_key_values=cache, use_cache=True).logits[:, -1:].numpy()
        assert np.abs(logits - want).max() <= 1e-4, f"step {step}"
        tok = int(want[0, -1].argmax())
        assert int(logits[0, -1].argmax()) == tok, f"step {step}"
        tokens.append(tok)
        with torch.no_grad():
            step_in = next_hf_model.get_input_embeddings()(torch.tensor([[tok]]))
        pos = torch.tensor([[length]])
        length += 1
    assert len(set(tokens)) > 1, "constant answer: the test would be weak"
