"""Qwen2.5-VL video layout and M-RoPE positions == transformers: the family runtime's ids for a conversation
mixing images and videos == the chat template expanded as the processor does, and its native positions ==
model.model.get_rope_index (image_grid_thw, video_grid_thw, second_per_grid_ts) at several fps (integer and
fractional temporal steps)."""

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from coverpruner.engine_dir import load_manifest
from coverpruner.families import get_family
from coverpruner.families.qwen_vl import native_positions
from coverpruner.video import VideoInput
from tests.families.qwen2_5_vl.fixtures import sample_image
from tests.families.qwen2_5_vl.hf_video import hf_video_inputs, smooth_frames

pytestmark = pytest.mark.slow


def _runtime(engine_dir):
    return get_family("qwen2_5_vl").runtime(load_manifest(engine_dir))


@pytest.mark.parametrize("fps", [2.0, 3.0, 0.7])
def test_mixed_conversation_ids_and_positions_equal_hf(fps, qwen_export, qwen_hf, qwen_checkpoint):
    rt = _runtime(qwen_export)
    tok = Tokenizer.from_file(str(qwen_export / "tokenizer.json"))
    image = sample_image(2, (120, 150))
    video_a, video_b = smooth_frames(6, (84, 112), seed=1), smooth_frames(5, (56, 140), seed=2)
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "You watch clips."}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "video"}, {"type": "text", "text": "Compare them."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "The clip moves."}]},
        {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "And this one?"}]},
    ]
    visions = [rt.prepare_image(image, {}), rt.prepare_video(VideoInput(video_a, fps=fps), {}),
               rt.prepare_video(VideoInput(video_b, fps=fps), {})]
    layout = rt.conversation_layout(tok, messages, [v.num_candidates for v in visions])
    ours = rt.native_positions(layout, visions)

    inputs = hf_video_inputs(qwen_hf, qwen_checkpoint, messages, [video_a, video_b], images=[image], fps=fps)
    np.testing.assert_array_equal(layout.input_ids, inputs["input_ids"][0].numpy())
    with torch.no_grad():
        ref, _ = qwen_hf.model.get_rope_index(inputs["input_ids"], inputs["mm_token_type_ids"],
                                              image_grid_thw=inputs["image_grid_thw"],
                                              video_grid_thw=inputs["video_grid_thw"],
                                              second_per_grid_ts=inputs["second_per_grid_ts"])
    np.testing.assert_array_equal(ours, ref[:, 0].numpy())
    assert [v.facts["grid_thw"] for v in visions[1:]] == [tuple(g) for g in inputs["video_grid_thw"].tolist()]
    # the spans: image, video a, video b, in order, with the video token
    ids = layout.input_ids
    assert [int(ids[s[0]]) for s in layout.image_spans] == [qwen_hf.config.image_token_id] + \
        [qwen_hf.config.video_token_id] * 2


def test_temporal_positions_by_hand():
    """2 temporal patches of 1 x 2 merged tokens at interval 1.3333334 (tokens_per_second 2 x 2/3 s), after 2 text
    tokens: t = 2 + trunc(0 or 1.333) = 2, 3; h = 2; w = 2, 3; the text after continues at 2 + max(gh, gw) = 4."""
    ids = np.array([1, 1, 7, 7, 7, 7, 1])
    pos = native_positions(ids, [9, 7], [(2, 2, 4)], 2, [np.float32(2) * np.float32(2 / 3)])
    np.testing.assert_array_equal(pos, [[0, 1, 2, 2, 3, 3, 4], [0, 1, 2, 2, 2, 2, 4], [0, 1, 2, 3, 2, 3, 4]])
