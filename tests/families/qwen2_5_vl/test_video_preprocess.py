"""Qwen2.5-VL video preprocessing: qwen-vl-utils' sampling rules (literal numbers worked out by hand), pixel values
== HF's own image processor frame by frame (tests/families/qwen2_5_vl/hf_video.py), PyAV decoding of a lossless
file == the frames written, the file path's sampled frames == the frame-list path, and one-line errors."""

import json

import numpy as np
import pytest

from coverpruner.errors import VideoError
from coverpruner.families.qwen2_5_vl import video as qv
from coverpruner.families.qwen_vl import QwenImageSettings
from coverpruner.video import VideoInput, read_video
from tests.families.qwen2_5_vl.hf_video import smooth_frames, video_pixel_values

av = pytest.importorskip("av", reason="PyAV (the 'video' extra) decodes the video files")
#: Qwen2.5-VL-7B-Instruct's image processor limits
REAL = QwenImageSettings(min_pixels=56 * 56, max_pixels=28 * 28 * 16384)


def write_video(path, frames, fps: int = 10):
    """A lossless FFV1 file (RGB as bgr0), so decoding gives back exactly ``frames``."""
    h, w = frames[0].shape[:2]
    with av.open(str(path), "w") as container:
        stream = container.add_stream("ffv1", rate=fps)
        stream.width, stream.height, stream.pix_fmt = w, h, "bgr0"
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


@pytest.fixture(scope="module")
def tiny_settings(qwen_checkpoint):
    return QwenImageSettings.from_dict(json.loads((qwen_checkpoint / "preprocessor_config.json").read_text()))


@pytest.mark.parametrize("total,video_fps,fps,max_frames,expected", [
    (30, 10.0, None, None, 6),      # 3 s at 2 fps
    (300, 30.0, None, None, 20),    # 10 s at 2 fps
    (300, 30.0, None, 8, 8),        # max_frames caps it
    (300, 30.0, 0.1, None, 4),      # 1 frame asked for, FPS_MIN_FRAMES = 4
    (3, 30.0, None, None, 2),       # min(4, floor(3 to even) = 2)
    (7, 1.0, 2.0, None, 6),         # 14 asked, clamped to 7, floored to even
    (10000, 25.0, 2.0, None, 768),  # FPS_MAX_FRAMES
    (301, 30.0, 1.5, 9, 8),         # max_frames floored to even first
])
def test_sample_count_follows_qwen_vl_utils(total, video_fps, fps, max_frames, expected):
    assert qv.sample_count(total, video_fps, fps, max_frames) == expected


def test_sample_count_below_two_frames_is_refused():
    with pytest.raises(VideoError, match="at least 2"):
        qv.sample_count(1, 30.0)


def test_sample_indices_round_linspace():
    np.testing.assert_array_equal(qv.sample_indices(30, 6), [0, 6, 12, 17, 23, 29])
    np.testing.assert_array_equal(qv.sample_indices(9, 4), [0, 3, 5, 8])  # 2.667 -> 3, 5.333 -> 5


def test_file_pixel_budget():
    """max(min(768*28*28, 0.9*128000*28*28 / n * 2), 1.05 * 128*28*28), inside the image limits."""
    assert qv.file_pixel_limits(16, REAL) == (128 * 784, 768 * 784)
    assert qv.file_pixel_limits(768, REAL) == (128 * 784, 235200)  # 90,316,800 / 768 * 2
    assert qv.file_pixel_limits(16, QwenImageSettings(min_pixels=3136, max_pixels=28 * 28 * 160)) == \
        (28 * 28 * 128, 28 * 28 * 160)  # a small checkpoint's max_pixels bounds the budget


@pytest.mark.parametrize("count,size", [(7, (100, 130)), (8, (84, 112)), (4, (230, 60))])
def test_pixel_values_equal_hf_image_processor_frame_by_frame(count, size, tiny_settings, qwen_checkpoint):
    """Frames resized like images (PIL bicubic, the checkpoint's limits), padded with the last to an even count;
    temporal patch k = HF's patches of frame 2k (slot 0) and frame 2k+1 (slot 1)."""
    frames = smooth_frames(count, size, seed=count)
    ours = qv.preprocess_qwen_video(VideoInput(frames, fps=4.0), tiny_settings)
    expected, grid = video_pixel_values(qwen_checkpoint, frames)
    assert list(ours.grid_thw) == grid and ours.num_frames == count + count % 2
    assert ours.second_per_grid_t == 0.5
    np.testing.assert_array_equal(ours.pixel_values, expected.numpy())


