"""OrtDecoderSession's snapshot / restore of the cached prefix: the snapshot holds what the decoder graph itself
returns as present.* for the prefix, and restore-then-forward continues exactly as the uninterrupted run."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from coverpruner.engines.interfaces import DecoderLoop, KVSnapshot
from coverpruner.engines.ort_decoder import OrtDecoderSession
from tests.runtime import fake_decoder

LAYERS, D, HEADS, HD, VOCAB = 2, 8, 2, 4, 11


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    """(the fake decoder's ORT session, its weights for the numpy twin fake_decoder.reference_logits)."""
    path = tmp_path_factory.mktemp("fake_decoder") / "dec.onnx"
    weights = fake_decoder.build(path, LAYERS, D, HEADS, HD, VOCAB)
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]), weights


@pytest.fixture(scope="module")
def session(graph):
    return graph[0]


def _tokens(n, seed=3):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, D)).astype(np.float32), np.arange(n, dtype=np.int64) * 2 + 1


def _run_steps(dec, emb, pos, start, stop):
    """Feed tokens start..stop-1 one at a time -> their logits [stop-start, V] (copies)."""
    return np.stack([dec.forward(emb[None, t:t + 1], pos[None, t:t + 1]).copy() for t in range(start, stop)])


def test_the_ort_session_is_a_decoder_loop(session):
    assert isinstance(OrtDecoderSession(session, LAYERS, HEADS, HD, VOCAB), DecoderLoop)


def test_snapshot_holds_the_graphs_own_present_arrays(session):
    """Independent of the IO binding: a plain session.run over the same prefix with empty pasts returns
    present.{i}.key/value [1,H,P,hd]; the snapshot must hold exactly those."""
    emb, pos = _tokens(7)
    dec = OrtDecoderSession(session, LAYERS, HEADS, HD, VOCAB)
    dec.reset(12)
    dec.forward(emb[None, :5], pos[None, :5])
    dec.forward(emb[None, 5:6], pos[None, 5:6])  # an odd step count leaves the prefix in the second buffer
    dec.forward(emb[None, 6:7], pos[None, 6:7])
    snap = dec.snapshot()
    empty = {f"past_key_values.{i}.{kv}": np.zeros((1, HEADS, 0, HD), np.float32)
             for i in range(LAYERS) for kv in ("key", "value")}
    names = [o.name for o in session.get_outputs()]
    outs = dict(zip(names, session.run(names, {"inputs_embeds": emb[None], "position_ids": pos[None],
                                                "attention_mask": np.ones((1, 7), np.int64), **empty})))
    assert snap.length == 7 and len(snap.keys) == len(snap.values) == LAYERS
    for i in range(LAYERS):
        # the fake graph's present is a Concat of projections: the cached path and the one-shot path compute
        # each token's projection from the same row with the same MatMul, so the arrays agree to rounding
        np.testing.assert_allclose(snap.keys[i], outs[f"present.{i}.key"], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(snap.values[i], outs[f"present.{i}.value"], rtol=1e-6, atol=1e-6)
    assert snap.nbytes == 2 * LAYERS * HEADS * 7 * HD * 4


@pytest.mark.parametrize("prefix", [0, 4, 5])
def test_restore_then_forward_equals_the_uninterrupted_run(graph, prefix):
    session, weights = graph
    emb, pos = _tokens(10)
    dec = OrtDecoderSession(session, LAYERS, HEADS, HD, VOCAB)
    dec.reset(10)
    if prefix:
        dec.forward(emb[None, :prefix - 1], pos[None, :prefix - 1])
        dec.forward(emb[None, prefix - 1:prefix], pos[None, prefix - 1:prefix])
    snap = dec.snapshot()
    kept = [a.copy() for a in (*snap.keys, *snap.values)]
    want = _run_steps(dec, emb, pos, prefix, 10)
    # later forwards do not touch the snapshot
    for a, b in zip(kept, (*snap.keys, *snap.values)):
        np.testing.assert_array_equal(a, b)

    # the same session after other work, and a fresh session with larger buffers: same logits, bit for bit
    # (same graph, same inputs, same past values and shapes on the same CPU provider)
    dec.reset(10)
    dec.forward(emb[None, 3:9][:, ::-1].copy(), pos[None, :6])
    dec.reset(10)
    other = OrtDecoderSession(session, LAYERS, HEADS, HD, VOCAB)
    other.reset(32)
    for loop in (dec, other):
        loop.restore(snap)
        assert loop.length == prefix
        np.testing.assert_array_equal(_run_steps(loop, emb, pos, prefix, 10), want)
        assert loop.length == 10
    # and both equal the numpy twin of the graph over the whole sequence
    ref = fake_decoder.reference_logits(weights, LAYERS, HEADS, HD, emb, pos)
    np.testing.assert_allclose(want[-1], ref, rtol=1e-4, atol=1e-3)


def test_restore_refuses_a_snapshot_that_does_not_fit(session):
    emb, pos = _tokens(6)
    dec = OrtDecoderSession(session, LAYERS, HEADS, HD, VOCAB)
    dec.reset(8)
    dec.forward(emb[None], pos[None])
    snap = dec.snapshot()
    small = OrtDecoderSession(session, LAYERS, HEADS, HD, VOCAB)
    small.reset(4)
    with pytest.raises(ValueError, match="KV cache holds 4 tokens; the snapshot has 6"):
        small.restore(snap)
    with pytest.raises(ValueError, match="snapshot has 1 key / 1 value layers; the decoder has 2"):
        dec.restore(KVSnapshot(6, snap.keys[:1], snap.values[:1]))
    half = KVSnapshot(6, tuple(k.astype(np.float16) for k in snap.keys), snap.values)
    with pytest.raises(ValueError, match="snapshot array is float16 \\[1, 2, 6, 4\\]; the cache takes float32"):
        dec.restore(half)
    assert dec.length == 6, "a refused restore leaves the cache as it was"
