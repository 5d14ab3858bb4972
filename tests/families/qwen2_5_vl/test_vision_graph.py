"""Qwen2.5-VL's vision quirks: host-side window tables == transformers', the tiny fixture's windows, the window
path matters, padded windows. vision.onnx == HF get_image_features(...).pooler_output is the matrix's
(tests/matrix/test_graph_parity.py, qwen2_5_vl-vision-*)."""

import numpy as np
import pytest
import torch

from coverpruner.families.qwen_vl import QwenImageSettings, preprocess_qwen_image
from coverpruner.families.qwen2_5_vl.vision import (image_cu_seqlens, vision_inputs, vision_position_ids,
                                              window_index)
from tests.families.qwen2_5_vl.fixtures import ort_session, sample_image
from tests.families.qwen2_5_vl.matrix import VISION_SIZES

# (H, W) of the matrix's vision parity cases (tests/matrix/test_graph_parity.py), whose grids are checked here
IMAGE_SIZES = VISION_SIZES


def _settings(ckpt):
    import json

    return QwenImageSettings.from_dict(json.loads((ckpt / "preprocessor_config.json").read_text()))


@pytest.mark.parametrize("grid", [(1, 16, 16), (1, 22, 18), (1, 10, 30), (1, 12, 12), (2, 6, 10)])
@pytest.mark.parametrize("window", [84, 112])
def test_host_tables_equal_hf(grid, window):
    from transformers.vision_utils import get_vision_attention_seqlens, get_vision_position_ids, get_vision_window_index

    g = torch.tensor([grid])
    ref_index, ref_cu = get_vision_window_index(g, spatial_merge_size=2, window_size=window, patch_size=14)
    index, cu = window_index(grid, 2, window, 14)
    np.testing.assert_array_equal(index, ref_index.numpy())
    np.testing.assert_array_equal(cu, ref_cu.numpy())
    np.testing.assert_array_equal(vision_position_ids(grid, 2), get_vision_position_ids(g, 2).numpy())

    class _Cfg:
        _attn_implementation = "eager"

    ref_full, _ = get_vision_attention_seqlens(g, _Cfg())
    np.testing.assert_array_equal(image_cu_seqlens(grid), ref_full.numpy())


def test_tiny_windows_are_smaller_than_the_grids(qwen_hf, qwen_checkpoint):
    """The test images really exercise window attention: every grid the parity test feeds is split into several
    3x3-token windows, edge windows are partial unless 3 divides the grid, and the windows cover every token once."""
    vc = qwen_hf.config.vision_config
    side = vc.window_size // vc.spatial_merge_size // vc.patch_size
    assert side == 3 and list(vc.fullatt_block_indexes) == [1, 3] and vc.depth == 4
    merged = []
    for size in IMAGE_SIZES:
        img = preprocess_qwen_image(sample_image(1, size), _settings(qwen_checkpoint))
        _, h, w = img.grid_thw
        gh, gw = h // vc.spatial_merge_size, w // vc.spatial_merge_size
        merged.append((gh, gw))
        index, cu = window_index(img.grid_thw, vc.spatial_merge_size, vc.window_size, vc.patch_size)
        np.testing.assert_array_equal(np.sort(index), np.arange(gh * gw))  # a permutation of the tokens
        tokens = np.diff(cu) // vc.spatial_merge_size ** 2  # merged tokens per window
        assert len(tokens) == -(-gh // side) * -(-gw // side) > 1
        assert tokens.max() == side * side
        assert (tokens.min() < side * side) == (gh % side != 0 or gw % side != 0), (size, gh, gw)
    assert merged == [(8, 8), (11, 9), (5, 15), (13, 11), (6, 6)]  # the grids IMAGE_SIZES promises


@pytest.fixture(scope="module")
def vision_session(qwen_export):
    return ort_session(qwen_export / "vision.onnx")


@pytest.mark.slow
def test_vision_onnx_matches_hf_three_frames(qwen_hf, vision_session):
    """Three frames (grid t=3, as a video): the full-attention blocks attend within each frame; frame boundaries
    fall inside query blocks, so one block's mask rows [B, N] hold two segments."""
    vc = qwen_hf.config.vision_config
    grid = (3, 6, 8)  # 144 patches = 3 frames of 48; 8 query blocks of 18: frame 1 starts inside block 2 (36-54)
    rng = np.random.default_rng(3)
    pixels = rng.standard_normal((144, vc.in_channels * vc.temporal_patch_size * vc.patch_size ** 2), np.float32)
    inputs = vision_inputs(pixels, grid, vc.spatial_merge_size, vc.window_size, vc.patch_size)
    assert inputs["full_segments"].tolist() == [0] * 48 + [1] * 48 + [2] * 48
    (ours,) = vision_session.run(None, inputs)
    with torch.no_grad():
        ref = qwen_hf.model.get_image_features(torch.from_numpy(pixels), torch.tensor([grid])).pooler_output[0].numpy()
    assert ours.shape == ref.shape == (36, qwen_hf.config.text_config.hidden_size)
    scale = np.abs(ref).max()  # the tolerance of test_vision_onnx_matches_hf
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-5 * scale)


def test_full_attention_runs_in_query_blocks(qwen_export, qwen_hf):
    """vision.onnx computes each full-attention block in FULL_ATTENTION_CHUNKS query blocks (one Softmax each), each
    window block in one batched Softmax: the graph never holds a [heads, N, N] score tensor."""
    import onnx

    from coverpruner.families.qwen2_5_vl.graphs import FULL_ATTENTION_CHUNKS

    vc = qwen_hf.config.vision_config
    graph = onnx.load(str(qwen_export / "vision.onnx"), load_external_data=False).graph
    softmax = sum(node.op_type == "Softmax" for node in graph.node)
    full = len(vc.fullatt_block_indexes)
    assert FULL_ATTENTION_CHUNKS > 1
    assert softmax == (vc.depth - full) + full * FULL_ATTENTION_CHUNKS


@pytest.mark.slow
def test_window_attention_matters(qwen_checkpoint, qwen_hf, vision_session):
    """One window spanning the whole image (= full attention in the window blocks) changes V: the fixture
    exercises the window path."""
    img = preprocess_qwen_image(sample_image(2, (300, 250)), _settings(qwen_checkpoint))
    vc = qwen_hf.config.vision_config
    inputs = vision_inputs(img.pixel_values, img.grid_thw, vc.spatial_merge_size, vc.window_size, vc.patch_size)
    (good,) = vision_session.run(None, inputs)
    n_patches = img.pixel_values.shape[0]
    one_window = {"window_gather": np.arange(n_patches)[None], "window_lengths": np.array([n_patches]),
                  "window_scatter": np.arange(n_patches)}
    (bad,) = vision_session.run(None, {**inputs, **one_window})
    assert np.abs(good - bad).max() > 1e-2 * np.abs(good).max()


def test_padded_windows_round_trip():
    from coverpruner.families.qwen2_5_vl.vision import padded_windows

    cu = np.array([0, 36, 60, 96, 104])
    gather, lengths, scatter = padded_windows(cu)
    assert gather.shape == (4, 36) and lengths.tolist() == [36, 24, 36, 8]
    rows = np.arange(104)
    np.testing.assert_array_equal(gather.reshape(-1)[scatter], rows)  # scatter inverts gather on real slots
    assert (gather[1, 24:] == 36).all()  # padding repeats the window's first row
