"""selector_dart.onnx / selector_cdpruner.onnx (export/peer_graphs.py) on ONNX Runtime keep the numpy selectors'
tokens (which tests/selection/test_peers.py holds to the literal references); TensorRT-RTX builds both.

float32 graph vs float64 numpy: random, clustered and exactly duplicated features give the same indices. On
near-duplicates (copies + 1e-6 noise) float32 cannot order the copies (their scores differ by ~1e-12): the graph
keeps the same groups of copies (DART: as many of each group; CDPruner: every group the numpy picks cover)."""

import numpy as np
import onnxruntime as ort
import pytest

from coverpruner.export.peer_graphs import build_peer_selector_model
from coverpruner.selection import cdpruner_select, dart_select
from tests.selection.test_peers import peer_case


@pytest.fixture(scope="module")
def sessions():
    def make(method, dtype):
        model = build_peer_selector_model(method, dtype)
        return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

    return {(m, t): make(m, t) for m in ("dart", "cdpruner") for t in ("float32", "float16")}


def run_dart(sess, v, budget, pivots):
    return sess.run(["keep"], {"image_features": v, "budget": np.array(budget, np.int64),
                               "pivots": np.array(pivots, np.int64)})[0]


def run_cdpruner(sess, v, r, budget, weight):
    return sess.run(["keep"], {"image_features": v, "relevance": np.asarray(r, np.float32),
                               "budget": np.array(budget, np.int64), "relevance_weight": np.array(weight, np.float32)})[0]


def copy_groups(v) -> np.ndarray:
    """Each token's group: the lowest index whose float64 cosine with it exceeds 1 - 1e-9."""
    u = v.astype(np.float64) / np.linalg.norm(v.astype(np.float64), axis=1, keepdims=True)
    return np.argmax(u @ u.T > 1 - 1e-9, axis=1)


@pytest.mark.parametrize("kind", ["random", "clustered", "duplicated", "near_duplicate"])
@pytest.mark.parametrize("seed", range(3))
def test_graphs_keep_the_numpy_selectors_tokens(sessions, kind, seed):
    v, r, budget = peer_case(kind, seed)
    r = r.astype(np.float32)
    groups = copy_groups(v)
    for pivots in (8, 3, 1):
        got, want = run_dart(sessions["dart", "float32"], v, budget, pivots), dart_select(v, None, budget, pivots=pivots)
        assert got.dtype == np.int64
        if kind == "near_duplicate":
            assert sorted(groups[got]) == sorted(groups[want])
        else:
            np.testing.assert_array_equal(got, want)
    for weight in (1.0, 0.5, 0.0):
        got = run_cdpruner(sessions["cdpruner", "float32"], v, r, budget, weight)
        want = cdpruner_select(v, r, budget, relevance_weight=weight)
        if kind == "near_duplicate":
            assert set(groups[got]) == set(groups[want]) and len(got) == len(want)
        else:
            np.testing.assert_array_equal(got, want)


def test_float16_graphs_read_float16_features(sessions):
    v, r, budget = peer_case("random", 5)
    v16 = v.astype(np.float16)
    np.testing.assert_array_equal(run_dart(sessions["dart", "float16"], v16, budget, 8),
                                  dart_select(v16.astype(np.float32), None, budget))
    np.testing.assert_array_equal(run_cdpruner(sessions["cdpruner", "float16"], v16, r, budget, 1.0),
                                  cdpruner_select(v16.astype(np.float32), r.astype(np.float32), budget))


def test_graphs_at_paper_shape_576_tokens(sessions):
    rng = np.random.default_rng(3)
    v, r = rng.standard_normal((576, 256)).astype(np.float32), rng.random(576).astype(np.float32)
    for budget in (64, 128):
        np.testing.assert_array_equal(run_dart(sessions["dart", "float32"], v, budget, 8), dart_select(v, None, budget))
        np.testing.assert_array_equal(run_cdpruner(sessions["cdpruner", "float32"], v, r, budget, 1.0),
                                      cdpruner_select(v, r, budget))


def test_unknown_method_has_no_graph():
    with pytest.raises(ValueError, match="no selector graph for method 'divprune'"):
        build_peer_selector_model("divprune")


@pytest.mark.tensorrt
@pytest.mark.parametrize("method", ["dart", "cdpruner"])
def test_tensorrt_rtx_builds_the_peer_graphs(trt_rtx, tmp_path, method):
    """TensorRT-RTX's ONNX parser takes the graph and its builder writes a plan (no GPU needed to build)."""
    import onnx

    from coverpruner.engines.tensorrt import BuildOptions, build_engine
    from tests.trt_plans import is_trt_rtx_plan

    path = tmp_path / f"selector_{method}.onnx"
    onnx.save(build_peer_selector_model(method), path)
    extra = ([{"name": "pivots", "dtype": "int64", "shape": []}] if method == "dart" else
             [{"name": "relevance", "dtype": "float32", "shape": ["n"]},
              {"name": "relevance_weight", "dtype": "float32", "shape": []}])
    spec = {"inputs": [{"name": "image_features", "dtype": "float32", "shape": ["n", "d"]},
                       {"name": "budget", "dtype": "int64", "shape": []}, *extra]}
    options = BuildOptions(budgets=(8, 32))
    plan, record = build_engine(trt_rtx, path, f"selector_{method}", spec, {"n": (1, 48, 48), "d": (32, 32, 32)},
                                options, "fp32", "fp32")
    assert is_trt_rtx_plan(plan)
    assert record["shape_inputs"]["budget"] == {"min": [8], "opt": [8], "max": [32]}
