"""probe.onnx / decoder.onnx / embed.onnx with M-RoPE positions [3, B, L] == the HF model (eager)."""

import numpy as np
import pytest
import torch

from coverpruner.families import get_family
from coverpruner.families.qwen2_5_vl.positions import decode_position
from tests.families.qwen2_5_vl.fixtures import our_request, ort_session, sample_image
from tests.families.qwen2_5_vl.hf_qwen import hf_inputs

PROMPT = "Describe the small red sign near the top left corner."
pytestmark = pytest.mark.slow


def _request(ckpt, engine_dir, model, size):
    """(HF processor inputs, HF inputs_embeds [1,L,d] with image rows, our layout and native positions)."""
    image = sample_image(3, size)
    ref = hf_inputs(ckpt, image, PROMPT)
    _, layout, positions = our_request(engine_dir, image, PROMPT)
    with torch.no_grad():
        feats = model.model.get_image_features(ref["pixel_values"], ref["image_grid_thw"]).pooler_output[0]
        embeds = model.model.get_input_embeddings()(ref["input_ids"])
        embeds[0, torch.from_numpy(layout.visual_positions)] = feats
    return ref, embeds.numpy(), layout, positions


@pytest.mark.parametrize("size", [(224, 224), (300, 250), (140, 420)])
def test_probe_matches_hf_layer0_attention(size, qwen_checkpoint, qwen_hf, qwen_export):
    ref, embeds, layout, positions = _request(qwen_checkpoint, qwen_export, qwen_hf, size)
    with torch.no_grad():
        out = qwen_hf(**ref, output_attentions=True)
    att = out.attentions[0][0].numpy()  # [H, L, L], HF's own positions and causal mask
    expected = att[:, layout.instruction_positions][:, :, layout.visual_positions].mean(axis=(0, 1))
    (ours,) = ort_session(qwen_export / "probe.onnx").run(None, {
        "inputs_embeds": embeds, "position_ids": positions[:, None], "visual_positions": layout.visual_positions,
        "instruction_positions": layout.instruction_positions})
    assert ours.shape == expected.shape == (layout.visual_positions.size,)
    # probabilities averaged over H*T entries; float32 softmax rounding ~1e-7 relative to each entry.
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-7)
    # positions matter: 1-D positions 0..L-1 give a different demand
    (flat,) = ort_session(qwen_export / "probe.onnx").run(None, {
        "inputs_embeds": embeds, "position_ids": np.broadcast_to(np.arange(embeds.shape[1]), (3, 1, embeds.shape[1])).copy(),
        "visual_positions": layout.visual_positions, "instruction_positions": layout.instruction_positions})
    assert np.abs(flat - expected).max() > 1e-3 * expected.max()


@pytest.mark.parametrize("size", [(300, 250), (140, 420)])
def test_decoder_prefill_and_decode_match_hf(size, qwen_checkpoint, qwen_hf, qwen_export):
    ref, embeds, layout, positions = _request(qwen_checkpoint, qwen_export, qwen_hf, size)
    dims = get_family("qwen2_5_vl").dims(qwen_hf.config)
    sess = ort_session(qwen_export / "decoder.onnx")
    length = embeds.shape[1]
    empty = np.zeros((1, dims["num_kv_heads"], 0, dims["head_dim"]), np.float32)
    feed = {"inputs_embeds": embeds, "attention_mask": np.ones((1, length), np.int64),
            "position_ids": positions[:, None]}
    feed.update({f"past_key_values.{i}.{kv}": empty for i in range(dims["num_layers"]) for kv in ("key", "value")})
    logits, *present = sess.run(None, feed)
    with torch.no_grad():
        out = qwen_hf(**ref, use_cache=True)  # HF computes its own 3-D positions (get_rope_index)
    np.testing.assert_allclose(logits[0, -1], out.logits[0, -1].numpy(), rtol=0, atol=1e-4)
    for i, layer in enumerate(out.past_key_values.layers):
        np.testing.assert_allclose(present[2 * i], layer.keys.numpy(), rtol=0, atol=1e-4)

    # one decode step: token = argmax, position max(native)+1 in all rows; HF uses its rope_deltas
    nxt = int(out.logits[0, -1].argmax())
    step_embed = qwen_hf.model.get_input_embeddings()(torch.tensor([[nxt]])).detach().numpy()
    feed = {"inputs_embeds": step_embed, "attention_mask": np.ones((1, length + 1), np.int64),
            "position_ids": decode_position(positions, 0)[:, None, None]}
    feed.update({f"past_key_values.{i}.{kv}": present[2 * i + j] for i in range(dims["num_layers"])
                 for j, kv in enumerate(("key", "value"))})
    step_logits, *_ = sess.run(None, feed)
    with torch.no_grad():
        ids = torch.cat([ref["input_ids"], torch.tensor([[nxt]])], 1)
        full = qwen_hf(input_ids=ids, pixel_values=ref["pixel_values"], image_grid_thw=ref["image_grid_thw"],
                       mm_token_type_ids=torch.cat([ref["mm_token_type_ids"], torch.zeros(1, 1, dtype=torch.long)], 1))
    np.testing.assert_allclose(step_logits[0, -1], full.logits[0, -1].numpy(), rtol=0, atol=1e-4)


def test_embed_matches_hf(qwen_hf, qwen_export):
    ids = np.array([[1, 5, 17, 900, 1003, 1005]], np.int64)
    (ours,) = ort_session(qwen_export / "embed.onnx").run(None, {"input_ids": ids})
    np.testing.assert_array_equal(ours, qwen_hf.model.get_input_embeddings()(torch.from_numpy(ids)).detach().numpy())
