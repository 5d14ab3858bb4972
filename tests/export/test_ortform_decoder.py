"""The ORT-form decoder (export/ortform + engines/ort_form_decoder.py) against transformers on the tiny presets.

References are transformers' own text models run on the full sequence each step with positions written out
here (Qwen2.5-VL: T/H/W of a pruned 5x6 grid; LLaVA: compact 0..L-1), independent of engines/rotary.py. The graph
is driven by the runtime's engines (OrtFormDecoderSession: one request, snapshot/restore; BatchDecoder: ragged
requests joining and leaving).
Tolerance 1e-4 absolute on logits of magnitude ~5: both sides are float32, only the summation order differs
(fused GQA / SkipSimplifiedLayerNormalization kernels vs torch); measured ~5e-6.
"""

from __future__ import annotations

import json

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


def _dims(model) -> dict:
    t = model.config.text_config
    return dict(hidden=t.hidden_size, layers=t.num_hidden_layers, kv_heads=t.num_key_value_heads,
                head_dim=getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads, vocab=t.vocab_size)


def _session(graph):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(str(graph), so, providers=["CPUExecutionProvider"])


def _rotary(graph) -> dict:
    """The rotary record the export writes next to the graph (the family adapter's theta / mrope_section)."""
    return json.loads(graph.with_suffix(".rotary.json").read_text())


def _build(checkpoint, out_dir):
    from coverpruner.export.ortform.decoder_graph import build_ort_decoder
    from coverpruner.families import family_for_model_type
    from transformers import AutoConfig

    family = family_for_model_type(AutoConfig.from_pretrained(str(checkpoint)).model_type)
    weights = family.decoder_weights(family.load_model(checkpoint, "float32"))
    graph = build_ort_decoder(weights, out_dir / "decoder.onnx")
    graph.with_suffix(".rotary.json").write_text(json.dumps(weights.rotary))
    return graph


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    from transformers import Qwen2_5_VLForConditionalGeneration

    from coverpruner.testing.qwen_checkpoints import write_qwen_checkpoint

    ckpt = write_qwen_checkpoint(tmp_path_factory.mktemp("qwen_ckpt"), "qwen2.5-vl-tiny")
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32).eval()
    return model, _build(ckpt, tmp_path_factory.mktemp("qwen_ortform")), _dims(model)


@pytest.fixture(scope="module")
def llava(tiny_checkpoint, tmp_path_factory):
    from transformers import LlavaForConditionalGeneration

    model = LlavaForConditionalGeneration.from_pretrained(tiny_checkpoint, dtype=torch.float32).eval()
    return model, _build(tiny_checkpoint, tmp_path_factory.mktemp("llava_ortform")), _dims(model)


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


def _loop(graph, d):
    """The runtime's DecoderLoop over the ORT-form graph (engines/ort_form_decoder.py)."""
    from coverpruner.engines.ort_form_decoder import OrtFormDecoderSession

    return OrtFormDecoderSession(_session(graph), d["layers"], d["kv_heads"], d["head_dim"], d["vocab"],
                                 _rotary(graph))


def _batch(graph, d, max_batch, capacity):
    from coverpruner.engines.ort_form_decoder import BatchDecoder

    return BatchDecoder(_session(graph), max_batch, capacity, d["layers"], d["kv_heads"], d["head_dim"],
                        _rotary(graph))


def test_qwen_mrope_prefill_and_decode_match_transformers(qwen):
    model, graph, d = qwen
    prompt, steps = 40, 3
    pos = _qwen_positions(prompt + steps)
    embeds = (np.random.default_rng(0).standard_normal((1, prompt + steps, d["hidden"])) * 0.5).astype(np.float32)
    dec = _loop(graph, d)
    dec.reset(prompt + steps)
    got = dec.forward(embeds[:, :prompt], pos[:, None, :prompt])
    np.testing.assert_allclose(got, _qwen_reference(model, embeds[:, :prompt], pos[:, :prompt]), atol=ATOL, rtol=0)
    for k in range(prompt, prompt + steps):
        got = dec.forward(embeds[:, k:k + 1], pos[:, None, k:k + 1])
        np.testing.assert_allclose(got, _qwen_reference(model, embeds[:, :k + 1], pos[:, :k + 1]), atol=ATOL, rtol=0)
    assert dec.length == prompt + steps


