"""DART / CDPruner on the pipeline's other paths (tiny LLaVA): a conversation with two images (each image selected
on its own V and its own turn's relevance) and the prefix cache (a cached selection is reused only for the same
method options). References: tests/literal_peers.py on the rows the selector saw."""

import numpy as np
import pytest
from PIL import Image

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
