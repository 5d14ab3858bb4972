"""LLaVA-NeXT vision graph over a dynamic tile axis (ONNX, onnxruntime CPU) and numpy packing, against HF."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from coverpruner.families.llava_next.anyres import geometry, pack_features, prepare_tiles
from tests.families.llava_next.fixtures import IMAGE_SIZES, smooth_image

# Tile counts 5, 4, 3, 4 (2x2, 1x3, 1x2, 3x1 grids), square / landscape / tiny / extreme portrait.
VISION_SIZES = [(200, 240), (500, 120), (20, 30), (50, 10000)]


@pytest.fixture(scope="module")
def next_vision_onnx(next_export):
    """vision.onnx of the tiny NeXT model: pixel_values [tiles,3,84,84] -> image_features [tiles,36,64]."""
    return next_export / "vision.onnx"


def _hf_packed(model, pixel_values, height, width):
    """HF's own get_image_features (tower, projector, pack_image_features with image_newline). [N,d] f32."""
    with torch.no_grad():
        out = model.get_image_features(pixel_values=torch.from_numpy(pixel_values)[None],
                                       image_sizes=torch.tensor([[height, width]]))
    return out.pooler_output[0].numpy()


@pytest.mark.slow
@pytest.mark.parametrize("size", VISION_SIZES, ids=[f"{w}x{h}" for w, h in VISION_SIZES])
def test_vision_graph_and_packing_match_hf_get_image_features(next_vision_onnx, next_hf_model, next_settings, size):
    import onnxruntime as ort

    w, h = size
    pixels, geo = prepare_tiles(smooth_image(w, h, seed=3), next_settings)
    sess = ort.InferenceSession(str(next_vision_onnx), providers=["CPUExecutionProvider"])
    (feats,) = sess.run(None, {"pixel_values": pixels})
    assert feats.shape == (geo.num_tiles, 36, 64)
    newline = next_hf_model.model.image_newline.detach().numpy()
    rows = pack_features(feats, geo, newline)
    ref = _hf_packed(next_hf_model, pixels, h, w)
    assert rows.shape == ref.shape == (geo.num_rows, 64)
    # fp32 rounding of a 3-layer CLIP + projector, |features| ~ 1: same bound as LLaVA-1.5's vision test.
    assert np.abs(rows - ref).max() <= 1e-4
    # The newline rows are exactly the model's image_newline vector (HF concatenates it, no arithmetic).
    mask = geo.newline_mask()
    np.testing.assert_array_equal(ref[mask], np.broadcast_to(newline, (mask.sum(), 64)))


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
