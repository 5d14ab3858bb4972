"""HF-side video reference for the Qwen3-VL tests (torch, transformers), independent of coverpruner's video code.

transformers' video processor needs torchvision (not installed here), so pixel_values_videos are built from HF's own
PIL image processor as for Qwen2.5-VL (tests/families/qwen2_5_vl/hf_video.py: temporal patch k = slot 0 of frame
2k's image patches and slot 0 of frame 2k+1's, the video processor's row and column order). The layout is HF's own:
the chat template's video placeholder replaced by Qwen3VLProcessor.replace_video_token (the timestamped per-frame
spans) with the frames' VideoMetadata (fps, frames_indices 0..F-1); positions from the model's get_rope_index with
mm_token_type_ids 2 at the video tokens; features and DeepStack levels from get_video_features (Qwen3.5, whose tower
is Qwen3-VL's without DeepStack and whose processor is Qwen3VLProcessor, uses it as well: no levels then).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from tests.families.qwen3_vl.hf_qwen3 import hf_processor
from tests.families.qwen3_vl.hf_reference import Native


def video_pixel_values(ckpt, frames) -> tuple[torch.Tensor, list[int]]:
    """frames: uint8 [H, W, 3] (even count, sides multiples of 32 in the image limits) -> (float32 [t*gh*gw,
    1536], [t, gh, gw])."""
    proc = hf_processor(ckpt).image_processor
    per_frame = [proc(images=[f], return_tensors="pt") for f in frames]
    grid = per_frame[0]["image_grid_thw"][0].tolist()
    n = grid[1] * grid[2]
    slots = [p["pixel_values"].view(n, 3, 2, 16, 16) for p in per_frame]
    patches = [torch.stack([slots[2 * k][:, :, 0], slots[2 * k + 1][:, :, 0]], dim=2).reshape(n, -1)
               for k in range(len(frames) // 2)]
    return torch.cat(patches), [len(frames) // 2, grid[1], grid[2]]


def video_native(model, ckpt, frames, prompt: str, fps: float) -> Native:
    """One user turn [video, prompt] laid out and run by HF (module doc)."""
    from transformers.video_utils import VideoMetadata

    proc = hf_processor(ckpt)
    proc.video_processor = SimpleNamespace(merge_size=2, temporal_patch_size=2)  # what replace_video_token reads
    pixels, grid = video_pixel_values(ckpt, frames)
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": prompt}]}]
    text = proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    meta = VideoMetadata(total_num_frames=len(frames), fps=fps, frames_indices=list(range(len(frames))))
    expanded = proc.replace_video_token({"video_grid_thw": torch.tensor([grid]), "video_metadata": [meta]}, 0)
    assert text.count("<|video_pad|>") == 1
    text = text.replace("<|video_pad|>", expanded)
    ids = torch.tensor([proc.tokenizer(text, add_special_tokens=False)["input_ids"]])
    cfg = model.config
    types = (ids == cfg.video_token_id).to(torch.int32) * 2
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "mm_token_type_ids": types,
              "pixel_values_videos": pixels, "video_grid_thw": torch.tensor([grid])}
    visual = torch.nonzero(ids[0] == cfg.video_token_id).flatten()
    end = int(torch.nonzero(ids[0] == cfg.vision_end_token_id).flatten()[-1])
    im_end = int(torch.nonzero(ids[0] == cfg.text_config.eos_token_id).flatten()[-1])
    with torch.no_grad():
        out = model.model.get_video_features(pixels, inputs["video_grid_thw"])
        feats = out.pooler_output[0]
        embeds = model.model.get_input_embeddings()(ids).clone()
        embeds[0, visual] = feats
        positions, _ = model.model.get_rope_index(ids, types, video_grid_thw=inputs["video_grid_thw"])
    levels = getattr(out, "deepstack_features", None)
    return Native(inputs, embeds, positions, visual.numpy(), np.arange(end + 1, im_end), feats,
                  None if levels is None else [level[0] for level in levels])