def test_ir_version_is_the_lowest_its_opsets_need(llava):
    """An onnx package newer than the onnxruntime that loads the graph stamps an IR version that runtime refuses
    (seen on a GPU image: onnx 1.23 wrote IR 14, onnxruntime 1.30 reads <= 13): the ORT form records the lowest
    IR version its opsets need instead."""
    import onnx

    _, graph, _ = llava
    model = onnx.load(str(graph), load_external_data=False)
    opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    assert opsets["ai.onnx"] == 23 and model.ir_version == 11, (opsets, model.ir_version)


def test_llava_prefill_and_decode_match_transformers(llava):
    model, graph, d = llava
    prompt, steps = 30, 3
    embeds = (np.random.default_rng(1).standard_normal((1, prompt + steps, d["hidden"])) * 0.5).astype(np.float32)
    dec = _loop(graph, d)
    dec.reset(prompt + steps)
    np.testing.assert_allclose(dec.forward(embeds[:, :prompt], np.arange(prompt)[None]),
                               _llava_reference(model, embeds[:, :prompt]), atol=ATOL, rtol=0)
    for k in range(prompt, prompt + steps):
        np.testing.assert_allclose(dec.forward(embeds[:, k:k + 1], np.array([[k]])),
                                   _llava_reference(model, embeds[:, :k + 1]), atol=ATOL, rtol=0)


def test_snapshot_restore_continues_like_the_uninterrupted_run(llava):
    """restore(snapshot of a prefix) then the rest == the whole run; the snapshot is a copy (later forwards leave
    it unchanged)."""
    model, graph, d = llava
    embeds = (np.random.default_rng(3).standard_normal((1, 24, d["hidden"])) * 0.5).astype(np.float32)
    dec = _loop(graph, d)
    dec.reset(24)
    dec.forward(embeds[:, :16], np.arange(16)[None])
    snap = dec.snapshot()
    keys0 = snap.keys[0].copy()
    assert snap.length == 16 and snap.keys[0].shape == (1, d["kv_heads"], 16, d["head_dim"])
    want = dec.forward(embeds[:, 16:], np.arange(16, 24)[None]).copy()
    dec.reset(24)
    dec.forward(embeds[:, :4], np.arange(4)[None])  # other contents, then the prefix back
    dec.restore(snap)
    assert dec.length == 16
    np.testing.assert_array_equal(dec.forward(embeds[:, 16:], np.arange(16, 24)[None]), want)
    np.testing.assert_array_equal(snap.keys[0], keys0)
    small = _loop(graph, d)
    small.reset(8)
    with pytest.raises(ValueError, match="holds 8 tokens"):
        small.restore(snap)


def test_batched_decode_of_ragged_requests_equals_each_alone(qwen):
    """Three requests of different prompt lengths join the batch one by one and decode together; the middle one
    leaves after the first step (the last slot moves into its place): every logit equals transformers'."""
    model, graph, d = qwen
    lengths, steps = (37, 22, 29), 3
    rng = np.random.default_rng(2)
    embeds = [(rng.standard_normal((1, n + steps, d["hidden"])) * 0.5).astype(np.float32) for n in lengths]
    positions = [_qwen_positions(n + steps) for n in lengths]
    dec = _batch(graph, d, 3, max(lengths) + steps)
    handles = []
    for b, n in enumerate(lengths):
        h, logits = dec.join(embeds[b][:, :n], positions[b][:, :n])
        np.testing.assert_allclose(logits, _qwen_reference(model, embeds[b][:, :n], positions[b][:, :n]),
                                   atol=ATOL, rtol=0)
        handles.append(h)
    with pytest.raises(ValueError, match="batch is full"):
        dec.join(embeds[0][:, :3], positions[0][:, :3])
    active = {0, 1, 2}
    for k in range(steps):
        feeds = {handles[b]: (embeds[b][0, lengths[b] + k], positions[b][:, lengths[b] + k]) for b in sorted(active)}
        got = dec.step(feeds)
        for b in sorted(active):
            n = lengths[b]
            want = _qwen_reference(model, embeds[b][:, :n + k + 1], positions[b][:, :n + k + 1])
            np.testing.assert_allclose(got[handles[b]], want, atol=ATOL, rtol=0)
        if k == 0:
            dec.leave(handles[1])
            active.discard(1)
            assert dec.active == [handles[0], handles[2]] and dec.length(handles[2]) == lengths[2] + 1


