"""DART / CDPruner on the pipeline's other paths (tiny LLaVA): a conversation with two images (each image selected
on its own V and its own turn's relevance) and the prefix cache (a cached selection is reused only for the same
method options), and an engine dir without the peers' selector graphs (numpy, a warning, the re-export that adds
them). References: tests/literal_peers.py on the rows the selector saw."""

import json
import warnings

import numpy as np
import pytest
from PIL import Image

from coverpruner.engines.ort import OrtSessionFactory
from coverpruner.export.exporter import ExportOptions, export_model
from coverpruner.runtime import Pipeline
from tests.literal_peers import cdpruner_reference, dart_reference

pytestmark = pytest.mark.slow


def conversation(demo_image):
    noise = Image.fromarray(np.random.default_rng(5).integers(0, 255, (200, 260, 3), dtype=np.uint8))
    return [{"role": "user", "content": [{"type": "image", "image": str(demo_image)},
                                         {"type": "text", "text": "What is shown here?"}]},
            {"role": "assistant", "content": "A house."},
            {"role": "user", "content": [{"type": "image", "image": noise},
                                         {"type": "text", "text": "And in this one?"}]}]


def reference(method, feats, relevance, budget, options):
    if method == "dart":
        return dart_reference(feats, budget, options.get("pivots", 8))
    return cdpruner_reference(feats, relevance, budget, options.get("relevance_weight", 1.0))


@pytest.mark.parametrize("method, options", [("dart", {"pivots": 2}), ("cdpruner", {"relevance_weight": 0.5})])
def test_each_image_of_a_conversation_keeps_its_reference(pipe, demo_image, method, options):
    messages = conversation(demo_image)
    native = pipe.native_sequence(pipe.chat_request(messages, budget=12, method=method, max_new_tokens=1,
                                                    **options))
    r = pipe.chat(messages, budget=12, method=method, max_new_tokens=1, **options)
    assert len(r.images) == 2
    for span, image in zip(native.spans, r.images):
        want = reference(method, np.asarray(span.features, np.float32), image.relevance, 12, options)
        np.testing.assert_array_equal(image.kept_indices, want)


def test_prefix_cache_reuses_a_selection_only_for_the_same_options(tiny_export, demo_image):
    pipe = Pipeline.load(tiny_export, provider="cpu", threads=1, prefix_cache_mb=64)
    messages = conversation(demo_image)
    native = pipe.native_sequence(pipe.chat_request(messages, budget=12, method="cdpruner", max_new_tokens=1))
    feats = [np.asarray(s.features, np.float32) for s in native.spans]
    first = pipe.chat(messages, budget=12, method="cdpruner", relevance_weight=0.5, max_new_tokens=1)
    again = pipe.chat(messages, budget=12, method="cdpruner", relevance_weight=0.5, max_new_tokens=1)
    other = pipe.chat(messages, budget=12, method="cdpruner", relevance_weight=0.0, max_new_tokens=1)
    # the two weights keep different tokens here, so a selection cached under the wrong key would show
    assert any(not np.array_equal(first.images[j].kept_indices, other.images[j].kept_indices) for j in range(2))
    for j in range(2):
        np.testing.assert_array_equal(again.images[j].kept_indices, first.images[j].kept_indices)
        np.testing.assert_array_equal(first.images[j].kept_indices,
                                      cdpruner_reference(feats[j], first.images[j].relevance, 12, 0.5))
        np.testing.assert_array_equal(other.images[j].kept_indices,
                                      cdpruner_reference(feats[j], other.images[j].relevance, 12, 0.0))


def _drop_peer_graphs(engine_dir):
    """The dir as exported before the peers' selector graphs existed: neither graph file nor manifest entry."""
    manifest = json.loads((engine_dir / "manifest.json").read_text())
    for graph in ("selector_dart", "selector_cdpruner"):
        (engine_dir / manifest["graphs"].pop(graph)["file"]).unlink()
    (engine_dir / "manifest.json").write_text(json.dumps(manifest))


def test_a_dir_without_the_peer_graphs_selects_in_numpy_and_says_how_to_reexport(engine_copy, tiny_checkpoint,
                                                                                 demo_image):
    """An engine dir exported before selector_dart / selector_cdpruner still answers dart and cdpruner (numpy,
    same tokens as the literal reference) and says once, on the method's first selection, which command adds the
    graph; re-exporting just those graphs (no weights loaded) puts the graph back in the manifest and in use."""
    _drop_peer_graphs(engine_copy)
    pipe = Pipeline.load(engine_copy, provider="cpu", threads=1)
    assert pipe.selector_for(144, "dart") == pipe.selector_for(144, "cdpruner") == "numpy"
    with pytest.warns(RuntimeWarning, match=r"no selector_dart\.onnx .*--dtype fp32 --graphs selector_dart"):
        first = pipe.generate(demo_image, "What is shown here?", budget=12, method="dart", max_new_tokens=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per pipeline
        again = pipe.generate(demo_image, "What is shown here?", budget=12, method="dart", max_new_tokens=1)
    feats = np.asarray(pipe.native_sequence(pipe.request(demo_image, "What is shown here?", budget=12,
                                                         method="dart")).spans[0].features, np.float32)
    np.testing.assert_array_equal(first.kept_indices, dart_reference(feats, 12, 8))
    np.testing.assert_array_equal(again.kept_indices, first.kept_indices)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the numpy backend asked for: nothing to say
        Pipeline.load(engine_copy, selector="numpy").generate(demo_image, "Hi", budget=12, method="dart",
                                                              max_new_tokens=1)

    export_model(tiny_checkpoint, engine_copy, "tiny",
                 ExportOptions(graphs=("selector_dart", "selector_cdpruner"), progress=False))
    assert {"selector_dart", "selector_cdpruner", "decoder"} <= set(json.loads(
        (engine_copy / "manifest.json").read_text())["graphs"])
    fresh = Pipeline.load(engine_copy, provider="cpu", threads=1)
    assert fresh.selector_for(144, "dart") == "onnx" and not fresh.selector_fallbacks
    r = fresh.generate(demo_image, "What is shown here?", budget=12, method="dart", max_new_tokens=1)
    np.testing.assert_array_equal(r.kept_indices, first.kept_indices)


def test_a_peer_graph_that_will_not_open_falls_back_to_numpy(tiny_export, demo_image):
    """A session that cannot open (e.g. no TensorRT engine built for the graph) costs the method its graph, not the
    load: the reason is warned on first use and the numpy selector keeps the reference's tokens."""
    ort_factory = OrtSessionFactory("cpu", 1)

    def factory(name, path):
        if name == "selector_cdpruner":
            raise RuntimeError(f"no TensorRT engine for graph {name!r}")
        return ort_factory(name, path)

    pipe = Pipeline.load(tiny_export, session_factory=factory)
    assert pipe.selector_for(144, "dart") == "onnx" and pipe.selector_for(144, "cdpruner") == "numpy"
    with pytest.warns(RuntimeWarning, match="cannot open selector_cdpruner \\(no TensorRT engine for graph"):
        r = pipe.generate(demo_image, "What is shown here?", budget=12, method="cdpruner", max_new_tokens=1)
    feats = np.asarray(pipe.native_sequence(pipe.request(demo_image, "What is shown here?", budget=12,
                                                         method="cdpruner")).spans[0].features, np.float32)
    np.testing.assert_array_equal(r.kept_indices, cdpruner_reference(feats, r.relevance, 12, 1.0))
