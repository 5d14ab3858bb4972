"""Qwen3.5 (HF `Qwen3_5ForConditionalGeneration`): export time. Importing this module does not import torch.

One request (the checkpoint's chat template: content trimmed, the generation prompt opens a <think> block):
    "<|im_start|>user\\n<|vision_start|><|image_pad|>*n<|vision_end|>{prompt}<|im_end|>\\n<|im_start|>assistant\\n
     <think>\\n"
The n image-pad rows take the main merger's outputs (the pruning candidates; no DeepStack). The decoder is hybrid
(families/gated_delta.py): layers 0..f-1 are Gated DeltaNet layers without an attention matrix, so the probe reads
the first full-attention layer f (f = 3 for the default pattern) on the hidden states layers 0..f-1 give the full
native sequence; the Gated DeltaNet layers' conv and recurrent states are decoder state (contract v5), the full
layers keep a KV cache. Positions: native M-RoPE as Qwen3-VL (families/qwen_vl.py), decode at max + 1 + t.
"""

from __future__ import annotations

from coverpruner.families import gated_delta
from coverpruner.families.contract import DecoderSpec, DecoderWeights, ProbeParts
from coverpruner.families.qwen3_5.runtime import Qwen35Runtime
from coverpruner.families.qwen3_video import DEFAULT_MAX_VIDEO_FRAMES
from coverpruner.families.qwen3_vision_base import Qwen3VisionFamily
from coverpruner.families.qwen_vl_base import IMAGE_OPTIONS, video_options

VIDEO_WINDOW_OPTION, MAX_VIDEO_FRAMES_OPTION = video_options("Qwen3.5", DEFAULT_MAX_VIDEO_FRAMES)


class Qwen35Family(Qwen3VisionFamily):
    """Adapter for Qwen3.5 checkpoints in the HF format (model_type "qwen3_5")."""

    name = "qwen3_5"
    model_class = "Qwen3_5ForConditionalGeneration"
    request_options = (*IMAGE_OPTIONS, VIDEO_WINDOW_OPTION, MAX_VIDEO_FRAMES_OPTION)

    def runtime(self, manifest) -> Qwen35Runtime:
        return Qwen35Runtime(manifest)

    def dims(self, config) -> dict:
        """The tower's dims and the dims the partial rotary turns (the decoder's layers and states are recorded
        under graphs.decoder, the probe layer under graphs.probe)."""
        return {**super().dims(config), "rotary_dim": gated_delta.rotary_dim(config.text_config)}

    def load_model(self, model_dir, dtype: str = "float32"):
        """HF's model (eager attention, ``dtype``) with its Gated DeltaNet layers made exportable."""
        model = super().load_model(model_dir, dtype)
        gated_delta.make_exportable(self.language_model(model))
        return model

    def apply_rope(self):
        """Qwen3.5's apply_rotary_pos_emb: a partial rotary (the first rotary_dim dims of each head)."""
        from transformers.models.qwen3_5.modeling_qwen3_5 import apply_rotary_pos_emb

        return apply_rotary_pos_emb

    def decoder_spec(self, config) -> DecoderSpec:
        """KV at the full-attention layers, conv and recurrent states at the Gated DeltaNet layers (contract v5)."""
        return gated_delta.decoder_spec(config.text_config)

    def probe_parts(self, model) -> ProbeParts:
        """The first full-attention layer, on the hidden states of the layers before it (gated_delta.probe_parts)."""
        return gated_delta.probe_parts(self.language_model(model), self.apply_rope())

    def proxy_probe_parts(self, model) -> ProbeParts:
        """The cheap probe (--probe proxy): layer 0's own query / key scored as a softmax (gated_delta.py says what
        it costs and what it is not)."""
        return gated_delta.proxy_probe_parts(self.language_model(model))

    def decoder_weights(self, model) -> DecoderWeights:
        return gated_delta.decoder_weights(self.language_model(model), self.lm_head(model), self.mrope_interleaved)
