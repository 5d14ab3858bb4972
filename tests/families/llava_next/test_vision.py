"""LLaVA-NeXT's numpy packing against HF's pack_image_features, and the vision graph's dynamic tile axis. The
vision graph + packing == HF get_image_features is the matrix's (tests/matrix/test_graph_parity.py, vision-*)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from coverpruner.families.llava_next.anyres import geometry, pack_features
from tests.families.llava_next.fixtures import IMAGE_SIZES


@pytest.fixture(scope="module")
def next_vision_onnx(next_export):
    """vision.onnx of the tiny NeXT model: pixel_values [tiles,3,84,84] -> image_features [tiles,36,64]."""
    return next_export / "vision.onnx"


@pytest.mark.parametrize("size", IMAGE_SIZES, ids=[f"{w}x{h}" for w, h in IMAGE_SIZES])
def test_numpy_packing_equals_hf_pack_image_features(next_hf_model, next_settings, size):
    """Random tile features through our packing and HF's pack_image_features: bit-identical (pure copies)."""
    w, h = size
    geo = geometry(h, w, next_settings)
    rng = np.random.default_rng(w * 7 + h)
    feats = rng.standard_normal((geo.num_tiles, 36, 64)).astype(np.float32)
    newline = rng.standard_normal(64).astype(np.float32)
    with torch.no_grad():
        ref, lens = next_hf_model.model.pack_image_features(
            [torch.from_numpy(feats)], torch.tensor([[h, w]]), "default", image_newline=torch.from_numpy(newline))
    got = pack_features(feats, geo, newline)
    np.testing.assert_array_equal(got, ref[0].numpy())
    assert int(lens[0]) == geo.num_rows


@pytest.mark.slow
def test_vision_graph_tile_axis_is_dynamic(next_vision_onnx):
    import onnx

    dims = onnx.load(str(next_vision_onnx)).graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "tiles" and [d.dim_value for d in dims[1:]] == [3, 84, 84]
