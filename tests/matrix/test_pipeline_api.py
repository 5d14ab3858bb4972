"""Pipeline API behaviour beyond parity, for every family of the matrix: streaming, sampling seeds, every method,
context limits, options, selector backends. The family's numbers (candidates of the demo image) are its facts
(tests/families/<family>/matrix.py)."""

import json
import shutil

import numpy as np
import pytest

from coverpruner.runtime import OptionError, Pipeline, PromptError
from tests.literal_peers import cdpruner_reference, dart_reference

pytestmark = pytest.mark.slow
Q = "What is shown in this image?"


@pytest.fixture
def pipe(family):
    return family.pipe


@pytest.fixture
def engine_copy(family, tmp_path):
    """A private copy of the family's engine dir that a test may corrupt."""
    return shutil.copytree(family.export, tmp_path / "engine")


@pytest.fixture
def demo_n(family):
    """Candidates of the demo image (assets/demo.png) for this family."""
    return family.facts.DEMO_CANDIDATES


def test_stream_pieces_join_to_generate_text(pipe, demo_image):
    full = pipe.generate(demo_image, Q, budget=32, max_new_tokens=12)
    stream = pipe.stream(demo_image, Q, budget=32, max_new_tokens=12)
    pieces = list(stream)
    assert len(pieces) > 1 and "".join(pieces) == full.text == stream.result.text
    assert stream.result.token_ids == full.token_ids


def test_seeded_sampling_reproduces(pipe, demo_image):
    kw = dict(budget=32, max_new_tokens=12, temperature=1.5, top_p=0.95)
    a = pipe.generate(demo_image, Q, seed=7, **kw).token_ids
    assert pipe.generate(demo_image, Q, seed=7, **kw).token_ids == a
    others = {tuple(pipe.generate(demo_image, Q, seed=s, **kw).token_ids) for s in range(3)}
    assert len(others | {tuple(a)}) > 1
    greedy = pipe.generate(demo_image, Q, budget=32, max_new_tokens=12).token_ids
    assert pipe.generate(demo_image, Q, budget=32, max_new_tokens=12, seed=99).token_ids == greedy


@pytest.mark.parametrize("method", ["attention", "uniform", "random", "dart", "cdpruner"])
def test_every_method_keeps_budget_sorted(pipe, demo_image, demo_n, method):
    r = pipe.generate(demo_image, Q, budget=20, method=method, max_new_tokens=2, seed=3)
    k = r.kept_indices
    assert len(k) == 20 and np.all(np.diff(k) > 0) and k.min() >= 0 and k.max() < r.num_visual_tokens == demo_n
    reads_probe = method in ("attention", "cdpruner")
    assert (r.relevance is not None) == reads_probe
    assert r.timings["probe"] > 0 if reads_probe else r.timings["probe"] == 0


@pytest.mark.parametrize("method, options", [("dart", {}), ("dart", {"pivots": 3}), ("cdpruner", {}),
                                             ("cdpruner", {"relevance_weight": 0.5})])
def test_peer_methods_keep_their_literal_references_tokens(pipe, demo_image, method, options, monkeypatch):
    """DART / CDPruner through the pipeline keep what tests/literal_peers.py keeps on the family's own V and
    layer-0 relevance (the candidates' rows the selector saw), and report the options they ran with. They select
    with the engine dir's selector graph (selector_dart.onnx / selector_cdpruner.onnx, listed in the manifest) on
    the provider: the numpy selectors only where a dir lacks it (tests/runtime/test_peer_method_paths.py)."""
    graph = f"selector_{method}"
    assert graph in pipe.manifest.graphs and pipe.manifest.graphs[graph].path.is_file()
    request = pipe.request(demo_image, Q, budget=20, method=method, max_new_tokens=2, **options)
    native = pipe.native_sequence(request)
    feats = np.asarray(native.spans[0].features, np.float32)
    assert pipe.selector_for(len(feats), method) == "onnx"
    ran, real = [], pipe.model.select_onnx  # the model runs the selector graphs (runtime/model.py)
    monkeypatch.setattr(pipe.model, "select_onnx", lambda *a: ran.append(a[4]) or real(*a))
    r = pipe.generate(demo_image, Q, budget=20, method=method, max_new_tokens=2, **options)
    assert ran == [method]
    if method == "dart":
        want = dart_reference(feats, 20, options.get("pivots", 8))
    else:
        want = cdpruner_reference(feats, r.relevance, 20, options.get("relevance_weight", 1.0))
    np.testing.assert_array_equal(r.kept_indices, want)
    assert r.options == {**pipe.family_options(), **{"dart": {"pivots": 8}, "cdpruner": {"relevance_weight": 1.0}}[
        method], **options}


