"""Qwen3-VL's hooks for the conversation reference (tests/conversations/reference.py): how transformers loads,
prepares and embeds this family (M-RoPE positions from HF's get_rope_index, DeepStack levels from HF's
get_image_features, the greedy loop over HF's text model with HF's own DeepStack arguments). Written from
transformers."""

from __future__ import annotations

# hooks the conversation reference looks up, the same for both Qwen families (tests/families/qwen_common.py)
from tests.families.qwen_common import before_generate, native_positions, processor_inputs  # noqa: F401
from tests.families.qwen_common import single_image_reference as single_image

#: pruned positions: kept rows keep their M-RoPE positions, decode at max(native)+1+t in all rows
POSITIONS = "native"


def load(ckpt):
    """HF's Qwen3VLProcessor (PIL image processor; the video processor, torchvision, left out) and the model."""
    from tests.families.qwen3_vl.hf_qwen3 import hf_model, hf_processor

    return hf_processor(ckpt), hf_model(str(ckpt))


def _vision(model, inputs: dict):
    import torch

    with torch.no_grad():
        return model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"])


def image_features(model, inputs: dict) -> list:
    return list(_vision(model, inputs).pooler_output)


def deepstack_features(model, inputs: dict) -> list:
    """Per image, its DeepStack levels [[S_j, d] per level] (the same rows as its main features)."""
    levels = _vision(model, inputs).deepstack_features  # per level: a tuple of per-image tensors
    return [[level[j] for level in levels] for j in range(len(levels[0]))]


def greedy_deepstack(model, embeds, positions, mask, deepstack, steps: int, eos: set[int], start: int) -> list[int]:
    """Greedy loop over HF's text model + lm_head: prefill with visual_pos_masks / deepstack_visual_embeds
    (deepstack: (visual mask, levels)), decode the t-th token at start + t in all rows (the family's HF reference
    loop)."""
    from tests.families.qwen3_vl.hf_reference import greedy

    visual_mask, levels = deepstack
    return greedy(model, embeds, positions, visual_mask, levels, steps, eos, mask=mask, start=start)


def single_image_reference(fam, img, prompt: str, budget: int, steps: int):
    """(tokens, kept indices, relevance) from tests/families/qwen3_vl/hf_reference.py."""
    from tests.families.qwen3_vl import hf_reference as ref

    return single_image(ref, fam, img, prompt, budget, steps)
