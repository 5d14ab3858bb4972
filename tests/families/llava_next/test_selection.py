"""LLaVA-NeXT candidates, newline policies and the two-panel selection picture."""

from __future__ import annotations

import numpy as np
import pytest

from coverpruner.families.llava_next.anyres import geometry
from coverpruner.families.llava_next.runtime import panels
from coverpruner.runtime.visualize import draw_selection
from tests.families.llava_next.fixtures import smooth_image


def test_candidates_skip_newline_rows_in_native_order(next_settings):
    geo = geometry(240, 200, next_settings)  # 2x2 grid, 12 x 10 unpadded -> 36 base + 120 grid + 12 newlines
    assert geo.grid_shape == (12, 10) and (geo.num_candidates, geo.num_rows) == (156, 168)
    mask = geo.newline_mask()
    assert np.flatnonzero(mask).tolist() == [36 + 10 + 11 * i for i in range(12)]


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["drop", "keep"])
def test_runtime_span_marks_candidates_and_kept_newlines(next_export, policy):
    from coverpruner.engine_dir import load_manifest
    from coverpruner.families import get_family

    rt = get_family("llava_next").runtime(load_manifest(next_export))
    vision = rt.prepare_image(smooth_image(200, 240), {"newline_policy": policy})
    geo = vision.facts["geometry"]
    assert vision.feeds["pixel_values"].shape == (geo.num_tiles, 3, 84, 84) and vision.num_candidates == 156
    feats = np.arange(geo.num_tiles * 36 * 64, dtype=np.float32).reshape(geo.num_tiles, 36, 64)
    span = rt.image_span({"image_features": feats}, vision, {"newline_policy": policy})
    newline_rows = [36 + 10 + 11 * i for i in range(12)]
    np.testing.assert_array_equal(span.rows[newline_rows], np.broadcast_to(rt.newline, (12, 64)))
    assert span.candidates.tolist() == [i for i in range(168) if i not in newline_rows]
    np.testing.assert_array_equal(span.rows[:36], feats[0])  # base rows first, untouched, in order
    assert span.always_kept.tolist() == (newline_rows if policy == "keep" else [])


def test_panels_map_candidates_to_image_coordinates(next_settings):
    geo = geometry(240, 200, next_settings)  # best 168x168: image resized to 168 x 140, pasted 14 px from the left
    base, high = panels(geo, next_settings)
    assert base.shape == (6, 6) and base.box == (0.0, 0.0, 200.0, 240.0)
    assert base.cells.tolist() == list(range(36))
    assert high.shape == (12, 12)
    # canvas 168 x 168 in image pixels: 200/140 per canvas pixel horizontally, paste 14 px -> left edge -20
    np.testing.assert_allclose(high.box, (-20.0, 0.0, 220.0, 240.0))
    cells = high.cells.reshape(12, 12)
    assert (cells[:, 0] == -1).all() and (cells[:, 11] == -1).all()  # unpadding cut one column per side
    assert cells[0, 1] == 36 and cells[11, 10] == 155 and sorted(cells[cells >= 0].tolist()) == list(range(36, 156))


def test_picture_brightens_exactly_the_kept_tokens(next_settings):
    image = smooth_image(200, 240, seed=1)
    geo = geometry(240, 200, next_settings)
    keep = np.array([0, 155])  # top-left base token, bottom-right grid token
    pic = np.asarray(draw_selection(image, keep, panels(geo, next_settings), min_side=240, dim=0.25)).astype(int)
    src = np.asarray(image).astype(int)
    left = pic[:240, :200]
    # inside the kept base cell (away from its outline) the image is unchanged; elsewhere dimmed to 1/4
    np.testing.assert_array_equal(left[20:35, 5:28], src[20:35, 5:28])
    np.testing.assert_array_equal(left[100:200, 100:190], (src[100:200, 100:190] * 0.25).astype(int))
    assert pic.shape[1] > 400  # two panels side by side


def test_picture_of_an_extreme_aspect_ratio_has_no_grid_candidates(next_settings):
    geo = geometry(50, 1000, next_settings)
    assert geo.num_candidates == 36  # the unpadded grid keeps zero rows
    base, high = panels(geo, next_settings)
    assert (high.cells == -1).all()
    pic = draw_selection(smooth_image(1000, 50, seed=2), np.arange(36), (base, high))
    assert pic.width > 2 * 440
