"""Qwen3.5 video: an 8-frame video through the Pipeline == the independent HF reference (HF's timestamped layout from
Qwen3VLProcessor.replace_video_token, HF's get_rope_index positions and video features:
tests/families/qwen3_vl/hf_video.py, which Qwen3.5's processor class shares; the demand of HF's first full-attention
layer, the literal selector, the greedy loop over HF's hybrid cache: tests/families/qwen3_5/hf_reference.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.families.qwen2_5_vl.hf_video import smooth_frames

pytestmark = pytest.mark.slow
PROMPT = "What happens to the red ball in this clip?"
NEW = 8
FPS = 2.0
#: 8 frames of 96 x 128 px: 4 temporal patches of 3 x 4 merged tokens = 48 visual tokens
SIZE = (96, 128)


def _messages(frames):
    return [{"role": "user", "content": [{"type": "video", "video": frames, "fps": FPS},
                                         {"type": "text", "text": PROMPT}]}]


@pytest.mark.parametrize("budget", ["full", 16])
def test_video_equals_reference(qwen35_hf, qwen35_checkpoint, qwen35_export_ort, budget):
    from coverpruner.runtime.pipeline import Pipeline
    from tests.families.qwen3_5 import hf_reference as ref
    from tests.families.qwen3_vl.hf_video import video_native

    frames = smooth_frames(8, SIZE, seed=8)
    req = video_native(qwen35_hf, qwen35_checkpoint, frames, PROMPT, FPS)
    pipe = Pipeline.load(qwen35_export_ort, threads=1)
    native = pipe.native_sequence(pipe.chat_request(_messages(frames), budget=budget))
    assert native.layout.input_ids.tolist() == req.inputs["input_ids"][0].tolist()
    np.testing.assert_array_equal(native.positions, req.positions[:, 0].numpy())
    got = pipe.chat(_messages(frames), budget=budget, max_new_tokens=NEW)
    keep = ref.select(qwen35_hf, req, "coverpruner", None if budget == "full" else budget)
    clip = got.images[0]
    assert (clip.kind, clip.num_visual_tokens, clip.grid_thw, clip.num_frames) == ("video", 48, [4, 6, 8], 8)
    assert clip.kept_indices.tolist() == np.sort(keep).tolist()
    eos = set(qwen35_hf.generation_config.eos_token_id)
    assert got.token_ids == ref.pruned_generate(qwen35_hf, req, keep, NEW, eos)
