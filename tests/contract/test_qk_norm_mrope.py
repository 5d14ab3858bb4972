"""Contract v4's attention and rotary variants against transformers' Qwen3-VL text model (the reference): per-head
q/k RMSNorm before rotary, interleaved M-RoPE, and DeepStack extras added after decoder layers 0 and 1.

A tiny random Qwen3VLTextModel (2 layers, 4 heads / 2 kv heads, head_dim 16, mrope_section [2, 3, 3]) is handed to
export through the HF base (families/hf.py) by a test adapter; checked:
  * engines/rotary.py's interleaved host rows == the model's own rotary embedding;
  * the probe (export/modules.ProbeGraph over ProbeParts with q_norm / k_norm) == HF eager layer-0 attention;
  * the ORT-form decoder (export/ortform, driven by engines/ort_form_decoder) and the standard form's torch
    module (export/modules.DecoderGraph) == Qwen3VLTextModel with deepstack_visual_embeds / visual_pos_masks,
    prefill and decode steps (positions written out here: a 2x3 grid with gaps, text after it).
Tolerance 1e-4 absolute on logits (magnitude ~1) and 1e-5 on demand: float32 on both sides, only summation order
differs (the ORT form's fused kernels; tests/export/test_ortform_decoder.py measures ~5e-6 for the same widths).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
qwen3_vl = pytest.importorskip("transformers.models.qwen3_vl.modeling_qwen3_vl",
                               reason="transformers without Qwen3-VL has no reference")

ATOL = 1e-4
D, HD, LAYERS = 64, 16, 2
PROMPT = 12
VISUAL = np.array([3, 4, 5, 6])  # the kept cells of a 2x3 grid (cells 2 and 4 pruned)


def _positions(length: int) -> np.ndarray:
    """int64 [3, length]: 3 text tokens, the kept grid cells 0, 1, 3, 5 (t = 3, h = 3 + cell // 3, w = 3 + cell % 3),
    text from max + 1 = 6 on."""
    t, h, w = [0, 1, 2], [0, 1, 2], [0, 1, 2]
    for cell in (0, 1, 3, 5):
        t.append(3), h.append(3 + cell // 3), w.append(3 + cell % 3)
    nxt = 6
    while len(t) < length:
        t.append(nxt), h.append(nxt), w.append(nxt)
        nxt += 1
    return np.array([t, h, w], dtype=np.int64)[:, :length]


@pytest.fixture(scope="module")
def parts():
    from coverpruner.families.contract import DecoderExtra
    from coverpruner.families.hf import HFFamily

    cfg = qwen3_vl.Qwen3VLTextConfig(
        vocab_size=96, hidden_size=D, intermediate_size=128, num_hidden_layers=LAYERS, num_attention_heads=4,
        num_key_value_heads=2, head_dim=HD, max_position_embeddings=256, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                         "mrope_interleaved": True})
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    text = qwen3_vl.Qwen3VLTextModel(cfg).eval()
    with torch.no_grad():  # HF initialises the norms to ones: random scales so a missing q/k norm shows
        for layer in text.layers:
            for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                norm.weight.uniform_(0.5, 1.5)
    model = torch.nn.Module()
    model.text, model.head = text, torch.nn.Linear(D, cfg.vocab_size, bias=False)

    class Qwen3Text(HFFamily):  # the HF base over this text model: what a Qwen3-VL family would inherit
        position_rank = 3
        mrope_interleaved = True

        def language_model(self, model):
            return model.text

        def lm_head(self, model):
            return model.head

        def apply_rope(self):
            return qwen3_vl.apply_rotary_pos_emb

    extras = (DecoderExtra("visual_extra.0", 0), DecoderExtra("visual_extra.1", 1))
    return Qwen3Text(), model, extras


def _inputs(length: int):
    rng = np.random.default_rng(1)
    embeds = rng.standard_normal((1, length, D)).astype(np.float32)
    levels = [np.zeros((1, length, D), np.float32) for _ in range(2)]
    for level in levels:
        level[0, VISUAL] = rng.standard_normal((len(VISUAL), D)).astype(np.float32)
    return embeds, levels


def _hf_logits(model, embeds, levels, positions) -> np.ndarray:
    """Qwen3VLTextModel over the whole sequence with DeepStack at VISUAL -> lm_head logits [V] of the last row."""
    n = embeds.shape[1]
    mask = torch.zeros(1, n, dtype=torch.bool)
    mask[0, VISUAL] = True
    with torch.no_grad():
        out = model.text(inputs_embeds=torch.from_numpy(embeds), position_ids=torch.from_numpy(positions)[:, None],
                         visual_pos_masks=mask, deepstack_visual_embeds=[torch.from_numpy(lv[0, VISUAL]) for lv in levels])
        return model.head(out.last_hidden_state[0, -1]).numpy()


def test_interleaved_host_rows_equal_the_model_rotary(parts):
    from coverpruner.engines.rotary import rotary_rows

    _, model, _ = parts
    pos = _positions(20)
    with torch.no_grad():
        cos, sin = model.text.rotary_emb(torch.zeros(1, 20, D), torch.from_numpy(pos)[:, None])
    got_cos, got_sin = rotary_rows(pos, HD, 10000.0, [2, 3, 3], interleaved=True)
    np.testing.assert_allclose(got_cos, cos[0, :, :HD // 2].numpy(), atol=1e-6, rtol=0)
    np.testing.assert_allclose(got_sin, sin[0, :, :HD // 2].numpy(), atol=1e-6, rtol=0)
    blocks, _ = rotary_rows(pos, HD, 10000.0, [2, 3, 3], interleaved=False)
    assert not np.allclose(blocks, got_cos)  # the two layouts differ on these positions


def test_probe_with_qk_norm_equals_hf_attention(parts):
    from coverpruner.export.modules import ProbeGraph

    family, model, _ = parts
    probe_parts = family.probe_parts(model)
    assert probe_parts.q_norm is not None and probe_parts.k_norm is not None
    embeds, _ = _inputs(PROMPT)
    pos = torch.from_numpy(_positions(PROMPT))[:, None]
    instr = np.array([9, 10, 11])
    with torch.no_grad():
        got = ProbeGraph(probe_parts)(torch.from_numpy(embeds), pos, torch.from_numpy(VISUAL), torch.from_numpy(instr))
        att = model.text(inputs_embeds=torch.from_numpy(embeds), position_ids=pos, output_attentions=True).attentions[0]
    want = att[0][:, instr][:, :, VISUAL].mean(dim=(0, 1)).numpy()
    np.testing.assert_allclose(got.numpy(), want, atol=1e-5, rtol=0)


def test_ort_form_decoder_equals_hf(parts, tmp_path):
    import onnxruntime as ort

    from coverpruner.engines.ort_form_decoder import OrtFormDecoderSession
    from coverpruner.export.ortform.decoder_graph import build_ort_decoder

    family, model, extras = parts
    weights = family.decoder_weights(model)
    assert weights.rotary == {"theta": 10000.0, "mrope_section": [2, 3, 3], "mrope_interleaved": True}
    assert all(lw.q_norm is not None and lw.k_norm is not None for lw in weights.layers)
    graph = build_ort_decoder(weights, tmp_path / "decoder.onnx", extras=extras)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    session = ort.InferenceSession(str(graph), so, providers=["CPUExecutionProvider"])
    dec = OrtFormDecoderSession(session, LAYERS, 2, HD, 96, weights.rotary)
    total = PROMPT + 3
    embeds, levels = _inputs(total)
    pos = _positions(total)
    dec.reset(total)
    assert dec._slots.extra_names == ("visual_extra.0", "visual_extra.1")
    got = dec.forward(embeds[:, :PROMPT], pos[:, None, :PROMPT],
                      extras={e.name: lv[:, :PROMPT] for e, lv in zip(extras, levels)})
    np.testing.assert_allclose(got, _hf_logits(model, embeds[:, :PROMPT], levels, pos[:, :PROMPT]), atol=ATOL, rtol=0)
    for k in range(PROMPT, total):  # decode steps: no extras given, the graph adds zeros
        got = dec.forward(embeds[:, k:k + 1], pos[:, None, k:k + 1])
        np.testing.assert_allclose(got, _hf_logits(model, embeds[:, :k + 1], levels, pos[:, :k + 1]), atol=ATOL, rtol=0)
    # the extras are exercised: without them the prefill answers otherwise
    dec.reset(total)
    plain = dec.forward(embeds[:, :PROMPT], pos[:, None, :PROMPT])
    assert np.abs(plain - _hf_logits(model, embeds[:, :PROMPT], levels, pos[:, :PROMPT])).max() > 100 * ATOL


def test_standard_decoder_module_equals_hf(parts):
    from coverpruner.export.modules import DecoderGraph

    family, model, extras = parts
    graph = DecoderGraph(family.language_model(model), family.lm_head(model), extras).eval()
    total = PROMPT + 2
    embeds, levels = _inputs(total)
    pos = torch.from_numpy(_positions(total))[:, None]
    past = tuple(torch.zeros(1, 2, 0, HD) for _ in range(2 * LAYERS))
    with torch.no_grad():
        out = graph(torch.from_numpy(embeds[:, :PROMPT]), torch.ones(1, PROMPT, dtype=torch.long), pos[..., :PROMPT],
                    past, tuple(torch.from_numpy(lv[:, :PROMPT]) for lv in levels))
    np.testing.assert_allclose(out[0][0, -1].numpy(), _hf_logits(model, embeds[:, :PROMPT], levels,
                                                                 pos[:, 0, :PROMPT].numpy()), atol=ATOL, rtol=0)
    past = out[1:]
    for k in range(PROMPT, total):
        zeros = tuple(torch.zeros(1, 1, D) for _ in extras)
        with torch.no_grad():
            out = graph(torch.from_numpy(embeds[:, k:k + 1]), torch.ones(1, k + 1, dtype=torch.long),
                        pos[..., k:k + 1], past, zeros)
        np.testing.assert_allclose(out[0][0, -1].numpy(), _hf_logits(model, embeds[:, :k + 1], levels,
                                                                     pos[:, 0, :k + 1].numpy()), atol=ATOL, rtol=0)
        past = out[1:]
    # outside the graph's forward the hooks add nothing: the HF stack is unchanged for other callers
    with torch.no_grad():
        plain = model.text(inputs_embeds=torch.from_numpy(embeds[:, :PROMPT]), position_ids=pos[..., :PROMPT])
    with torch.no_grad():
        hf_plain = qwen3_vl.Qwen3VLTextModel.forward(model.text, inputs_embeds=torch.from_numpy(embeds[:, :PROMPT]),
                                                      position_ids=pos[..., :PROMPT])
    torch.testing.assert_close(plain.last_hidden_state, hf_plain.last_hidden_state, rtol=0, atol=0)
