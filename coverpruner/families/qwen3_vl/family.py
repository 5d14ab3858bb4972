"""Qwen3-VL (HF `Qwen3VLForConditionalGeneration`: ViT with learned + 2-D rotary positions, a main merger and one
DeepStack merger per `deepstack_visual_indexes` block; Qwen3 decoder with q/k norm and interleaved M-RoPE): export
time. Importing this module does not import torch.

One request (the checkpoint's chat template, no default system turn):
    "<|im_start|>user\\n<|vision_start|><|image_pad|>*n<|vision_end|>{prompt}<|im_end|>\\n<|im_start|>assistant\\n"
The n image-pad rows take the main merger's outputs (the pruning candidates); DeepStack level k (k < the decoder's
layers) is added to the hidden states decoder layer k outputs at the same rows: a decoder extra (contract v4,
"visual_extra.k"), gathered with the kept indices. Positions: families/qwen_vl.py (native, decode at max + 1 + t),
shared with Qwen2.5-VL.
"""

from __future__ import annotations

import json
from pathlib import Path

from coverpruner.families.contract import DecoderExtra, DecoderSpec, ExportSpec
from coverpruner.families.hf import HFFamily, chat_layout, text_dims
from coverpruner.families.qwen_vl_base import IMAGE_OPTIONS, IMAGE_TOKEN, QwenVLFamily, video_options
from coverpruner.families.qwen3_vl.preprocess import Qwen3ImageSettings
from coverpruner.families.qwen3_vl.runtime import Qwen3VLRuntime, extra_names
from coverpruner.families.qwen3_vl.video import DEFAULT_MAX_VIDEO_FRAMES, Qwen3VideoSettings
from coverpruner.families.qwen3_vl.vision import VISION_INPUTS, vision_inputs


def deepstack_levels(config) -> int:
    """DeepStack levels the decoder uses: HF adds level k after decoder layer k only while k < its layers."""
    return min(len(config.vision_config.deepstack_visual_indexes), config.text_config.num_hidden_layers)


VIDEO_WINDOW_OPTION, MAX_VIDEO_FRAMES_OPTION = video_options("Qwen3-VL", DEFAULT_MAX_VIDEO_FRAMES)


class Qwen3VLFamily(QwenVLFamily):
    """Adapter for Qwen3-VL checkpoints in the HF format (model_type "qwen3_vl")."""

    name = "qwen3_vl"
    model_class = "Qwen3VLForConditionalGeneration"
    mrope_interleaved = True
    request_options = (*IMAGE_OPTIONS, VIDEO_WINDOW_OPTION, MAX_VIDEO_FRAMES_OPTION)
    support_files = HFFamily.support_files + ("video_preprocessor_config.json",)

    def runtime(self, manifest) -> Qwen3VLRuntime:
        return Qwen3VLRuntime(manifest)

    def processor_settings(self, model_dir: Path) -> dict:
        image = self.preprocessor_config(model_dir)
        v = Path(model_dir) / "video_preprocessor_config.json"  # HF's video processor reads the image one without it
        video = json.loads(v.read_text()) if v.is_file() else image
        return {**Qwen3ImageSettings.from_dict(image).to_dict(), "video": Qwen3VideoSettings.from_dict(video).to_dict()}

    def dims(self, config) -> dict:
        t, v = config.text_config, config.vision_config
        return {
            **text_dims(t), "mrope_section": list(t.rope_parameters["mrope_section"]),
            "patch_size": v.patch_size, "spatial_merge_size": v.spatial_merge_size,
            "temporal_patch_size": v.temporal_patch_size, "vision_hidden_size": v.hidden_size,
            "num_position_embeddings": v.num_position_embeddings, "deepstack_levels": deepstack_levels(config),
            "patch_dim": v.in_channels * v.temporal_patch_size * v.patch_size ** 2,
        }

    def decoder_spec(self, config) -> DecoderSpec:
        """DeepStack level k enters after decoder layer k (contract v4 extras)."""
        return DecoderSpec(tuple(DecoderExtra(name, k) for k, name in enumerate(extra_names(deepstack_levels(config)))))

    def apply_rope(self):
        """Qwen3-VL's apply_rotary_pos_emb (the rotary module interleaves the t/h/w frequencies itself)."""
        from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb

        return apply_rotary_pos_emb

    def image_features(self, model, *vision_inputs):
        from coverpruner.families.qwen3_vl.graphs import Qwen3VisionGraph

        return Qwen3VisionGraph(model.model.visual, 0)(*vision_inputs)[0]

    def probe_example_visual(self, config) -> int:
        return 24  # the vision example's 8 x 12 patch grid merged 2 x 2

    def manifest_fields(self, config, model_dir: Path) -> dict:
        """Family axes: num_patches / num_visual, with 1024x1024 (1,024 tokens) as the optimum when allowed."""
        processor = self.processor_settings(model_dir)
        settings = Qwen3ImageSettings.from_dict(processor)
        n_max = settings.max_pixels // settings.factor ** 2
        n_opt = min(n_max, 1024)
        unit = settings.merge_size ** 2
        return self.family_fields(
            config, model_dir, dims=self.dims(config),
            visual={"max_visual_tokens": n_max, "position_rank": 3, "position_mode": "native"},
            layout=chat_layout(IMAGE_TOKEN, "grid_thw / merge^2", "none",
                               "mrope [3, L]: native; pruned rows keep native; decode at max+1+t"),
            processor=processor, options={},
            axes={"num_patches": [unit, unit * n_opt, unit * n_max], "num_visual": [1, n_opt, n_max]})

    def export_specs(self, model, config, dtype) -> dict[str, ExportSpec]:
        """vision: Qwen3VisionGraph (dynamic num_patches) -> image_features and visual_extra.k, each [n, d]."""
        import numpy as np
        import torch
        from torch.export import Dim

        from coverpruner.families.qwen3_vl.graphs import Qwen3VisionGraph

        dims = self.dims(config)
        grid = (1, 8, 12)  # 96 patches, 24 tokens
        feeds = vision_inputs(np.zeros((96, dims["patch_dim"]), np.float32), grid, dims["spatial_merge_size"],
                              dims["num_position_embeddings"])
        args = (torch.randn(96, dims["patch_dim"], dtype=dtype),) + tuple(torch.from_numpy(feeds[k])
                                                                          for k in VISION_INPUTS[1:])
        patches = Dim("num_patches", min=4)
        shapes = ({0: patches}, {0: patches}, {0: patches}, {0: patches}, {0: patches})
        levels = dims["deepstack_levels"]
        return {"vision": ExportSpec(Qwen3VisionGraph(model.model.visual, levels).eval(), args, list(VISION_INPUTS),
                                     ["image_features", *extra_names(levels)], shapes)}