def test_pyav_reads_back_a_lossless_file(tmp_path):
    frames = smooth_frames(12, (48, 64), seed=1)
    path = write_video(tmp_path / "clip.mkv", frames, fps=6)
    for source in (path, str(path), path.read_bytes()):
        got, fps = read_video(source)
        assert fps == 6.0 and len(got) == 12
        for a, b in zip(got, frames):
            np.testing.assert_array_equal(a, b)
    got, _ = read_video(path, pick=lambda total, fps: [0, 5, 11])
    for a, k in zip(got, [0, 5, 11]):
        np.testing.assert_array_equal(a, frames[k])


def test_file_sampling_equals_the_frame_list_path(tmp_path, tiny_settings):
    """A 30-frame 10 fps file -> 6 frames (0, 6, 12, 17, 23, 29) at a sampled 2 fps, resized for the video pixel
    budget; the same frames given as a list at that size and fps give the same video."""
    from PIL import Image

    frames = smooth_frames(30, (48, 64), seed=2)
    path = write_video(tmp_path / "clip.mkv", frames, fps=10)
    from_file = qv.preprocess_qwen_video(VideoInput(str(path)), tiny_settings)
    h, w = from_file.resized
    assert from_file.num_frames == 6 and from_file.second_per_grid_t == 1.0
    assert 28 * 28 * 128 <= h * w <= tiny_settings.max_pixels  # VIDEO_MIN_PIXELS, inside the checkpoint's limit
    picked = [np.asarray(Image.fromarray(frames[k]).resize((w, h), Image.BICUBIC)) for k in [0, 6, 12, 17, 23, 29]]
    from_list = qv.preprocess_qwen_video(VideoInput(picked, fps=2.0), tiny_settings)
    assert from_list.grid_thw == from_file.grid_thw
    np.testing.assert_array_equal(from_file.pixel_values, from_list.pixel_values)
    from_bytes = qv.preprocess_qwen_video(VideoInput(path.read_bytes(), max_frames=4), tiny_settings)
    assert from_bytes.num_frames == 4 and from_bytes.second_per_grid_t == pytest.approx(2 / (4 / 30 * 10))


def _error(video, settings, limit=64) -> str:
    with pytest.raises(VideoError) as info:
        qv.preprocess_qwen_video(video, settings, limit, where="messages[0].content[0]")
    message = str(info.value)
    assert "\n" not in message and message.startswith("messages[0].content[0]")
    return message


def test_errors_are_one_line(tmp_path, tiny_settings):
    frames = smooth_frames(10, (56, 56))
    assert "10 frames; at most 8" in _error(VideoInput(frames), tiny_settings, 8)
    path = write_video(tmp_path / "long.mkv", smooth_frames(40, (48, 64)), fps=2)
    assert "samples 40 frames" in _error(VideoInput(str(path), fps=2.0), tiny_settings, 16)
    assert "same size" in _error(VideoInput(frames[:2] + smooth_frames(1, (84, 56))), tiny_settings)
    assert "frame 1" in _error(VideoInput([frames[0], np.zeros((4, 4), np.float32)]), tiny_settings)
    corrupt = tmp_path / "corrupt.mp4"
    corrupt.write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 4)
    with pytest.raises(VideoError, match="corrupt.mp4: cannot decode the video"):
        read_video(corrupt)
    with pytest.raises(VideoError, match="video not found"):
        read_video(tmp_path / "missing.mp4")
    with pytest.raises(VideoError, match=r"video \(9 bytes\): cannot decode"):
        read_video(b"not video")


def test_only_video_containers_are_opened(tmp_path):
    """FFmpeg left to probe freely takes an ffconcat script (which reads other files by path) and an image as a
    one-frame video; read_video opens video container formats only."""
    clip = write_video(tmp_path / "clip.mkv", smooth_frames(4, (56, 56)), fps=4)
    assert len(read_video(clip)[0]) == 4
    script = tmp_path / "list.ffconcat"
    script.write_text(f"ffconcat version 1.0\nfile '{clip}'\n")
    from PIL import Image

    png = tmp_path / "still.png"
    Image.fromarray(smooth_frames(1, (56, 56))[0]).save(png)
    for source in (script, script.read_bytes(), png, png.read_bytes()):
        with pytest.raises(VideoError, match="cannot decode the video"):
            read_video(source)