def test_requests_admitted_together_start_in_one_step_as_each_alone(qwen):
    """BatchDecoder.admit takes four requests at once (one starting from a restored prefix snapshot of its own
    rows, one of a single row) without their last prompt rows; one step with those last rows gives each one's
    first logits and the next step its second: all equal transformers' on its own full sequence, and a
    request's snapshot holds what a prefill alone writes."""
    model, graph, d = qwen
    lengths = (9, 37, 1, 22)
    rng = np.random.default_rng(5)
    embeds = [(rng.standard_normal((n + 1, d["hidden"])) * 0.5).astype(np.float32) for n in lengths]
    positions = [_qwen_positions(n + 1) for n in lengths]
    alone = _loop(graph, d)
    alone.reset(64)
    alone.forward(embeds[3][None, :15], positions[3][:, None, :15])
    prefix = alone.snapshot()  # request 3 restores its first 15 rows and prefills 15..20
    dec = _batch(graph, d, 4, 64)
    inputs = [(e[:n - 1], p[:, :n - 1]) for e, p, n in zip(embeds, positions, lengths)]
    inputs[3] = (embeds[3][15:21], positions[3][:, 15:21])
    handles = dec.admit(inputs, [None, None, None, prefix])
    assert [dec.length(h) for h in handles] == [n - 1 for n in lengths]
    for k in (0, 1):  # the last prompt rows, then one more row each
        got = dec.step({h: (embeds[b][n - 1 + k], positions[b][:, n - 1 + k])
                        for b, (h, n) in enumerate(zip(handles, lengths))})
        for b, n in enumerate(lengths):
            want = _qwen_reference(model, embeds[b][None, :n + k], positions[b][:, :n + k])
            np.testing.assert_allclose(got[handles[b]], want, atol=ATOL, rtol=0)
    snap = dec.snapshot(handles[1])
    one = _loop(graph, d)
    one.reset(64)
    one.forward(embeds[1][None, :38], positions[1][:, None, :38])
    np.testing.assert_allclose(snap.keys[0], one.snapshot().keys[0], atol=ATOL, rtol=0)
    assert snap.length == 38


class _CountingSession:
    """The decoder session, counting its runs (how many calls an admission takes)."""

    def __init__(self, session):
        self.session, self.runs = session, 0

    def get_inputs(self):
        return self.session.get_inputs()

    def io_binding(self):
        return self.session.io_binding()

    def run_with_iobinding(self, binding):
        self.runs += 1
        return self.session.run_with_iobinding(binding)


def _admit_and_check(dec, session, reference, embeds, positions, calls):
    """Admit every request without its last row (``calls`` decoder runs), then two steps; each request's logits
    must equal ``reference(b, n)`` (transformers on its first n rows)."""
    lengths = [len(e) - 2 for e in embeds]
    handles = dec.admit([(e[:n - 1], p[:, :n - 1]) for e, p, n in zip(embeds, positions, lengths)])
    assert session.runs == calls and [dec.length(h) for h in handles] == [n - 1 for n in lengths]
    for k in (0, 1):
        got = dec.step({h: (embeds[b][n - 1 + k], positions[b][:, n - 1 + k])
                        for b, (h, n) in enumerate(zip(handles, lengths))})
        for b, n in enumerate(lengths):
            np.testing.assert_allclose(got[handles[b]], reference(b, n + k), atol=ATOL, rtol=0)


def test_empty_requests_prefill_in_one_padded_call_as_each_alone(llava):
    """Three requests from empty slots, the longest not first: ONE decoder call prefills them (right-padded first
    prompt, KVSlots.run_prompts), and their answers start as transformers' on each one's own sequence."""
    from coverpruner.engines.ort_form_decoder import BatchDecoder

    model, graph, d = llava
    rng = np.random.default_rng(7)
    embeds = [(rng.standard_normal((n + 2, d["hidden"])) * 0.5).astype(np.float32) for n in (12, 31, 5)]
    positions = [np.arange(len(e))[None] for e in embeds]
    session = _CountingSession(_session(graph))
    dec = BatchDecoder(session, 4, 64, d["layers"], d["kv_heads"], d["head_dim"], _rotary(graph))
    _admit_and_check(dec, session, lambda b, n: _llava_reference(model, embeds[b][None, :n]), embeds, positions, 1)


