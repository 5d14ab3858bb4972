"""Decoder state that is not KV (contract v5) in the engines, on the ORT-form decoder of the tiny Qwen3.5 checkpoint
(3 Gated DeltaNet layers with conv and recurrent states, 1 full-attention layer with KV), written straight from the
family's decoder weights. References: transformers' own Qwen3_5TextModel with its hybrid cache, run with positions
written out here.

Tolerance 1e-4 absolute on logits of magnitude ~5: both sides float32, only the summation order differs (ONNX
Runtime's LinearAttention / CausalConvWithState / GroupQueryAttention kernels vs torch); measured ~1e-5.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

ATOL = 1e-4


@pytest.fixture(scope="module")
def model(qwen35_hf):
    return qwen35_hf


@pytest.fixture(scope="module")
def graph(model, tmp_path_factory):
    """The ORT-form decoder of the tiny checkpoint's weights (onnxruntime session) and its rotary record."""
    import onnxruntime as ort

    from coverpruner.export.ortform.decoder_graph import build_ort_decoder
    from coverpruner.families import gated_delta

    weights = gated_delta.decoder_weights(model.model.language_model, model.lm_head)
    path = build_ort_decoder(weights, tmp_path_factory.mktemp("state") / "decoder.onnx", "fp32")
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]), weights.rotary


def _positions(length: int, start: int = 0) -> np.ndarray:
    """[3, length]: text rows, then a 4x5 grid (all three rows differ), then text again."""
    t, h, w = [], [], []
    p = start
    for i in range(length):
        if 6 <= i < 26:
            t.append(start + 6), h.append(start + 6 + (i - 6) // 5), w.append(start + 6 + (i - 6) % 5)
            p = start + 11
        else:
            t.append(p), h.append(p), w.append(p)
            p += 1
    return np.array([t, h, w], np.int64)


def _hf_logits(model, embeds: np.ndarray, positions: np.ndarray, cache=None):
    """HF text model + lm_head on embeds [1,S,d] at positions [3,S], continuing ``cache`` (its hybrid DynamicCache)
    -> (last logits [V], cache)."""
    from transformers import DynamicCache

    lm = model.model.language_model
    cache = DynamicCache(config=lm.config) if cache is None else cache
    with torch.no_grad():
        out = lm(inputs_embeds=torch.from_numpy(embeds), position_ids=torch.from_numpy(positions)[:, None],
                 cache=cache, use_cache=True)
        return model.lm_head(out.last_hidden_state[0, -1]).numpy(), cache


def test_layout_found_in_the_graph(graph):
    from coverpruner.engines.state_buffers import decoder_layout

    kv, states = decoder_layout(graph[0].get_inputs())
    assert kv == (3,)
    assert [(s.layer, s.kind, s.shape, s.dtype) for s in states] == \
        [(i, "conv", (2 * 2 * 16 + 4 * 16, 3), np.float32) for i in range(3)] + \
        [(i, "recurrent", (4, 16, 16), np.float32) for i in range(3)]



def test_manifest_dims_checked_against_the_graph(model, graph):
    """The KV layers and states are read from the graph, so a manifest whose depth or KV geometry disagrees with it
    is named (field, the manifest's value, the graph's) instead of running: 3 state layers + 1 KV layer = 4."""
    from coverpruner.engines.state_buffers import dims_problem

    inputs, cfg = graph[0].get_inputs(), model.config.text_config
    h, hd = cfg.num_key_value_heads, cfg.head_dim
    assert dims_problem(inputs, 4, h, hd) is None
    for layers in (3, 5):
        assert dims_problem(inputs, layers, h, hd) == (f"field dims.num_layers is {layers}; the decoder graph's cache "
                                                       "inputs (past_key_values.N.*) name layers 0..3 (4 layers)")
    assert dims_problem(inputs, 4, h + 1, hd) == (f"field dims.num_kv_heads is {h + 1}; the decoder graph's "
                                                  f"past_key_values.3.key has {h} (axes [B, H_kv, T, hd])")
    assert "field dims.head_dim is 8;" in dims_problem(inputs, 4, h, 8)

def test_session_prefill_decode_snapshot_restore_equal_hf(model, graph):
    """OrtFormDecoderSession: a 70-row prefill in two calls (30 + 40: the second continues from the states the first
    left), a decode step, and a restore of the 30-row snapshot continued again == HF's hybrid cache."""
    from coverpruner.engines.ort_form_decoder import OrtFormDecoderSession

    session, rotary = graph
    rng = np.random.default_rng(0)
    embeds = rng.standard_normal((1, 71, 64)).astype(np.float32)
    positions = _positions(71)
    want, _ = _hf_logits(model, embeds[:, :70], positions[:, :70])
    dec = OrtFormDecoderSession(session, 4, 2, 64, model.config.text_config.vocab_size, rotary)
    dec.reset(128)
    dec.forward(embeds[:, :30], positions[:, None, :30])
    snap = dec.snapshot()
    assert snap.length == 30 and len(snap.keys) == 1 and len(snap.states) == 6
    got = dec.forward(embeds[:, 30:70], positions[:, None, 30:70])
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)
    step_want, _ = _hf_logits(model, embeds, positions)
    np.testing.assert_allclose(dec.forward(embeds[:, 70:], positions[:, None, 70:]), step_want, rtol=0, atol=ATOL)
    dec.reset(128)
    dec.restore(snap)
    np.testing.assert_allclose(dec.forward(embeds[:, 30:70], positions[:, None, 30:70]), want, rtol=0, atol=ATOL)
    with pytest.raises(ValueError, match="decoder states"):
        from coverpruner.engines.interfaces import KVSnapshot

        dec.restore(KVSnapshot(snap.length, snap.keys, snap.values))  # no states: refused in one line


