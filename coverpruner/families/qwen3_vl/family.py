"""Qwen3-VL (HF `Qwen3VLForConditionalGeneration`: ViT with learned + 2-D rotary positions, a main merger and one
DeepStack merger per `deepstack_visual_indexes` block; Qwen3 decoder with q/k norm and interleaved M-RoPE): export
time. Importing this module does not import torch.

One request (the checkpoint's chat template, no default system turn):
    "<|im_start|>user\\n<|vision_start|><|image_pad|>*n<|vision_end|>{prompt}<|im_end|>\\n<|im_start|>assistant\\n"
The n image-pad rows take the main merger's outputs (the pruning candidates); DeepStack level k (k < the decoder's
layers) is added to the hidden states decoder layer k outputs at the same rows: a decoder extra (contract v4,
"visual_extra.k"), gathered with the kept indices. Positions: families/qwen_vl.py (native, decode at max + 1 + t),
shared with Qwen2.5-VL; the vision tower, its preprocessing and videos: families/qwen3_vision_base.py, shared with
Qwen3.5.
"""

from __future__ import annotations

from coverpruner.families.contract import DecoderExtra, DecoderSpec
from coverpruner.families.qwen3_video import DEFAULT_MAX_VIDEO_FRAMES
from coverpruner.families.qwen3_vision_base import Qwen3VisionFamily, extra_names
from coverpruner.families.qwen3_vl.runtime import Qwen3VLRuntime
from coverpruner.families.qwen_vl_base import IMAGE_OPTIONS, video_options


def deepstack_levels(config) -> int:
    """DeepStack levels the decoder uses: HF adds level k after decoder layer k only while k < its layers."""
    return min(len(config.vision_config.deepstack_visual_indexes), config.text_config.num_hidden_layers)


VIDEO_WINDOW_OPTION, MAX_VIDEO_FRAMES_OPTION = video_options("Qwen3-VL", DEFAULT_MAX_VIDEO_FRAMES)


class Qwen3VLFamily(Qwen3VisionFamily):
    """Adapter for Qwen3-VL checkpoints in the HF format (model_type "qwen3_vl")."""

    name = "qwen3_vl"
    model_class = "Qwen3VLForConditionalGeneration"
    request_options = (*IMAGE_OPTIONS, VIDEO_WINDOW_OPTION, MAX_VIDEO_FRAMES_OPTION)

    def runtime(self, manifest) -> Qwen3VLRuntime:
        return Qwen3VLRuntime(manifest)

    def deepstack_levels(self, config) -> int:
        return deepstack_levels(config)

    def decoder_spec(self, config) -> DecoderSpec:
        """DeepStack level k enters after decoder layer k (contract v4 extras)."""
        return DecoderSpec(tuple(DecoderExtra(name, k) for k, name in enumerate(extra_names(deepstack_levels(config)))))

    def apply_rope(self):
        """Qwen3-VL's apply_rotary_pos_emb (the rotary module interleaves the t/h/w frequencies itself)."""
        from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb

        return apply_rotary_pos_emb
