"""Qwen3-VL video rules (families/qwen3_video.py) == transformers' own functions, without a model: frame
sampling (Qwen3VLVideoProcessor.sample_frames), the whole-clip smart resize (video_processing_qwen3_vl.smart_resize)
and the timestamps (Qwen3VLProcessor._calculate_timestamps), over a grid of clip lengths, rates and sizes."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from coverpruner.families.qwen3_video import (Qwen3VideoSettings, placeholder, sample_count, sample_indices,
                                                 timestamps, video_smart_resize)


@pytest.mark.parametrize("total,video_fps,fps", [(95, 29.97, 2.0), (8, 24.0, 2.0), (300, 30.0, 1.0), (7, 2.0, 2.0),
                                                 (1000, 25.0, 4.0), (61, 12.5, 0.5)])
def test_sampling_equals_hf(total, video_fps, fps):
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    from transformers.video_utils import VideoMetadata

    v = Qwen3VideoSettings()
    hf = Qwen3VLVideoProcessor.sample_frames(SimpleNamespace(fps=fps, min_frames=v.min_frames, max_frames=v.max_frames),
                                             VideoMetadata(total_num_frames=total, fps=video_fps))
    ours = sample_indices(total, sample_count(total, video_fps, fps, v, None))
    np.testing.assert_array_equal(ours, hf)


@pytest.mark.parametrize("frames", [2, 7, 8, 64])
@pytest.mark.parametrize("height,width", [(96, 128), (480, 640), (20, 700), (1080, 1920), (33, 33)])
def test_whole_clip_resize_equals_hf(frames, height, width):
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize

    for lo, hi in ((4096, 163840), (128 * 32 * 32, 768 * 32 * 32), (4096, 25165824)):
        want = smart_resize(frames, height, width, temporal_factor=2, factor=32, min_pixels=lo, max_pixels=hi)
        assert video_smart_resize(frames, height, width, 32, lo, hi) == want


@pytest.mark.parametrize("indices,fps", [(list(range(8)), 2.0), ([0, 19, 38, 56, 75, 94], 29.97), ([0, 3, 7], 2.0)])
def test_timestamps_and_text_equal_hf(indices, fps):
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    want = Qwen3VLProcessor._calculate_timestamps(None, list(indices), fps, 2)
    assert list(timestamps(indices, fps)) == want
    text = placeholder(want, 3)
    assert text.count("<|video_pad|>") == 3 * len(want) and text.startswith(f"<{want[0]:.1f} seconds><|vision_start|>")
