"""The request loop's stages, each called alone on the tiny LLaVA engine dir, and composed == generate.

request -> native_sequence -> select -> prefill -> decode (one token). The expectations are written from the
LLaVA-1.5 rules (every image row a candidate, native positions 0..L-1, compact pruned positions 0..L'-1, the
t-th generated token at L' + t), not read back from the family runtime.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from coverpruner.engine_dir import graph_spec
from coverpruner.engines.ort import OrtSessionFactory
from coverpruner.runtime import METHODS, GenerationOptions, OptionError, PromptError, Request
from coverpruner.runtime.result import TIMING_KEYS
from coverpruner.runtime.sampling import Sampler
from tests.literal_peers import cdpruner_reference, dart_reference
from tests.literal_selection import assert_same_or_not_worse, divprune_reference

Q = "What is shown in this image?"


@pytest.fixture(scope="module")
def native(pipe, demo_image):
    return pipe.native_sequence(pipe.request(demo_image, Q, budget=16))


def test_request_holds_validated_options(pipe, demo_image):
    req = pipe.request(demo_image, Q, budget="full", tau=0.5, max_new_tokens=3, temperature=0.7, seed=4)
    assert isinstance(req, Request) and req.budget is None and req.tau == 0.5 and req.seed == 4
    assert req.stop_ids == frozenset(pipe.eos_ids) and req.options == pipe.family_options()
    assert pipe.request(demo_image, Q, ignore_eos=True).stop_ids == frozenset()
    assert pipe.request(demo_image, Q).tau == pipe.manifest.defaults.get("tau", 0.3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.budget = 3
    for kw, msg in ((dict(budget=0), "budget must be"), (dict(method="nope"), "unknown method"),
                    (dict(max_new_tokens=0), "max_new_tokens"), (dict(top_p=0), "top_p"),
                    (dict(colour="red"), "unknown option")):
        with pytest.raises(OptionError, match=msg):
            pipe.request(demo_image, Q, **kw)


def test_options_object_equals_keywords(pipe, demo_image):
    """Issue 25: options pass by name; a GenerationOptions (options=) is the same request as its keywords, and a
    keyword beside it replaces that field. Request holds no image / prompt beside its conversation."""
    opts = GenerationOptions(budget=16, tau=0.5, max_new_tokens=3, seed=4, ignore_eos=True)
    a = pipe.request(demo_image, Q, options=opts)
    b = pipe.request(demo_image, Q, budget=16, tau=0.5, max_new_tokens=3, seed=4, ignore_eos=True)
    fields = ("budget", "method", "tau", "max_new_tokens", "sampling", "stop_ids", "options", "demand")
    assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields]
    assert a.conversation.messages == b.conversation.messages == [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": Q}]}]
    assert a.conversation.images == [demo_image] and not hasattr(a, "prompt") and not hasattr(a, "image")
    c = pipe.request(demo_image, Q, options=opts, budget=8)
    assert (c.budget, c.tau, c.max_new_tokens) == (8, 0.5, 3)
    with pytest.raises(TypeError):
        pipe.request(demo_image, Q, 16)  # options are keywords, never positions


def test_native_sequence_is_the_full_sequence(pipe, native):
    ids, vis = native.layout.input_ids, native.layout.visual_positions
    image_id = pipe.manifest.token_ids["image_token_id"]
    n = pipe.manifest.max_visual_tokens  # LLaVA-1.5: a fixed n, every row a candidate
    assert len(native.spans[0].candidates) == n and len(native.spans[0].rows) == n and len(vis) == n
    assert native.length == len(ids) == native.embeds.shape[0] == native.positions.shape[1]
    np.testing.assert_array_equal(vis, np.flatnonzero(ids == image_id))
    np.testing.assert_array_equal(native.candidates_of(0), vis)
    np.testing.assert_array_equal(native.positions, np.arange(native.length)[None])  # LLaVA: [1, L], 0..L-1
    assert native.embeds.dtype == pipe.float_dtype and native.embeds.shape[1] == pipe.manifest.dims["hidden_size"]
    np.testing.assert_array_equal(native.embeds[vis], native.spans[0].rows)
    text = np.flatnonzero(ids != image_id)
    np.testing.assert_array_equal(native.embeds[text], pipe.embed(ids[text]))
    np.testing.assert_array_equal(native.is_text, ids != image_id)
    instr = native.layout.instruction_positions
    assert len(instr) and set(instr.tolist()) <= set(text.tolist())
    assert set(native.timings) == {"preprocess", "vision", "embed"}


def test_native_sequence_rejects_an_empty_prompt(pipe, demo_image):
    with pytest.raises(PromptError, match="prompt is empty"):
        pipe.native_sequence(pipe.request(demo_image, "  "))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("budget", [1, 16, 143, 500])
def test_select_keeps_min_budget_n_ascending(pipe, native, demo_image, method, budget):
    sel = pipe.select(pipe.request(demo_image, Q, budget=budget, method=method, seed=7), native)
    img, span = sel.images[0], native.spans[0]  # the one image
    n = len(span.candidates)
    assert img.keep.dtype == np.int64 and len(img.keep) == min(budget, n)
    assert np.all(np.diff(img.keep) > 0) and img.keep[0] >= 0 and img.keep[-1] < n
    np.testing.assert_array_equal(img.kept_rows, span.candidates[img.keep])  # LLaVA: nothing always kept
    if method in ("coverpruner", "attention", "cdpruner"):
        assert img.relevance.shape == (n,) and img.relevance.dtype == np.float32
        assert set(sel.timings) == {"probe", "select"}
    else:
        assert img.relevance is None and set(sel.timings) == {"select"}
    feats = span.features.astype(np.float32)
    if method == "coverpruner":
        assert_same_or_not_worse(img.keep, feats, img.relevance, budget, pipe.manifest.defaults.get("tau", 0.3))
    elif method == "divprune":
        np.testing.assert_array_equal(img.keep, divprune_reference(feats, budget))
    elif method == "dart":
        np.testing.assert_array_equal(img.keep, dart_reference(feats, budget))
    elif method == "cdpruner":
        np.testing.assert_array_equal(img.keep, cdpruner_reference(feats, img.relevance, budget))


def test_select_full_budget_keeps_every_row(pipe, native, demo_image):
    sel = pipe.select(pipe.request(demo_image, Q, budget="full"), native)
    np.testing.assert_array_equal(sel.images[0].keep, np.arange(len(native.spans[0].candidates)))
    np.testing.assert_array_equal(sel.images[0].kept_rows, np.arange(len(native.spans[0].rows)))
    assert sel.images[0].relevance is None and sel.timings == {}


def _plain_decoder(pipe):
    """The dir's decoder.onnx in its own ORT session (same factory settings as the pipe fixture), run without
    IO binding or the KV-cache loop."""
    return OrtSessionFactory("cpu", 1, manifest=pipe.manifest.raw)("decoder", graph_spec(pipe.manifest, "decoder").path)


def test_prefill_runs_the_pruned_sequence(pipe, native, demo_image):
    req = pipe.request(demo_image, Q, budget=16, max_new_tokens=5)
    sel = pipe.select(req, native)
    pre = pipe.prefill(req, native, sel)
    ids = native.layout.input_ids
    text = np.flatnonzero(ids != pipe.manifest.token_ids["image_token_id"])
    want_rows = np.sort(np.concatenate([text, native.layout.visual_positions[sel.images[0].keep]]))
    np.testing.assert_array_equal(pre.rows, want_rows)
    L1 = len(want_rows)
    assert pre.length == L1 == len(text) + 16 and pipe.decoder.length == L1
    assert pre.logits.shape == (pipe.manifest.dims["vocab_size"],)
    np.testing.assert_array_equal(pre.state.pruned, np.arange(L1)[None])  # LLaVA: compact 0..L'-1
    assert pre.state.step == 0 and pre.state.max_tokens == 5 and pre.state.limit == "length"
    assert set(pre.timings) == {"prefill"}

    dims = pipe.manifest.dims
    empty = {f"past_key_values.{i}.{kv}": np.zeros((1, dims["num_kv_heads"], 0, dims["head_dim"]), np.float32)
             for i in range(dims["num_layers"]) for kv in ("key", "value")}
    (logits,) = _plain_decoder(pipe).run(["logits"], {
        "inputs_embeds": native.embeds[want_rows][None], "position_ids": np.arange(L1, dtype=np.int64)[None],
        "attention_mask": np.ones((1, L1), np.int64), **empty})
    # the same graph on the same inputs in an identically configured CPU session: the same floats
    np.testing.assert_array_equal(pre.logits, logits[0, -1])


def test_decode_feeds_each_token_at_the_next_position(pipe, native, demo_image, monkeypatch):
    req = pipe.request(demo_image, Q, budget=16, max_new_tokens=5)
    pre = pipe.prefill(req, native, pipe.select(req, native))
    seen = []
    forward = pipe.decoder.forward
    monkeypatch.setattr(pipe.decoder, "forward", lambda e, p: seen.append((e.copy(), p.copy())) or forward(e, p))
    token = int(np.argmax(pre.logits))
    for t in range(3):
        logits = pipe.decode(pre.state, token)
        assert pre.state.step == t + 1 and pipe.decoder.length == pre.length + t + 1
        assert logits.shape == pre.logits.shape
        emb, pos = seen[-1]
        np.testing.assert_array_equal(pos, [[pre.length + t]])  # LLaVA: the t-th generated token at L' + t
        np.testing.assert_array_equal(emb[0], pipe.embed(np.array([token])))
        token = int(np.argmax(logits))


def _composed(pipe, req):
    """generate written out from the stages: greedy or sampled, stop ids, the length limit."""
    native = pipe.native_sequence(req)
    sel = pipe.select(req, native)
    pre = pipe.prefill(req, native, sel)
    sampler = Sampler(req.sampling)
    tokens = [sampler(pre.logits)]
    while tokens[-1] not in req.stop_ids and len(tokens) < pre.state.max_tokens:
        tokens.append(sampler(pipe.decode(pre.state, tokens[-1])))
    return native, sel, pre, tokens


@pytest.mark.parametrize("kw", [dict(budget=16), dict(budget="full"), dict(budget=40, method="divprune"),
                                dict(budget=24, method="random", temperature=0.9, top_p=0.8, seed=11),
                                dict(budget=16, max_new_tokens=12, ignore_eos=True)])
def test_stages_composed_equal_generate(pipe, demo_image, kw):
    kw = {"max_new_tokens": 8, **kw}
    native, sel, pre, tokens = _composed(pipe, pipe.request(demo_image, Q, **kw))
    got = pipe.generate(demo_image, Q, **kw)
    assert got.token_ids == tokens
    np.testing.assert_array_equal(got.kept_indices, sel.images[0].keep)
    assert (got.relevance is None) == (sel.images[0].relevance is None)
    if sel.images[0].relevance is not None:
        np.testing.assert_array_equal(got.relevance, sel.images[0].relevance)
    assert got.prompt_tokens == native.length and got.prefill_tokens == pre.length
    assert got.num_visual_tokens == len(native.spans[0].candidates)
    assert tuple(got.timings) == TIMING_KEYS

