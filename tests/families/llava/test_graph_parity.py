"""Every exported graph against the HF PyTorch model (onnxruntime CPU, tiny GQA checkpoint, fp32)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.families.llava.fixtures import ort_session

pytestmark = pytest.mark.slow


def _image_features_hf(hf_model, pixel_values):
    with torch.no_grad():
        out = hf_model.get_image_features(pixel_values=torch.from_numpy(pixel_values))
    feats = out.pooler_output if hasattr(out, "pooler_output") else out
    return torch.stack(list(feats)).numpy()  # [B,n,d]


def _native_embeds(hf_model, req):
    """HF's merge: token embeddings with the image rows replaced by get_image_features. [1,L,d] f32."""
    with torch.no_grad():
        emb = hf_model.get_input_embeddings()(torch.from_numpy(req.input_ids)).clone()
    emb[0, torch.from_numpy(req.visual_positions)] = torch.from_numpy(_image_features_hf(hf_model, req.pixel_values)[0])
    return emb


def test_vision_matches_get_image_features(tiny_export, hf_model, request_inputs):
    rng = np.random.default_rng(1)
    batch = np.concatenate([request_inputs.pixel_values,
                            rng.standard_normal(request_inputs.pixel_values.shape).astype(np.float32)])
    (got,) = ort_session(tiny_export / "vision.onnx").run(None, {"pixel_values": batch})
    ref = _image_features_hf(hf_model, batch)
    assert got.shape == ref.shape == (2, 144, 64)
    assert np.abs(got - ref).max() <= 1e-4


def test_embed_is_exact(tiny_export, hf_model, request_inputs):
    ids = np.concatenate([request_inputs.input_ids, request_inputs.input_ids[:, ::-1]])
    (got,) = ort_session(tiny_export / "embed.onnx").run(None, {"input_ids": ids})
    with torch.no_grad():
        ref = hf_model.get_input_embeddings()(torch.from_numpy(ids.copy())).numpy()
    np.testing.assert_array_equal(got, ref)


def test_probe_matches_hf_eager_layer0_attention(tiny_export, tiny_checkpoint, hf_model, request_inputs):
    from transformers import LlavaForConditionalGeneration

    eager = LlavaForConditionalGeneration.from_pretrained(str(tiny_checkpoint), attn_implementation="eager").eval()
    req = request_inputs
    embeds = _native_embeds(hf_model, req)
    length = embeds.shape[1]
    positions = torch.arange(length)[None]
    with torch.no_grad():
        att = eager(inputs_embeds=embeds, position_ids=positions, output_attentions=True).attentions[0]  # [1,H,L,L]
    vis, ins = torch.from_numpy(req.visual_positions), torch.from_numpy(req.instruction_positions)
    ref = att[0][:, ins][:, :, vis].mean(dim=(0, 1)).numpy()  # heads and instruction rows

    (got,) = ort_session(tiny_export / "probe.onnx").run(None, {
        "inputs_embeds": embeds.numpy(), "position_ids": positions.numpy(),
        "visual_positions": req.visual_positions, "instruction_positions": req.instruction_positions})
    assert got.dtype == np.float32 and got.shape == (144,)
    assert np.abs(got - ref).max() <= 1e-5
    # Not a degenerate (uniform) map: the test would not notice a wrong column/row selection otherwise.
    assert ref.std() > 0.05 * ref.mean()


def test_selector_matches_selection(tiny_export, hf_model, request_inputs):
    from coverpruner.selection import coverage_select

    feats = _image_features_hf(hf_model, request_inputs.pixel_values)[0]
    rng = np.random.default_rng(0)
    relevance = rng.random(feats.shape[0]).astype(np.float32)
    sess = ort_session(tiny_export / "selector.onnx")
    for budget in (64, 16, 200):
        (keep,) = sess.run(None, {"image_features": feats, "relevance": relevance,
                                  "budget": np.array(budget, np.int64), "tau": np.array(0.3, np.float32)})
        np.testing.assert_array_equal(keep, coverage_select(feats, relevance, budget=budget, tau=0.3))


