"""Qwen2.5-VL (HF `Qwen2_5_VLForConditionalGeneration`: window-attention ViT + patch merger + Qwen2 decoder
with multimodal rotary positions): export time.

What is Qwen2.5-VL's own lives in this package (this adapter, runtime.py, video.py's frame sampling, vision.py's
window tables and the export-time torch wrapper in graphs.py); the Qwen2-VL image processor and the M-RoPE
position rule it shares with Qwen3-VL are families/qwen_vl.py, the adapter and run-time bases
families/qwen_vl_base.py. Importing this module does not import torch.

Layout of one request (the published chat template, one image):
    "<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n<|im_start|>user\\n<|vision_start|>"
    "<|image_pad|>*n<|vision_end|>{prompt}<|im_end|>\\n<|im_start|>assistant\\n"
The n image-pad rows of inputs_embeds are replaced by the merger outputs in native (row-major merged-grid)
order; these n rows are the pruning candidates. Positions are 3-D (t, h, w), see qwen_vl.py: kept rows
keep their native positions, decoding continues at max(native) + 1 + t ("native" position mode).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from coverpruner.families.contract import ExportSpec
from coverpruner.families.hf import chat_layout, text_dims
from coverpruner.families.qwen_vl import QwenImageSettings
from coverpruner.families.qwen_vl_base import IMAGE_OPTIONS, IMAGE_TOKEN, QwenVLFamily, video_options
from coverpruner.families.qwen2_5_vl.runtime import QwenRuntime
from coverpruner.families.qwen2_5_vl.video import DEFAULT_MAX_VIDEO_FRAMES
from coverpruner.families.qwen2_5_vl.vision import VISION_INPUTS, vision_inputs


VIDEO_WINDOW_OPTION, MAX_VIDEO_FRAMES_OPTION = video_options("Qwen2.5-VL", DEFAULT_MAX_VIDEO_FRAMES)


class Qwen25VLFamily(QwenVLFamily):
    """Adapter for Qwen2.5-VL checkpoints in the HF format (model_type "qwen2_5_vl")."""

    name = "qwen2_5_vl"
    model_class = "Qwen2_5_VLForConditionalGeneration"
    request_options = (*IMAGE_OPTIONS, VIDEO_WINDOW_OPTION, MAX_VIDEO_FRAMES_OPTION)
    support_files = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                     "preprocessor_config.json", "chat_template.jinja", "chat_template.json",
                     "generation_config.json")

    # ------------------------------------------------------------------ run time (no torch)
    def runtime(self, manifest) -> QwenRuntime:
        return QwenRuntime(manifest)

    # ------------------------------------------------------------------ checkpoint facts (no torch)

    def processor_settings(self, model_dir: Path) -> dict:
        """Qwen2-VL image processor settings (min/max pixels, patch/merge sizes, mean/std), flattened."""
        return QwenImageSettings.from_dict(self.preprocessor_config(model_dir)).to_dict()

    def dims(self, config) -> dict:
        t, v = config.text_config, config.vision_config
        return {
            **text_dims(t),
            "mrope_section": list(t.rope_parameters["mrope_section"]),
            "patch_size": v.patch_size, "spatial_merge_size": v.spatial_merge_size, "window_size": v.window_size,
            "temporal_patch_size": v.temporal_patch_size, "vision_hidden_size": v.hidden_size,
            "tokens_per_second": v.tokens_per_second,
            "patch_dim": v.in_channels * v.temporal_patch_size * v.patch_size ** 2,
        }

    def layout(self) -> dict:
        return chat_layout(IMAGE_TOKEN, "grid_thw / merge^2", "none",
                           "mrope [3, L]: native; pruned rows keep native; decode at max+1+t")

    # ------------------------------------------------------------------ export time (torch)
    # load_model, embed_tokens, language_model (Qwen2_5_VLTextModel: position_ids [3, B, S]) and lm_head: the
    # shared HF base's (the same attributes as in every HF *ForConditionalGeneration).

    def apply_rope(self):
        """Qwen2.5-VL's apply_rotary_pos_emb: q/k with the M-RoPE cos/sin the rotary module mixed from the
        checkpoint's mrope_section (position_ids [3, 1, L] -> cos/sin [1, L, hd])."""
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import apply_rotary_pos_emb

        return apply_rotary_pos_emb

    def image_features(self, model, *vision_inputs):
        """The vision graph's computation: graphs.QwenVisionGraph over the VISION_INPUTS host tables."""
        from coverpruner.families.qwen2_5_vl.graphs import QwenVisionGraph

        return QwenVisionGraph(model.model.visual)(*vision_inputs)

    def probe_example_visual(self, config) -> int:
        return 24  # the vision example's 8 x 12 patch grid merged 2 x 2

    def max_visual_tokens(self, settings: QwenImageSettings) -> int:
        """The most visual tokens one image can give: max_pixels / (patch*merge)^2."""
        return settings.max_pixels // settings.factor ** 2

    def manifest_fields(self, config, model_dir: Path) -> dict:
        """The family's part of manifest.json (contract.Family.manifest_fields). Family axes: the vision graph's
        num_patches / num_windows / window_slots, with the paper's 1008x1008 (1,296 tokens) as the optimum
        when the checkpoint's limits allow it."""
        settings = QwenImageSettings.from_dict(self.processor_settings(model_dir))
        dims = self.dims(config)
        n_max = self.max_visual_tokens(settings)
        n_opt = min(n_max, 1296)
        unit = settings.merge_size ** 2
        side = dims["window_size"] // settings.factor
        return self.family_fields(
            config, model_dir, dims=dims,
            visual={"max_visual_tokens": n_max, "position_rank": 3, "position_mode": "native"},
            layout=self.layout(), processor=settings.to_dict(), options={},
            axes={"num_patches": [unit, unit * n_opt, unit * n_max],
                  "num_windows": [1, max(1, n_opt // (side * side)), n_max],
                  "window_slots": [unit, unit * side * side, unit * side * side]})

    def export_specs(self, model, config, dtype) -> dict[str, ExportSpec]:
        """vision: QwenVisionGraph over the host tables (dynamic num_patches / num_visual / num_windows /
        window_slots) -> image_features [n, d]."""
        import torch
        from torch.export import Dim

        from coverpruner.families.qwen2_5_vl.graphs import QwenVisionGraph

        dims = self.dims(config)
        grid = (1, 8, 12)  # 96 patches, 24 tokens; 4 windows at the tiny preset's window, 2 at the real one
        feeds = vision_inputs(np.zeros((96, dims["patch_dim"]), np.float32), grid, dims["spatial_merge_size"],
                              dims["window_size"], dims["patch_size"])
        args = (torch.randn(96, dims["patch_dim"], dtype=dtype),) + tuple(torch.from_numpy(feeds[k])
                                                                          for k in VISION_INPUTS[1:])
        patches, tokens, windows = Dim("num_patches", min=4), Dim("num_visual", min=1), Dim("num_windows")
        shapes = ({0: patches}, {0: patches}, {0: tokens}, {0: tokens}, {0: windows, 1: Dim("window_slots")},
                  {0: windows}, {0: patches}, {0: patches})
        return {"vision": ExportSpec(QwenVisionGraph(model.model.visual).eval(), args, list(VISION_INPUTS),
                                     ["image_features"], shapes)}