def test_prompts_with_positions_of_their_own_prefill_alone(qwen):
    """M-RoPE: two requests whose positions are prefixes of one layout share a call; a third whose positions
    differ (text-only T=H=W) runs alone (one shared rotary table cannot serve both): 2 calls, answers as
    transformers'."""
    from coverpruner.engines.ort_form_decoder import BatchDecoder

    model, graph, d = qwen
    rng = np.random.default_rng(8)
    embeds = [(rng.standard_normal((n + 2, d["hidden"])) * 0.5).astype(np.float32) for n in (20, 33, 26)]
    positions = [_qwen_positions(len(embeds[0])), _qwen_positions(len(embeds[1])),
                 np.repeat(np.arange(len(embeds[2]))[None], 3, axis=0)]
    session = _CountingSession(_session(graph))
    dec = BatchDecoder(session, 4, 64, d["layers"], d["kv_heads"], d["head_dim"], _rotary(graph))
    _admit_and_check(dec, session, lambda b, n: _qwen_reference(model, embeds[b][None, :n], positions[b][:, :n]),
                     embeds, positions, 2)


def test_chunked_prefill_beside_decodes_matches_transformers(qwen):
    """Issue 35's chunked prefill: request A decodes while B (37 M-RoPE rows) and C (29 rows after a restored prefix
    of 16, appended as two 8-row blocks) prefill in chunks of up to 8 rows across steps: a chunk's rows but its
    last through ``extend``, its last row in the shared ``step`` beside A's token (every slot is fed one row a
    step). A's logits every step and B's and C's first logits equal transformers' on each one's own sequence;
    ``fork`` then copies B into a new slot whose next step equals B's own."""
    model, graph, d = qwen
    rng = np.random.default_rng(11)
    total = {"A": 12, "B": 37, "C": 45}
    embeds = {k: (rng.standard_normal((n + 12, d["hidden"])) * 0.5).astype(np.float32) for k, n in total.items()}
    pos = {k: _qwen_positions(n + 12) for k, n in total.items()}
    ref = lambda k, n: _qwen_reference(model, embeds[k][None, :n], pos[k][:, :n])  # noqa: E731
    alone = _loop(graph, d)
    alone.reset(64)
    alone.forward(embeds["C"][None, :16], pos["C"][:, None, :16])
    prefix = alone.snapshot()
    dec = _batch(graph, d, 4, 64)
    h = {"A": dec.open()}
    dec.extend([(h["A"], embeds["A"][:11], pos["A"][:, :11])])
    h["B"], h["C"] = dec.open(), dec.open()
    for cut in (slice(0, 8), slice(8, 16)):
        dec.append(h["C"], tuple(a[:, :, cut] for a in prefix.keys), tuple(a[:, :, cut] for a in prefix.values))
    done = {"A": 11, "B": 0, "C": 16}
    first = {}
    while len(first) < 3:
        chunks = {k: min(done[k] + 8, total[k]) for k in ("B", "C") if done[k] < total[k]}
        dec.extend([(h[k], embeds[k][done[k]:stop - 1], pos[k][:, done[k]:stop - 1])
                    for k, stop in chunks.items() if stop - 1 > done[k]])
        rows = {k: chunks.get(k, done[k] + 1) - 1 for k in h}  # A and finished ones: their next row
        got = dec.step({h[k]: (embeds[k][r], pos[k][:, r]) for k, r in rows.items()})
        for k, r in rows.items():
            done[k] = r + 1
            if k == "A" or done[k] == total[k]:
                np.testing.assert_allclose(got[h[k]], ref(k, r + 1), atol=ATOL, rtol=0)
                first.setdefault(k, r + 1)
    assert first["B"] == 37 and first["C"] == 45
    (fork,) = dec.fork(h["B"], 1)
    rows = {k: done[k] for k in h}
    got = dec.step({**{h[k]: (embeds[k][r], pos[k][:, r]) for k, r in rows.items()},
                    fork: (embeds["B"][rows["B"]], pos["B"][:, rows["B"]])})
    np.testing.assert_array_equal(got[fork], got[h["B"]])
    np.testing.assert_allclose(got[h["B"]], ref("B", rows["B"] + 1), atol=ATOL, rtol=0)
