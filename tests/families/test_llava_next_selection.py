"""LLaVA-NeXT candidates, newline policies and the two-panel selection picture (numpy/PIL, no model)."""

from __future__ import annotations

import numpy as np
import pytest

from coverpruner.families import get_family
from coverpruner.families.anyres import geometry, kept_rows
from coverpruner.families.anyres_picture import candidate_boxes, draw_anyres_selection
from tests.families.conftest import smooth_image


def test_candidates_skip_newline_rows_in_native_order(next_settings):
    geo = geometry(240, 200, next_settings)  # 2x2 grid, 12 x 10 unpadded -> 36 base + 120 grid + 12 newlines
    assert geo.grid_shape == (12, 10)
    mask = geo.newline_mask()
    assert mask.sum() == 12 and np.flatnonzero(mask).tolist() == [36 + 10 + 11 * i for i in range(12)]
    fam = get_family("llava_next")
    feats = np.arange(geo.num_tiles * 36 * 2, dtype=np.float32).reshape(geo.num_tiles, 36, 2)
    span = fam.image_span(feats, geo, np.array([-1.0, -1.0], np.float32))
    assert span.candidates.size == geo.num_candidates == 156
    assert (span.rows[span.newline] == -1).all() and (span.rows[span.candidates] >= 0).all()
    # base rows first, untouched and in order
    np.testing.assert_array_equal(span.rows[:36], feats[0])


def test_newline_policies():
    mask = np.array([0, 0, 0, 1, 0, 0, 1, 0, 0, 1], dtype=bool)  # 7 candidates, newlines at 3, 6, 9
    keep = np.array([1, 4, 6])  # candidates -> rows 1, 5, 8
    assert kept_rows(mask, keep, "drop").tolist() == [1, 5, 8]
    assert kept_rows(mask, keep, "keep").tolist() == [1, 3, 5, 6, 8, 9]
    assert kept_rows(mask, np.arange(7), "drop").tolist() == [0, 1, 2, 4, 5, 7, 8]
    with pytest.raises(ValueError, match="unknown newline policy 'sometimes'; expected one of \\['drop', 'keep'\\]"):
        kept_rows(mask, keep, "sometimes")


def test_candidate_boxes_cover_the_image(next_settings):
    geo = geometry(240, 200, next_settings)
    boxes, is_base = candidate_boxes(geo, next_settings)
    assert boxes.shape == (geo.num_candidates, 4) and is_base.sum() == 36
    # base tokens tile the whole image exactly (6 x 6 cells of 200/6 x 240/6 px)
    np.testing.assert_allclose(boxes[is_base][[0, -1]], [[0, 0, 200 / 6, 40], [1000 / 6, 200, 200, 240]])
    grid = boxes[~is_base]
    # grid tokens (after unpadding) reach every image border to within one patch
    patch_px = 14 * 240 / 168  # a 14-px canvas patch in image pixels (240 px image -> 168 px canvas)
    assert grid[:, 0].min() <= patch_px and grid[:, 1].min() <= patch_px
    assert grid[:, 2].max() >= 200 - patch_px and grid[:, 3].max() == 240
    assert (grid[:, 2] > grid[:, 0]).all() and (grid[:, 3] > grid[:, 1]).all()


def test_picture_brightens_exactly_the_kept_tokens(next_settings):
    image = smooth_image(200, 240, seed=1)
    geo = geometry(240, 200, next_settings)
    keep = np.array([0, 36 + 119])  # top-left base token, bottom-right grid token
    pic = np.asarray(draw_anyres_selection(image, geo, next_settings, keep, side=240, dim=0.25)).astype(int)
    left, right = pic[14:14 + 240, :200], pic[14:14 + 240, 208:408]
    src = np.asarray(image).astype(int)
    # inside the kept boxes (away from the outline) the image is unchanged; elsewhere dimmed to 1/4
    np.testing.assert_array_equal(left[5:35, 5:28], src[5:35, 5:28])
    np.testing.assert_array_equal(left[100:200, 100:190], (src[100:200, 100:190] * 0.25).astype(int))
    assert np.array_equal(right[225:238, 185:198], src[225:238, 185:198])
    assert np.array_equal(right[5:35, 5:28], (src[5:35, 5:28] * 0.25).astype(int))


def test_picture_of_an_extreme_aspect_ratio_has_no_grid_tokens(next_settings):
    image = smooth_image(1000, 50, seed=2)
    geo = geometry(50, 1000, next_settings)
    assert geo.num_candidates == 36  # the unpadded grid keeps zero rows
    pic = draw_anyres_selection(image, geo, next_settings, np.arange(36))
    assert pic.width > 2 * 440
