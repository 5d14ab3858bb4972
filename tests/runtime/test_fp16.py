"""An fp16 engine dir runs through the same Pipeline (fp16 graphs, KV cache and logits; float32 demand)."""

import numpy as np
import pytest

from coverpruner.runtime import Pipeline

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pipe16(tiny_checkpoint, tmp_path_factory):
    pytest.importorskip("torch")
    from coverpruner.export.exporter import ExportOptions, export_model

    out = tmp_path_factory.mktemp("tiny_fp16")
    export_model(tiny_checkpoint, out, "tiny", ExportOptions(dtype="fp16", graphs=("vision", "embed", "probe",
                                                                                   "decoder"), progress=False))
    return Pipeline.load(out)


def test_fp16_tracks_fp32(pipe16, pipe, demo_image):
    assert pipe16.float_dtype == np.float16 and pipe16.decoder.dtype == np.float16
    q = "What is shown in this image?"
    full16 = pipe16.generate(demo_image, q, budget="full", max_new_tokens=8)
    assert full16.token_ids == pipe.generate(demo_image, q, budget="full", max_new_tokens=8).token_ids
    for budget in (64, 16):
        a = pipe16.generate(demo_image, q, budget=budget, max_new_tokens=4)
        b = pipe.generate(demo_image, q, budget=budget, max_new_tokens=4)
        assert a.relevance.dtype == np.float32 and len(a.kept_indices) == budget
        np.testing.assert_allclose(a.relevance, b.relevance, rtol=2e-2, atol=1e-4)
        assert len(set(a.kept_indices) & set(b.kept_indices)) >= 0.9 * budget
