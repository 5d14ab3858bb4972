"""Engines built from the tiny export give the ONNX Runtime graphs' outputs (needs a CUDA GPU and TensorRT
or TensorRT-RTX; skipped otherwise). The ORT CPU run of the same ONNX file is the reference, itself tested
against the HF PyTorch model in tests/export."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnxruntime as ort
import pytest

from coverpruner.doctor import NEAR_TIE_NATS, answer_steps, compare_answers
from coverpruner.engines.tensorrt import BuildOptions, TensorRTBuildError, build_engine_dir, load_tensorrt

from ..literal_selection import assert_same_or_not_worse
from .conftest import requires_gpu, requires_tensorrt

pytestmark = [pytest.mark.gpu, pytest.mark.tensorrt, requires_gpu, requires_tensorrt]


@pytest.fixture(scope="module")
def trt_module():
    try:
        return load_tensorrt()
    except TensorRTBuildError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def built_dir(tiny_export, tmp_path_factory, trt_module):
    d = tmp_path_factory.mktemp("trt_engines") / "dir"
    shutil.copytree(tiny_export, d)
    build_engine_dir(d, BuildOptions(budgets=(8, 64), max_context=256), trt_module)
    return d


def _feeds(manifest, rng):
    dims = manifest["dims"]
    n, hidden = manifest["visual"]["max_visual_tokens"], dims["hidden_size"]
    size = dims["image_size"]
    L = n + 12
    kv = {}
    for i in range(dims["num_layers"]):
        for part in ("key", "value"):
            kv[f"past_key_values.{i}.{part}"] = np.zeros((1, dims["num_kv_heads"], 0, dims["head_dim"]), np.float32)
    return {
        "vision": {"pixel_values": rng.standard_normal((1, 3, size, size)).astype(np.float32)},
        "embed": {"input_ids": rng.integers(3, 900, (1, 20)).astype(np.int64)},
        "probe": {"inputs_embeds": rng.standard_normal((1, L, hidden)).astype(np.float32),
                  "position_ids": np.arange(L, dtype=np.int64)[None],
                  "visual_positions": np.arange(5, 5 + n, dtype=np.int64),
                  "instruction_positions": np.arange(5 + n, L, dtype=np.int64)},
        "selector": {"image_features": rng.standard_normal((n, hidden)).astype(np.float32),
                     "relevance": rng.random(n).astype(np.float32),
                     "budget": np.array(8, np.int64), "tau": np.array(0.3, np.float32)},
        "selector_dart": {"image_features": rng.standard_normal((n, hidden)).astype(np.float32),
                          "budget": np.array(8, np.int64), "pivots": np.array(3, np.int64)},
        "selector_cdpruner": {"image_features": rng.standard_normal((n, hidden)).astype(np.float32),
                              "relevance": rng.random(n).astype(np.float32), "budget": np.array(8, np.int64),
                              "relevance_weight": np.array(0.5, np.float32)},
        "decoder": {"inputs_embeds": rng.standard_normal((1, 30, hidden)).astype(np.float32),
                    "attention_mask": np.ones((1, 30), np.int64),
                    "position_ids": np.arange(30, dtype=np.int64)[None], **kv},
    }


@pytest.mark.parametrize("graph", ["vision", "embed", "probe", "selector", "selector_dart", "selector_cdpruner",
                                   "decoder"])
def test_engine_matches_onnxruntime(built_dir, trt_module, graph):
    from coverpruner.engines.trt_session import TrtSessionFactory

    manifest = json.loads((built_dir / "manifest.json").read_text())
    feed = _feeds(manifest, np.random.default_rng(0))[graph]
    ref = ort.InferenceSession(str(built_dir / manifest["graphs"][graph]["file"]),
                               providers=["CPUExecutionProvider"])
    names = [o.name for o in ref.get_outputs()]
    want = ref.run(names, feed)
    got = TrtSessionFactory(built_dir, trt_module)(graph).run(names, feed)
    for name, w, g in zip(names, want, got):
        assert g.shape == w.shape, name
        if w.dtype.kind in "iu":
            np.testing.assert_array_equal(g, w, err_msg=name)
        else:
            np.testing.assert_allclose(g, w, rtol=2e-3, atol=2e-4, err_msg=name)


def test_bad_feeds_are_named(built_dir, trt_module):
    from coverpruner.engines.trt_session import TrtSessionError, TrtSessionFactory

    sess = TrtSessionFactory(built_dir, trt_module)("selector")
    feed = _feeds(json.loads((built_dir / "manifest.json").read_text()), np.random.default_rng(1))["selector"]
    with pytest.raises(TrtSessionError, match="missing \\['tau'\\]"):
        sess.run(["keep"], {k: v for k, v in feed.items() if k != "tau"})
    with pytest.raises(TrtSessionError, match="'relevance' must be float32"):
        sess.run(["keep"], dict(feed, relevance=feed["relevance"].astype(np.float64)))
    with pytest.raises(TrtSessionError, match="outside the engine's profile"):
        sess.run(["keep"], dict(feed, budget=np.array(500, np.int64)))


def test_plugin_selector_engine_matches_reference(native_libs, trt_module, tmp_path):
    """selector.onnx in plugin form -> engine with the CoverageSelector plugin -> the literal float64 greedy's keep,
    for several budgets from one engine (the budget is a runtime tensor). The kernel's utilities are float32
    (cuBLAS): where this input's near-ties (best and second gains 1.2e-5 apart, relative) resolve the other way,
    the set must be not worse by the float32 rule of literal_selection.assert_same_or_not_worse, as in the other
    GPU selector tests."""
    from coverpruner.engines.trt_session import TrtSessionFactory
    from coverpruner.export.selector_plugin import build_selector_plugin_model

    if native_libs.plugin is None:
        pytest.skip("the TensorRT plugin was not built: TensorRT headers not found (set TENSORRT_ROOT)")
    import onnx

    n, d = 576, 256
    onnx.save(build_selector_plugin_model("float32"), tmp_path / "selector.onnx")
    manifest = {"format": "coverpruner-engine-dir", "format_version": 2, "precision": "fp32",
                "selector_form": "plugin", "visual": {"max_visual_tokens": n},
                "dims": {"hidden_size": d, "max_position_embeddings": 1024},
                "graphs": {"selector": {"file": "selector.onnx", "inputs": [
                    {"name": "image_features", "dtype": "float32", "shape": ["n", "d"]},
                    {"name": "relevance", "dtype": "float32", "shape": ["n"]},
                    {"name": "budget", "dtype": "int64", "shape": []},
                    {"name": "tau", "dtype": "float32", "shape": []}],
                    "outputs": [{"name": "keep", "dtype": "int64", "shape": ["m"]}]}}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    build_engine_dir(tmp_path, BuildOptions(plugin=native_libs.plugin), trt_module)
    sess = TrtSessionFactory(tmp_path, trt_module)("selector")
    rng = np.random.default_rng(0)
    v = rng.standard_normal((n, d)).astype(np.float32)
    r = rng.random(n).astype(np.float32)
    for budget in (16, 64, 192, 1000):
        (keep,) = sess.run(["keep"], {"image_features": v, "relevance": r, "budget": np.array(budget, np.int64),
                                      "tau": np.array(0.3, np.float32)})
        assert_same_or_not_worse(keep, v, r, budget)


def test_decoder_kv_loop_matches_onnxruntime(built_dir, trt_module):
    """Prefill then decode steps with the KV cache on the GPU == ORT with presents fed back as pasts."""
    from coverpruner.engines.trt_session import TrtDecoderSession, TrtSessionFactory

    manifest = json.loads((built_dir / "manifest.json").read_text())
    dims = manifest["dims"]
    layers, h, hd, hidden = dims["num_layers"], dims["num_kv_heads"], dims["head_dim"], dims["hidden_size"]
    ref = ort.InferenceSession(str(built_dir / manifest["graphs"]["decoder"]["file"]),
                               providers=["CPUExecutionProvider"])
    dec = TrtDecoderSession(TrtSessionFactory(built_dir, trt_module)("decoder"), layers, h, hd,
                            dims["vocab_size"])
    dec.reset(64)
    rng = np.random.default_rng(2)
    past = {f"past_key_values.{i}.{kv}": np.zeros((1, h, 0, hd), np.float32)
            for i in range(layers) for kv in ("key", "value")}
    length = 0
    for s in (30, 1, 1, 1):
        embeds = rng.standard_normal((1, s, hidden)).astype(np.float32)
        pos = np.arange(length, length + s, dtype=np.int64)[None]
        outs = ref.run(None, {"inputs_embeds": embeds, "position_ids": pos,
                              "attention_mask": np.ones((1, length + s), np.int64), **past})
        names = [o.name for o in ref.get_outputs()]
        got = dec.forward(embeds, pos)
        np.testing.assert_allclose(got, outs[names.index("logits")][0, -1], rtol=2e-3, atol=2e-4)
        past = {f"past_key_values.{i}.{kv}": outs[names.index(f"present.{i}.{kv}")]
                for i in range(layers) for kv in ("key", "value")}
        length += s
    assert dec.length == length


def test_pipeline_on_engines_answers_like_onnxruntime(built_dir, trt_module):
    """The runtime's Pipeline on TensorRT engines generates the ORT CPU pipeline's tokens (greedy), whether
    opened through Pipeline.load(provider="tensorrt") or with the TrtSessionFactory passed explicitly."""
    from coverpruner.engines.trt_session import TrtSessionFactory
    from coverpruner.runtime import Pipeline

    image = (np.random.default_rng(3).random((200, 240, 3)) * 255).astype(np.uint8)
    job = dict(image=image, prompt="What is shown?", budget=16, max_new_tokens=8, ignore_eos=True)
    cpu = Pipeline.load(built_dir, provider="cpu")
    want = cpu.generate(**job)
    (want_steps,) = answer_steps(cpu, [job])
    for pipe in (Pipeline.load(built_dir, provider="tensorrt"),
                 Pipeline.load(built_dir, provider="tensorrt", session_factory=TrtSessionFactory(built_dir))):
        got = pipe.generate(**job)
        np.testing.assert_array_equal(got.kept_indices, want.kept_indices)
        # fp32 on both sides; a greedy token may flip only at a near-tie of the reference (margin reported)
        (got_steps,) = answer_steps(pipe, [job])
        print(compare_answers(want_steps, got_steps, NEAR_TIE_NATS["fp32"], "TensorRT vs ORT CPU") or "same tokens")


def test_decoder_snapshot_restore_continues_like_the_uninterrupted_run(built_dir, trt_module):
    """snapshot() of the GPU cache holds ORT's present.* for the prefix; restore() into the same session after
    other work, and into a second session with larger buffers, decodes like the uninterrupted run."""
    from coverpruner.engines.interfaces import DecoderLoop
    from coverpruner.engines.trt_session import TrtDecoderSession, TrtSessionFactory

    manifest = json.loads((built_dir / "manifest.json").read_text())
    dims = manifest["dims"]
    layers, h, hd, hidden = dims["num_layers"], dims["num_kv_heads"], dims["head_dim"], dims["hidden_size"]
    factory = TrtSessionFactory(built_dir, trt_module)
    dec = TrtDecoderSession(factory("decoder"), layers, h, hd, dims["vocab_size"])
    assert isinstance(dec, DecoderLoop)
    rng = np.random.default_rng(4)
    embeds = rng.standard_normal((1, 34, hidden)).astype(np.float32)
    pos = np.arange(34, dtype=np.int64)[None]
    dec.reset(64)
    dec.forward(embeds[:, :30], pos[:, :30])
    dec.forward(embeds[:, 30:31], pos[:, 30:31])  # an odd step count leaves the prefix in the second buffer
    snap = dec.snapshot()
    want = np.stack([dec.forward(embeds[:, t:t + 1], pos[:, t:t + 1]).copy() for t in range(31, 34)])

    ref = ort.InferenceSession(str(built_dir / manifest["graphs"]["decoder"]["file"]),
                               providers=["CPUExecutionProvider"])
    empty = {f"past_key_values.{i}.{kv}": np.zeros((1, h, 0, hd), np.float32)
             for i in range(layers) for kv in ("key", "value")}
    names = [o.name for o in ref.get_outputs()]
    outs = dict(zip(names, ref.run(names, {"inputs_embeds": embeds[:, :31], "position_ids": pos[:, :31],
                                           "attention_mask": np.ones((1, 31), np.int64), **empty})))
    assert snap.length == 31
    for i in range(layers):  # the engine-vs-ORT tolerance of test_engine_matches_onnxruntime
        np.testing.assert_allclose(snap.keys[i], outs[f"present.{i}.key"], rtol=2e-3, atol=2e-4)
        np.testing.assert_allclose(snap.values[i], outs[f"present.{i}.value"], rtol=2e-3, atol=2e-4)

    dec.reset(64)
    dec.forward(embeds[:, ::-1].copy(), pos)  # other work overwrites both buffers
    dec.reset(64)
    other = TrtDecoderSession(factory("decoder"), layers, h, hd, dims["vocab_size"])
    other.reset(128)
    for loop in (dec, other):
        loop.restore(snap)
        got = np.stack([loop.forward(embeds[:, t:t + 1], pos[:, t:t + 1]).copy() for t in range(31, 34)])
        # same engine, same inputs and past values; the tolerance only allows for reductions TensorRT may
        # schedule differently between runs, while a lost or misplaced prefix moves the logits by O(1)
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-4)
        assert loop.length == 34