def test_states_updated_in_place_equal_separate_buffers(graph):
    """The engines bind each state as past and present at once (HostStates): ONNX Runtime's CausalConvWithState and
    LinearAttention give bit-identical logits and states to separate past / present buffers."""
    from coverpruner.engines.rotary import rotary_rows
    from coverpruner.engines.state_buffers import HostStates, decoder_layout

    session, rotary = graph
    _, slots = decoder_layout(session.get_inputs())
    rng = np.random.default_rng(1)
    length, capacity = 20, 64
    embeds = rng.standard_normal((1, length, 64)).astype(np.float32)
    cos, sin = rotary_rows(_positions(length), rotary["dim"], rotary["theta"], rotary["mrope_section"], True)
    pad = np.zeros((capacity - length, cos.shape[1]), np.float32)
    base = {"inputs_embeds": embeds, "seqlens_k": np.array([length - 1], np.int32),
            "total_sequence_length": np.array(length, np.int32), "rotary_cos": np.concatenate([cos, pad]),
            "rotary_sin": np.concatenate([sin, pad]), "rotary_row": np.arange(length, dtype=np.int64)[None],
            "past_key_values.3.key": np.zeros((1, 2, capacity, 64), np.float32),
            "past_key_values.3.value": np.zeros((1, 2, capacity, 64), np.float32)}
    states = {s.past: (rng.standard_normal((1, *s.shape)) * 0.1).astype(np.float32) for s in slots}
    separate = dict(zip([o.name for o in session.get_outputs()], session.run(None, {**base, **states})))
    host = HostStates(slots, 1)
    host.write(0, [states[s.past] for s in slots])
    binding = session.io_binding()
    for name, value in base.items():
        binding.bind_cpu_input(name, value)
    binding.bind_output("logits")
    host.bind(binding, 0, 1)
    for kind in ("key", "value"):
        binding.bind_output(f"present.3.{kind}")
    session.run_with_iobinding(binding)
    np.testing.assert_array_equal(binding.get_outputs()[0].numpy(), separate["logits"])
    for slot, got in zip(slots, host.read(0)):
        np.testing.assert_array_equal(got, separate[slot.present])