def test_budget_at_least_n_equals_full(family, pipe, demo_image, demo_n):
    keep_all = family.facts.KEEP_ALL_OPTIONS  # what "nothing pruned" needs besides the budget
    full = pipe.generate(demo_image, Q, budget=None, max_new_tokens=8)
    big = pipe.generate(demo_image, Q, budget=10_000, max_new_tokens=8, **keep_all)
    assert big.token_ids == full.token_ids and len(big.kept_indices) == big.num_visual_tokens == demo_n


def test_generation_stops_at_context_end(family, engine_copy, demo_image):
    if not family.facts.PRUNING_FREES_CONTEXT:
        pytest.skip(f"{family.name} keeps native positions: its context is counted in positions, not prompt rows")
    m = json.loads((engine_copy / "manifest.json").read_text())
    p = Pipeline.load(engine_copy)
    L = p.generate(demo_image, Q, budget="full", max_new_tokens=1).prompt_tokens
    m["dims"]["max_position_embeddings"] = L + 3  # the unpruned prompt leaves room for 3 tokens
    (engine_copy / "manifest.json").write_text(json.dumps(m))
    p = Pipeline.load(engine_copy)
    r = p.generate(demo_image, Q, budget="full", max_new_tokens=50)
    assert len(r.token_ids) == 3 and r.finish_reason == "context"
    r = p.generate(demo_image, Q, budget=16, method="divprune", max_new_tokens=50)  # pruning frees n - 16 positions
    assert len(r.token_ids) == 50 and r.finish_reason == "length"
    with pytest.raises(PromptError, match="the context allows"):
        m["dims"]["max_position_embeddings"] = L - 5
        (engine_copy / "manifest.json").write_text(json.dumps(m))
        Pipeline.load(engine_copy).generate(demo_image, Q, budget=16)


@pytest.mark.parametrize("kw,msg", [(dict(budget="abc"), "budget must be"), (dict(budget=0), "budget must be"),
                                    (dict(max_new_tokens=0), "max_new_tokens"), (dict(method="nope"), "unknown method"),
                                    (dict(temperature=-1.0), "temperature"), (dict(tau=float("nan")), "tau must be"),
                                    (dict(method="cdpruner", relevance_weight=float("inf")), "relevance_weight must"),
                                    (dict(method="dart", relevance_weight=0.5), "not taken by method 'dart'")])
def test_bad_options_fail_before_work(pipe, demo_image, kw, msg):
    with pytest.raises(OptionError, match=msg):
        pipe.stream(demo_image, Q, **kw)


def test_empty_prompt(pipe, demo_image):
    with pytest.raises(PromptError, match="empty"):
        pipe.generate(demo_image, "  ")


def test_eos_stops_unless_ignored(engine_copy, demo_image):
    first = Pipeline.load(engine_copy).generate(demo_image, Q, budget=16, max_new_tokens=6).token_ids
    m = json.loads((engine_copy / "manifest.json").read_text())
    m["token_ids"]["eos_token_id"] = first[2]  # make the third greedy token the end of sequence
    (engine_copy / "manifest.json").write_text(json.dumps(m))
    p = Pipeline.load(engine_copy)
    stop = first.index(first[2]) + 1
    r = p.generate(demo_image, Q, budget=16, max_new_tokens=6)
    assert r.token_ids == first[:stop] and r.finish_reason == "eos"
    assert r.text == p.encoder.decode(first[:stop - 1])  # the EOS token is not part of the text
    r = p.generate(demo_image, Q, budget=16, max_new_tokens=6, ignore_eos=True)
    assert r.token_ids == first and r.finish_reason == "length"


