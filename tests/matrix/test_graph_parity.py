"""Every exported graph of each family's tiny engine dir (fp32, onnxruntime CPU) against the transformers model.

Written once for every family of the matrix; the inputs, references and tolerances of each case are the family's
(tests/families/<family>/matrix.py: GRAPH_CASES + graph_case, DECODER_CASES + decoder_case, built on its HF
reference helpers). Vision, embed, probe and the selector graph are one run each (GraphCase); the decoder is a
prefill plus greedy decode steps fed HF's token (DecoderCase). The family's own graph facts that are not "graph ==
HF" (NeXT's packing alone, Qwen's host window tables, ...) stay in its quirk folder.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytestmark = pytest.mark.slow
pytest.importorskip("torch", reason="the references run the PyTorch model")


def _session(path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_graph_matches_hf(family, request, graph_case):
    graph = graph_case.split("-")[0]
    case = family.facts.graph_case(family, request, graph_case)
    sess = family.memo(("session", graph), lambda: _session(family.export / f"{graph}.onnx"))
    got = sess.run(None, case.feed)[0]  # the graph's first output (a vision graph may add DeepStack levels)
    if case.post is not None:
        got = case.post(got)
    assert got.shape == np.shape(case.want)
    np.testing.assert_allclose(got, case.want, rtol=case.rtol, atol=case.atol)
    if case.check is not None:
        case.check(got, case.want, sess)


def test_decoder_matches_hf(family, request, decoder_case):
    case = family.facts.decoder_case(family, request, decoder_case)
    sess = family.memo(("session", "decoder"), lambda: _session(family.export / "decoder.onnx"))
    manifest = json.loads((family.export / "manifest.json").read_text())
    dims, record = manifest["dims"], manifest["graphs"]["decoder"]
    batch, length = case.mask.shape
    # the KV layers and the states that are not KV (contract v5; every layer has KV and none has states otherwise)
    kv_layers = record.get("kv_layers", list(range(dims["num_layers"])))
    names = [f"past_key_values.{i}.{kind}" for i in kv_layers for kind in ("key", "value")]
    past = [np.zeros((batch, dims["num_kv_heads"], 0, dims["head_dim"]), np.float32) for _ in names]
    for state in record.get("states", []):  # a prefill starts from zero states
        names += [f"past_key_values.{i}.{state['name']}" for i in state["layers"]]
        past += [np.zeros((batch, *state["shape"]), state["dtype"]) for _ in state["layers"]]
    embeds, positions, mask, tokens = case.embeds, case.positions, case.mask, []
    for step in range(case.steps + 1):
        feed = {"inputs_embeds": embeds, "attention_mask": mask, "position_ids": positions}
        for name, rows in (case.extras or {}).items():  # decoder extras: their rows at prefill, zeros after
            feed[name] = rows if step == 0 else np.zeros((batch, 1, rows.shape[-1]), rows.dtype)
        if case.blocks is not None:  # contract v5: the prefill rows' blocks; a decode row is text
            feed["attention_blocks"] = case.blocks if step == 0 else np.full((batch, 1), -1, np.int64)
        feed.update(zip(names, past))
        logits, *past = sess.run(None, feed)
        want = case.hf_logits(step, tokens[-1] if step else None)
        assert logits.shape == (batch, 1, dims["vocab_size"])
        np.testing.assert_allclose(logits[:, -1], want, rtol=0, atol=case.atol, err_msg=f"step {step}")
        assert past[0].shape == (batch, dims["num_kv_heads"], length, dims["head_dim"])
        if step == 0 and case.check_present is not None:
            case.check_present(past)
        greedy = want.argmax(-1)
        assert (logits[:, -1].argmax(-1) == greedy).all(), f"greedy tokens diverge at step {step}: {tokens}"
        tokens.append(int(greedy[0]))
        if step < case.steps:  # both sides continue with the same token (HF's greedy choice)
            embeds, positions = case.step_inputs(step + 1, tokens[-1])
            length += 1
            mask = np.ones((1, length), np.int64)
    assert len(set(tokens)) >= case.min_distinct_tokens, f"constant answer {tokens}: the test would be weak"
