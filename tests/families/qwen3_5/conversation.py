"""Qwen3.5's hooks for the conversation reference (tests/conversations/reference.py): how transformers loads,
prepares and embeds this family (Qwen3VLProcessor, M-RoPE positions from HF's get_rope_index, the plain greedy loop
of the reference over the HF model, whose hybrid cache carries the linear layers' states; the reference's demand is
HF's attentions[0]: the first full-attention layer's). Written from transformers."""

from __future__ import annotations

from tests.families.qwen_common import before_generate, native_positions, processor_inputs  # noqa: F401
from tests.families.qwen_common import single_image_reference as single_image

#: pruned positions: kept rows keep their M-RoPE positions, decode at max(native)+1+t in all rows
POSITIONS = "native"


def load(ckpt):
    """HF's Qwen3VLProcessor (PIL image processor; the video processor, torchvision, left out) and the model."""
    from tests.families.qwen3_5.hf_reference import hf_model
    from tests.families.qwen3_vl.hf_qwen3 import hf_processor

    return hf_processor(ckpt), hf_model(str(ckpt))


def image_features(model, inputs: dict) -> list:
    import torch

    with torch.no_grad():
        return list(model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"]).pooler_output)


def single_image_reference(fam, img, prompt: str, budget: int, steps: int):
    """(tokens, kept indices, relevance) from tests/families/qwen3_5/hf_reference.py."""
    from tests.families.qwen3_5 import hf_reference as ref

    return single_image(ref, fam, img, prompt, budget, steps)