def _pruned_inputs(hf_model, req, keep):
    """[prefix; V[keep]; suffix] embeds with compact positions (LLaVA). Returns (embeds [1,L',d], positions)."""
    embeds = _native_embeds(hf_model, req)[0]
    vis = req.visual_positions
    rows = np.concatenate([np.arange(vis[0]), vis[keep], np.arange(vis[-1] + 1, embeds.shape[0])])
    pruned = embeds[torch.from_numpy(rows)][None]
    return pruned, torch.arange(pruned.shape[1])[None]


def _decoder_feed(embeds, mask, positions, past, layers):
    feed = {"inputs_embeds": embeds, "attention_mask": mask, "position_ids": positions}
    for i in range(layers):
        feed[f"past_key_values.{i}.key"], feed[f"past_key_values.{i}.value"] = past[2 * i], past[2 * i + 1]
    return feed


def test_decoder_prefill_and_8_decode_steps_match_hf(tiny_export, hf_model, request_inputs):
    from transformers import DynamicCache

    cfg = hf_model.config.text_config
    layers, hkv, hd = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    embeds, positions = _pruned_inputs(hf_model, request_inputs, keep=np.arange(0, 144, 9))  # 16 kept
    sess = ort_session(tiny_export / "decoder.onnx")
    emb_table = hf_model.get_input_embeddings()

    past = [np.zeros((1, hkv, 0, hd), np.float32) for _ in range(2 * layers)]  # prefill: P = 0
    cache = DynamicCache(config=hf_model.config.text_config)
    step_in, pos, length = embeds, positions, embeds.shape[1]
    tokens_ort, tokens_hf = [], []
    for step in range(9):  # prefill + 8 decode steps
        mask = np.ones((1, length), np.int64)
        outs = sess.run(None, _decoder_feed(step_in.numpy(), mask, pos.numpy(), past, layers))
        logits_ort, past = outs[0], outs[1:]
        with torch.no_grad():
            ref = hf_model(inputs_embeds=step_in, attention_mask=torch.from_numpy(mask), position_ids=pos,
                           past_key_values=cache, use_cache=True)
        logits_hf = ref.logits[:, -1:].numpy()
        assert logits_ort.shape == (1, 1, cfg.vocab_size)
        assert np.abs(logits_ort - logits_hf).max() <= 1e-4, f"step {step}"
        assert past[0].shape == (1, hkv, length, hd)
        tok_o, tok_h = int(logits_ort[0, -1].argmax()), int(logits_hf[0, -1].argmax())
        tokens_ort.append(tok_o)
        tokens_hf.append(tok_h)
        assert tok_o == tok_h, f"greedy tokens diverge at step {step}: {tokens_ort} vs {tokens_hf}"
        with torch.no_grad():  # both sides continue with the same token (HF's greedy choice)
            step_in = emb_table(torch.tensor([[tok_h]]))
        pos = torch.tensor([[length]])
        length += 1
    assert len(set(tokens_hf)) > 1, "random model produced a constant sequence; test would be weak"


def test_decoder_batch_with_left_padding_matches_hf(tiny_export, hf_model, request_inputs):
    """Batch 2, second row left-padded by 3: masked prefill logits equal HF's."""
    cfg = hf_model.config.text_config
    layers, hkv, hd = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    embeds, _ = _pruned_inputs(hf_model, request_inputs, keep=np.arange(0, 144, 4))
    length = embeds.shape[1]
    batch = torch.cat([embeds, torch.cat([torch.zeros(1, 3, embeds.shape[2]), embeds[:, 3:]], 1)])
    mask = np.ones((2, length), np.int64)
    mask[1, :3] = 0
    positions = torch.stack([torch.arange(length), (torch.arange(length) - 3).clamp(min=0)])
    past = [np.zeros((2, hkv, 0, hd), np.float32) for _ in range(2 * layers)]
    got = ort_session(tiny_export / "decoder.onnx").run(
        ["logits"], _decoder_feed(batch.numpy(), mask, positions.numpy(), past, layers))[0]
    with torch.no_grad():
        ref = hf_model(inputs_embeds=batch, attention_mask=torch.from_numpy(mask), position_ids=positions).logits
    assert np.abs(got - ref[:, -1:].numpy()).max() <= 1e-4
