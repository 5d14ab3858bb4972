"""Issue 29 item 2: a video's vision runs one temporal patch at a time (families/qwen2_5_vl/vision.temporal_chunks),
and the chunked output equals the one run over the whole video.

The reference is the vision graph over the video's whole feeds (``VisionInputs.feeds``, one run: every temporal
patch at once, the graph's block-diagonal mask keeping them apart), which tests/families/qwen2_5_vl/
test_video_pipeline.py ties to transformers. Every attention of the tower is inside one temporal patch, so the only
differences a chunked run may have are float32 summation order over the masked keys (each exactly 0 after the
softmax) and GEMM blocking over a different row count: at most a few float32 ulps of the outputs (|x| <= ~10 here),
so atol 1e-5 (the tower's HF parity tolerance) covers it with margin; in practice they are bit-equal.
"""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def pipe(qwen_export):
    from coverpruner.runtime.pipeline import Pipeline

    return Pipeline.load(qwen_export, threads=1, prefix_cache_mb=0)


def _video(pipe, frames: int, size=(112, 168)):
    from coverpruner.video import VideoInput

    rng = np.random.default_rng(frames)
    clip = [rng.integers(0, 256, (*size, 3), dtype=np.uint8) for _ in range(frames)]
    return pipe.family_runtime.prepare_video(VideoInput(clip, fps=2.0), {"max_video_frames": 64})


def test_a_video_runs_one_temporal_patch_at_a_time_and_equals_the_whole_run(pipe):
    vision = _video(pipe, 6)  # 3 temporal patches of 8 x 12 patches
    t, gh, gw = vision.facts["grid_thw"]
    assert t == 3 and len(vision.chunks) == 3
    assert all(c["pixel_values"].shape[0] == gh * gw for c in vision.chunks)  # one frame pair per run
    whole = pipe.vision(vision.feeds)["image_features"]
    chunked = pipe.vision_of(vision)["image_features"]
    assert chunked.shape == whole.shape == (vision.num_candidates, whole.shape[1])
    np.testing.assert_allclose(chunked, whole, rtol=0, atol=1e-5)


def test_uneven_chunks_keep_the_order(pipe):
    """Chunks of 2 temporal patches over 5 (2 + 2 + 1): the rows stay temporal patch by temporal patch."""
    from coverpruner.families.qwen2_5_vl.vision import temporal_chunks

    vision = _video(pipe, 10, (56, 84))
    rt = pipe.family_runtime
    chunks = temporal_chunks(vision.feeds["pixel_values"], vision.facts["grid_thw"], rt.merge, rt.window, rt.patch,
                             per_chunk=2)
    t, gh, gw = vision.facts["grid_thw"]
    assert t == 5 and [c["pixel_values"].shape[0] // (gh * gw) for c in chunks] == [2, 2, 1]
    whole = pipe.vision(vision.feeds)["image_features"]
    parts = np.concatenate([pipe.vision(c)["image_features"] for c in chunks])
    np.testing.assert_allclose(parts, whole, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="per_chunk"):
        temporal_chunks(vision.feeds["pixel_values"], vision.facts["grid_thw"], rt.merge, rt.window, rt.patch, 0)


def test_an_image_has_no_chunks(pipe, demo_image):
    from PIL import Image

    vision = pipe.family_runtime.prepare_image(Image.open(demo_image).convert("RGB"), {})
    assert vision.chunks == ()
