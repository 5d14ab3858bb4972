"""Qwen3-VL video (issue 27): an 8-frame video through the Pipeline == the independent HF reference
(tests/families/qwen3_vl/hf_video.py: HF's timestamped layout from Qwen3VLProcessor.replace_video_token, HF's
get_rope_index positions, HF's video features and DeepStack levels, the literal selector, its own DeepStack gather),
and bad video input refused in one line (too many frames, a file no video demuxer takes)."""

from __future__ import annotations

import numpy as np
import pytest

from coverpruner.errors import VideoError
from tests.families.qwen2_5_vl.hf_video import smooth_frames

pytestmark = pytest.mark.slow
PROMPT = "What happens to the red ball in this clip?"
NEW = 8
FPS = 2.0
#: 8 frames of 96 x 128 px: 32-px multiples inside the tiny checkpoint's limits (no resize on either side);
#: 4 temporal patches of 3 x 4 merged tokens = 48 visual tokens, stamped <0.2>, <1.2>, <2.2>, <3.2> seconds
SIZE = (96, 128)


def _messages(frames, **extra):
    return [{"role": "user", "content": [{"type": "video", "video": frames, "fps": FPS, **extra},
                                         {"type": "text", "text": PROMPT}]}]


@pytest.fixture(scope="module")
def video(qwen3_hf, qwen3_checkpoint, qwen3_export):
    from coverpruner.runtime.pipeline import Pipeline
    from tests.families.qwen3_vl.hf_video import video_native

    frames = smooth_frames(8, SIZE, seed=8)
    req = video_native(qwen3_hf, qwen3_checkpoint, frames, PROMPT, FPS)
    return Pipeline.load(qwen3_export), frames, req, set(qwen3_hf.generation_config.eos_token_id)


def test_layout_and_positions_equal_hf(video):
    """Token ids (timestamps between the temporal patches' vision spans) and M-RoPE positions == HF's."""
    pipe, frames, req, _ = video
    native = pipe.native_sequence(pipe.chat_request(_messages(frames), budget="full"))
    assert native.layout.input_ids.tolist() == req.inputs["input_ids"][0].tolist()
    assert "<1.2 seconds>" in native.layout.text and native.layout.text.count("<|vision_start|>") == 5
    np.testing.assert_array_equal(native.positions, req.positions[:, 0].numpy())
    np.testing.assert_array_equal(native.layout.image_spans[0], req.visual)


@pytest.mark.parametrize("budget", ["full", 16])
def test_video_tokens_and_kept_indices_equal_reference(video, qwen3_hf, budget):
    from tests.families.qwen3_vl import hf_reference as ref

    pipe, frames, req, eos = video
    got = pipe.chat(_messages(frames), budget=budget, max_new_tokens=NEW)
    keep = ref.select(qwen3_hf, req, "coverpruner", budget)
    clip = got.images[0]
    assert (clip.kind, clip.num_visual_tokens, clip.grid_thw, clip.num_frames) == ("video", 48, [4, 6, 8], 8)
    assert clip.kept_indices.tolist() == np.sort(keep).tolist() and len(keep) == (48 if budget == "full" else 16)
    assert got.token_ids == ref.pruned_generate(qwen3_hf, req, keep, NEW, eos)


@pytest.mark.parametrize("case,match", [
    ("many", "10 frames; at most 8 per video"),
    ("container", "cannot decode the video"),
])
def test_bad_video_fails_in_one_line(video, case, match):
    pipe, frames, _, _ = video
    part = smooth_frames(10, (64, 64)) if case == "many" else b"\x00\x00\x00\x18ftypmp42" + bytes(200)
    with pytest.raises(VideoError, match=match) as info:
        pipe.chat(_messages(part), max_video_frames=8, max_new_tokens=1)
    assert "\n" not in str(info.value) and str(info.value).startswith("messages[0].content[0]: ")


def test_video_file_is_sampled_and_stamped_as_hf(video, tmp_path):
    """A 12-frame 4-fps file (lossless FFV1): HF's sample_frames takes int(12 / 4 * 2) = 6 frames, indices
    round(linspace(0, 11, 6)); the timestamps are HF's _calculate_timestamps of those indices at the file's rate."""
    pytest.importorskip("av", reason="PyAV (the 'video' extra) decodes the video files")
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    from coverpruner.video import VideoInput
    from tests.families.qwen2_5_vl.test_video_preprocess import write_video

    pipe = video[0]
    frames = smooth_frames(12, SIZE, seed=12)
    clip = write_video(tmp_path / "clip.mkv", frames, fps=4)
    got = pipe.family_runtime.prepare_video(VideoInput(str(clip), where="clip"), {})
    indices = np.linspace(0, 11, 6).round().astype(int).tolist()
    assert got.facts["num_frames"] == 6 and tuple(got.facts["grid_thw"]) == (3, 6, 8)
    assert list(got.facts["timestamps"]) == Qwen3VLProcessor._calculate_timestamps(None, indices, 4.0, 2)
    np.testing.assert_array_equal(pipe.family_runtime.sampled_frames(VideoInput(str(clip)), {})[1], frames[indices[1]])


def test_video_window_selects_within_temporal_windows(video):
    """video_window=K: the pipeline hands select_in_windows each candidate's temporal window (temporal patch // K)
    and keeps what it returns (the 4 temporal patches of 12 rows in windows of 2)."""
    from coverpruner.selection import get_selector
    from coverpruner.selection.windowed import select_in_windows

    pipe, frames, _, _ = video
    windowed = pipe.chat(_messages(frames), budget=16, max_new_tokens=1, method="divprune", video_window=2)
    native = pipe.native_sequence(pipe.chat_request(_messages(frames), budget=16, method="divprune"))
    feats = np.asarray(native.spans[0].features, np.float32)
    windows = np.repeat(np.arange(4) // 2, 12).astype(np.int64)
    expected = select_in_windows(get_selector("divprune"), feats, None, 16, windows, tau=0.3, seed=None)
    np.testing.assert_array_equal(windowed.images[0].kept_indices, expected)
    assert set(np.asarray(expected) // 24) == {0, 1}  # both windows keep rows
