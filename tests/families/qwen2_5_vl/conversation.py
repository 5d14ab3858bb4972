"""Qwen2.5-VL's hooks for the conversation reference (tests/conversations/reference.py): how transformers loads,
prepares and embeds this family (M-RoPE positions from HF's get_rope_index). Written from transformers."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# hooks the conversation reference looks up, the same for both Qwen families (tests/families/qwen_common.py)
from tests.families.qwen_common import before_generate, native_positions, processor_inputs  # noqa: F401
from tests.families.qwen_common import single_image_reference as single_image

#: pruned positions: "native" (kept rows keep their M-RoPE positions, decode at max(native)+1+t in all rows)
POSITIONS = "native"


def load(ckpt):
    """HF's Qwen2_5_VLProcessor with the PIL image processor (the video processor, torchvision, left out) and the
    eager float32 model."""
    import torch
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    class _ImageOnly(Qwen2_5_VLProcessor):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    processor = _ImageOnly(image_processor=Qwen2VLImageProcessorPil.from_pretrained(str(ckpt)),
                           tokenizer=AutoTokenizer.from_pretrained(str(ckpt)), video_processor=None,
                           chat_template=(Path(ckpt) / "chat_template.jinja").read_text())
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(ckpt), dtype=torch.float32,
                                                               attn_implementation="eager").eval()
    return processor, model


def image_features(model, inputs: dict) -> list:
    import torch

    with torch.no_grad():
        return list(model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"]).pooler_output)


def qwen_literal_positions(ids: list[int], spans: list[np.ndarray], grids: list[tuple[int, int, int]],
                           merge: int) -> np.ndarray:
    """M-RoPE positions written from the rule (int64 [3, L]): text tokens count on from the current position in
    all three rows; an image with grid (t, h, w) patches, g = (t, h/merge, w/merge), starting at position s
    gets (s + ti, s + row, s + col) in row-major order, and the text after it starts at s + max(h, w)/merge."""
    pos = np.zeros((3, len(ids)), dtype=np.int64)
    starts = {int(span[0]): j for j, span in enumerate(spans)}
    i, cur = 0, 0
    while i < len(ids):
        if i in starts:
            j = starts[i]
            t, h, w = grids[j][0], grids[j][1] // merge, grids[j][2] // merge
            tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
            pos[:, i:i + t * h * w] = cur + np.stack([tt.ravel(), hh.ravel(), ww.ravel()])
            i += t * h * w
            cur += max(h, w)
        else:
            pos[:, i] = cur
            i, cur = i + 1, cur + 1
    return pos


def single_image_reference(fam, img, prompt: str, budget: int, steps: int):
    """(tokens, kept indices, relevance) from tests/families/qwen2_5_vl/hf_reference.py."""
    from tests.families.qwen2_5_vl import hf_reference as ref

    return single_image(ref, fam, img, prompt, budget, steps)