def test_onnx_and_numpy_selector_backends_keep_same_tokens(family, pipe, demo_image, demo_n, engine_copy):
    assert pipe.selector_backend == "auto", "auto keeps the dir's loop-form selector.onnx"
    # on CPU, numpy (float32 syrk) above 2,048 candidates, selector.onnx up to there
    assert pipe.selector_for(demo_n) == "onnx" and pipe.selector_for(2048) == "onnx"
    assert pipe.selector_for(2049) == "numpy" and pipe.selector_for(16384) == "numpy"
    numpy_pipe = Pipeline.load(family.export, selector="numpy")
    assert numpy_pipe.selector_backend == "numpy"
    for budget in (64, 16):
        a = pipe.generate(demo_image, Q, budget=budget, max_new_tokens=6)
        b = numpy_pipe.generate(demo_image, Q, budget=budget, max_new_tokens=6)
        assert a.kept_indices.tolist() == b.kept_indices.tolist() and a.token_ids == b.token_ids
    with pytest.raises(OptionError, match="unknown selector backend"):
        Pipeline.load(family.export, selector="cuda-kernel")
    assert Pipeline.load(family.export, selector="onnx").selector_for(2880) == "onnx"
    # a dir exported without selector.onnx (or with the TensorRT-only plugin form) selects in numpy
    manifest = json.loads((engine_copy / "manifest.json").read_text())
    manifest["selector_form"] = "plugin"
    (engine_copy / "manifest.json").write_text(json.dumps(manifest))
    assert Pipeline.load(engine_copy).selector_backend == "numpy"
    del manifest["graphs"]["selector"]
    (engine_copy / "manifest.json").write_text(json.dumps(manifest))
    assert Pipeline.load(engine_copy).selector_backend == "numpy"


def test_auto_selector_runs_selector_onnx_except_numpys_float32_range_on_cpu(pipe, demo_image, monkeypatch):
    """selector="auto": the loop-form selector.onnx selects (its lazy step keeps up at video sizes, so GPU providers
    run it at every n); on the CPU provider above 2,048 candidates numpy does, whose float32 similarity is a syrk
    (half the GEMM flops ONNX Runtime runs)."""
    calls = []
    real = pipe.model.select_onnx  # the model runs the selector graphs (runtime/model.py)
    monkeypatch.setattr(pipe.model, "select_onnx", lambda *a: calls.append(1) or real(*a))
    pipe.generate(demo_image, Q, budget=16, max_new_tokens=4)
    assert calls == [1]
    assert [pipe.selector_for(n) for n in (1, 2048, 2049, 2880, 65536)] == ["onnx"] * 2 + ["numpy"] * 3
    monkeypatch.setattr(pipe.model, "provider", "cuda")
    assert [pipe.selector_for(n) for n in (1, 2880, 16384, 65536)] == ["onnx"] * 4


@pytest.mark.gpu
@pytest.mark.parametrize("provider", ["cuda", "tensorrt"])
def test_gpu_providers_match_cpu_tokens(family, pipe, demo_image, provider):
    import onnxruntime as ort

    if family.form == "ort":  # the fp32 ORT-form decoder runs on the CPU provider only: refused in one line
        match = ("fp16 only.*--dtype fp16 --decoder-form ort" if provider == "cuda"
                 else "ORT form.*--decoder-form standard")
        with pytest.raises(OptionError, match=match):
            Pipeline.load(family.export, provider=provider)
        return
    ep = {"cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider"}[provider]
    if ep not in ort.get_available_providers():
        pytest.skip(f"{ep} not available (needs onnxruntime-gpu{' with TensorRT' if provider == 'tensorrt' else ''}"
                    " and a CUDA GPU)")
    gpu = Pipeline.load(family.export, provider=provider)
    for budget in ("full", 64, 16):
        a = gpu.generate(demo_image, Q, budget=budget, max_new_tokens=8)
        b = pipe.generate(demo_image, Q, budget=budget, max_new_tokens=8)
        assert a.kept_indices.tolist() == b.kept_indices.tolist() and a.token_ids == b.token_ids


def test_unknown_family_in_manifest(engine_copy):
    from coverpruner.runtime import ManifestError

    m = json.loads((engine_copy / "manifest.json").read_text())
    m["family"] = "qwen9"
    (engine_copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ManifestError, match="unknown model family 'qwen9'"):
        Pipeline.load(engine_copy)
