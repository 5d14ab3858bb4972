"""The IO-bound ping-pong KV cache gives the same logits as recomputing the whole sequence."""

import numpy as np
import onnxruntime as ort

from coverpruner.engines.ort_decoder import OrtDecoderSession
from tests.runtime import fake_decoder


def test_incremental_decode_matches_full_recompute(tmp_path):
    layers, d, heads, hd, vocab = 2, 8, 2, 4, 11
    w = fake_decoder.build(tmp_path / "dec.onnx", layers, d, heads, hd, vocab)
    sess = ort.InferenceSession(str(tmp_path / "dec.onnx"), providers=["CPUExecutionProvider"])
    dec = OrtDecoderSession(sess, layers, heads, hd, vocab)
    rng = np.random.default_rng(1)
    for capacity, prompt_len, steps in ((9, 5, 4), (30, 3, 6)):  # second request reuses the buffers
        dec.reset(capacity)
        emb = rng.standard_normal((prompt_len + steps, d)).astype(np.float32)
        pos = np.arange(prompt_len + steps) * 3 + 1  # non-trivial positions reach the graph
        got = dec.forward(emb[None, :prompt_len], pos[None, :prompt_len]).copy()
        want = fake_decoder.reference_logits(w, layers, heads, hd, emb[:prompt_len], pos[:prompt_len])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
        for t in range(prompt_len, prompt_len + steps):
            got = dec.forward(emb[None, t:t + 1], pos[None, t:t + 1]).copy()
            want = fake_decoder.reference_logits(w, layers, heads, hd, emb[:t + 1], pos[:t + 1])
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
        assert dec.length == prompt_len + steps


def test_capacity_overflow_is_a_clear_error(tmp_path):
    fake_decoder.build(tmp_path / "dec.onnx", 1, 8, 2, 4, 11)
    sess = ort.InferenceSession(str(tmp_path / "dec.onnx"), providers=["CPUExecutionProvider"])
    dec = OrtDecoderSession(sess, 1, 2, 4, 11)
    dec.reset(2)
    dec.forward(np.zeros((1, 2, 8), np.float32), np.zeros((1, 2), np.int64))
    try:
        dec.forward(np.zeros((1, 1, 8), np.float32), np.zeros((1, 1), np.int64))
    except ValueError as exc:
        assert "KV cache holds 2 tokens; 3 requested" in str(exc)
    else:
        raise AssertionError("overflow not detected")