def test_batched_slots_keep_their_own_states(model, graph):
    """BatchDecoder: request A joins, decodes alone, then B joins and both step together; A leaves and B goes on.
    Every step's logits == that request's HF reference (each slot reads and writes only its own states)."""
    from coverpruner.engines.ort_form_decoder import BatchDecoder

    session, rotary = graph
    rng = np.random.default_rng(2)
    table = model.model.get_input_embeddings()

    def prompt(n, seed):
        return np.random.default_rng(seed).standard_normal((n, 64)).astype(np.float32)

    dec = BatchDecoder(session, 2, 96, 4, 2, 64, rotary)
    prompts = {"a": (prompt(40, 3), _positions(40)), "b": (prompt(25, 4), _positions(25))}
    refs, tokens = {}, {}
    handles = {}
    handles["a"], logits_a = dec.join(prompts["a"][0][None], prompts["a"][1])
    want, refs["a"] = _hf_logits(model, prompts["a"][0][None], prompts["a"][1])
    np.testing.assert_allclose(logits_a, want, rtol=0, atol=ATOL)
    tokens["a"] = int(rng.integers(0, 900))
    ends = {"a": 40, "b": 25}

    def step(names):
        feeds = {}
        for name in names:
            emb = table(torch.tensor([[tokens[name]]])).detach().numpy()
            feeds[handles[name]] = (emb[0, 0], np.full(3, 100 + ends[name], np.int64))
        got = dec.step(feeds)
        for name in names:
            emb = table(torch.tensor([[tokens[name]]])).detach().numpy()
            want, refs[name] = _hf_logits(model, emb, np.full((3, 1), 100 + ends[name], np.int64), refs[name])
            np.testing.assert_allclose(got[handles[name]], want, rtol=0, atol=ATOL, err_msg=name)
            ends[name] += 1
            tokens[name] = int(np.argmax(want))

    step(["a"])
    handles["b"], logits_b = dec.join(prompts["b"][0][None], prompts["b"][1])
    want, refs["b"] = _hf_logits(model, prompts["b"][0][None], prompts["b"][1])
    np.testing.assert_allclose(logits_b, want, rtol=0, atol=ATOL)
    tokens["b"] = int(np.argmax(want))
    step(["a", "b"])
    step(["a", "b"])
    dec.leave(handles["a"])  # b moves into slot 0 with its states
    step(["b"])


def test_prefix_cache_restores_states_only_at_exact_boundaries():
    """The boundary store of a decoder with states: a lookup restores the longest stored snapshot whose rows the
    request reaches exactly (at most max_rows), never a cut of a longer one; a snapshot that a longer one extends
    stays (a boundary of its own); boundaries off a block's end (6, 20 rows) and past one (20) are found; the
    budget evicts them least recently used first."""
    from coverpruner.engines.interfaces import KVSnapshot
    from coverpruner.runtime.prefix_cache import BlockChain, PrefixCache

    def snap(n):
        kv = (np.zeros((1, 1, n, 2), np.float32),)
        return KVSnapshot(n, kv, kv, (np.full((1, 3), n, np.float32),))

    ident = np.arange(80, dtype=np.int64).reshape(40, 2)
    cache = PrefixCache(1 << 20)
    cache.insert_boundary(BlockChain(ident[:6]), 6, snap(6))
    cache.insert_boundary(BlockChain(ident[:20]), 20, snap(20))  # extends the 6-row one, which stays
    got = cache.match_boundary(BlockChain(ident[:30]), 29)
    assert got.snap.length == 20 and got.snap.states[0][0, 0] == 20
    assert cache.match_boundary(BlockChain(ident[:30]), 19).snap.length == 6  # 20 rows exceed max_rows
    other = ident.copy()
    other[9:] += 1000  # diverges inside the 20-row snapshot: its 6-row boundary is the longest that fits
    got = cache.match_boundary(BlockChain(other[:30]), 29)
    assert got.snap.length == 6 and got.snap.states[0][0, 0] == 6
    other[3] += 1000  # diverges before either boundary
    assert cache.match_boundary(BlockChain(other[:30]), 29) is None
    assert not cache.kv.items  # no KV blocks: a decoder with states keeps whole snapshots only

    one = snap(20)
    size = one.nbytes + ident[:20].nbytes + 512
    small = PrefixCache(2 * size + 10)  # room for two 20-row boundaries
    for k in range(3):
        rows = ident + 1000 * k
        small.insert_boundary(BlockChain(rows[:20]), 20, snap(20))
        assert small.nbytes <= small.max_bytes
    assert small.match_boundary(BlockChain(ident[:30]), 29) is None  # the oldest went first
    assert small.match_boundary(BlockChain(ident[:30] + 2000), 29).snap.length == 20
