"""Prototype ORT-form decoder (coverpruner/export/ortform) against transformers on the tiny presets.

References are transformers' own text models run on the full sequence each step with positions written out
here (Qwen2.5-VL: T/H/W of a pruned 5x6 grid; LLaVA: compact 0..L-1), independent of ortform/rotary.py.
Tolerance 1e-4 absolute on logits of magnitude ~5: both sides are float32, only the summation order differs
(fused GQA / SkipSimplifiedLayerNormalization kernels vs torch); measured ~5e-6.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

ATOL = 1e-4


def _qwen_positions(length: int) -> np.ndarray:
    """[3, length]: 5 text tokens, a 5x6 grid at t=5 with every third cell pruned, text from max + 1 on."""
    t, h, w = list(range(5)), list(range(5)), list(range(5))
    for i in range(30):
        if i % 3 != 1:
            t.append(5), h.append(5 + i // 6), w.append(5 + i % 6)
    nxt = 11  # max(5, 5 + 4, 5 + 5) + 1
    while len(t) < length:
        t.append(nxt), h.append(nxt), w.append(nxt)
        nxt += 1
    return np.array([t[:length], h[:length], w[:length]])


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    from transformers import Qwen2_5_VLForConditionalGeneration

    from coverpruner.export.ortform.decoder_graph import build_ort_decoder, text_config
    from coverpruner.testing.qwen_checkpoints import write_qwen_checkpoint

    ckpt = write_qwen_checkpoint(tmp_path_factory.mktemp("qwen_ckpt"), "qwen2.5-vl-tiny")
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32).eval()
    graph = build_ort_decoder(ckpt, tmp_path_factory.mktemp("qwen_ortform") / "decoder.onnx")
    return model, graph, text_config(ckpt)


@pytest.fixture(scope="module")
def llava(tiny_checkpoint, tmp_path_factory):
    from transformers import LlavaForConditionalGeneration

    from coverpruner.export.ortform.decoder_graph import build_ort_decoder, text_config

    model = LlavaForConditionalGeneration.from_pretrained(tiny_checkpoint, dtype=torch.float32).eval()
    graph = build_ort_decoder(tiny_checkpoint, tmp_path_factory.mktemp("llava_ortform") / "decoder.onnx")
    return model, graph, text_config(tiny_checkpoint)


def _qwen_reference(model, embeds: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Last-position logits [V] of Qwen2.5-VL's language model on embeds [1, L, H] at positions [3, L]."""
    with torch.no_grad():
        hs = model.model.language_model(inputs_embeds=torch.from_numpy(embeds),
                                        position_ids=torch.from_numpy(positions[:, None, :]).long())
        return model.lm_head(hs.last_hidden_state[:, -1]).numpy()[0]


def _llava_reference(model, embeds: np.ndarray) -> np.ndarray:
    """Last-position logits [V] of LLaVA's language model on embeds [1, L, H] at positions 0..L-1."""
    with torch.no_grad():
        hs = model.model.language_model(inputs_embeds=torch.from_numpy(embeds),
                                        position_ids=torch.arange(embeds.shape[1])[None])
        return model.lm_head(hs.last_hidden_state[:, -1]).numpy()[0]


def _decoder(graph, cfg, batch, capacity):
    from coverpruner.export.ortform.session import OrtFormDecoder

    return OrtFormDecoder(str(graph), batch, capacity, cfg["kv_heads"], cfg["head_dim"], cfg["layers"], threads=1)


def test_qwen_mrope_prefill_and_decode_match_transformers(qwen):
    from coverpruner.export.ortform.rotary import rotary_rows

    model, graph, cfg = qwen
    prompt, steps = 40, 3
    pos = _qwen_positions(prompt + steps)
    embeds = (np.random.default_rng(0).standard_normal((1, prompt + steps, cfg["hidden"])) * 0.5).astype(np.float32)
    dec = _decoder(graph, cfg, 1, prompt + steps)
    cos, sin = rotary_rows(pos[:, :prompt], cfg["head_dim"], cfg["theta"], cfg["mrope_section"])
    got = dec.prefill(0, embeds[:, :prompt], cos, sin)
    np.testing.assert_allclose(got, _qwen_reference(model, embeds[:, :prompt], pos[:, :prompt]), atol=ATOL, rtol=0)
    for k in range(prompt, prompt + steps):
        cos, sin = rotary_rows(pos[:, k:k + 1], cfg["head_dim"], cfg["theta"], cfg["mrope_section"])
        got = dec.decode(embeds[:, k:k + 1], cos, sin)[0]
        np.testing.assert_allclose(got, _qwen_reference(model, embeds[:, :k + 1], pos[:, :k + 1]), atol=ATOL, rtol=0)


def test_llava_prefill_and_decode_match_transformers(llava):
    from coverpruner.export.ortform.rotary import rotary_rows

    model, graph, cfg = llava
    prompt, steps = 30, 3
    embeds = (np.random.default_rng(1).standard_normal((1, prompt + steps, cfg["hidden"])) * 0.5).astype(np.float32)
    dec = _decoder(graph, cfg, 1, prompt + steps)
    cos, sin = rotary_rows(np.arange(prompt), cfg["head_dim"], cfg["theta"])
    np.testing.assert_allclose(dec.prefill(0, embeds[:, :prompt], cos, sin), _llava_reference(model, embeds[:, :prompt]),
                               atol=ATOL, rtol=0)
    for k in range(prompt, prompt + steps):
        cos, sin = rotary_rows(np.array([k]), cfg["head_dim"], cfg["theta"])
        np.testing.assert_allclose(dec.decode(embeds[:, k:k + 1], cos, sin)[0],
                                   _llava_reference(model, embeds[:, :k + 1]), atol=ATOL, rtol=0)


def test_batched_decode_of_ragged_requests_equals_each_alone(qwen):
    """Two requests of different prompt lengths, prefilled into their slots, decoded together: same logits."""
    from coverpruner.export.ortform.rotary import rotary_rows

    model, graph, cfg = qwen
    lengths, steps = (37, 22), 3
    rng = np.random.default_rng(2)
    embeds = [(rng.standard_normal((1, n + steps, cfg["hidden"])) * 0.5).astype(np.float32) for n in lengths]
    positions = [_qwen_positions(n + steps) for n in lengths]
    dec = _decoder(graph, cfg, 2, max(lengths) + steps)
    for b, n in enumerate(lengths):
        cos, sin = rotary_rows(positions[b][:, :n], cfg["head_dim"], cfg["theta"], cfg["mrope_section"])
        dec.prefill(b, embeds[b][:, :n], cos, sin)
    for k in range(steps):
        rows = [rotary_rows(positions[b][:, n + k:n + k + 1], cfg["head_dim"], cfg["theta"], cfg["mrope_section"])
                for b, n in enumerate(lengths)]
        step = np.concatenate([embeds[b][:, n + k:n + k + 1] for b, n in enumerate(lengths)], 0)
        got = dec.decode(step, np.concatenate([r[0] for r in rows]), np.concatenate([r[1] for r in rows]))
        for b, n in enumerate(lengths):
            want = _qwen_reference(model, embeds[b][:, :n + k + 1], positions[b][:, :n + k + 1])
            np.testing.assert_allclose(got[b], want, atol=ATOL, rtol=0)
