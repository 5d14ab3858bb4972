"""LLaVA-1.5 (llava-hf `LlavaForConditionalGeneration`: CLIP ViT + 2-layer MLP projector + Llama): export time.

Where the parts sit in the HF model (families/hf.py's base + the CLIP tower of families/clip.py), the
checkpoint facts and the manifest fields. Importing this module does not import torch or transformers; the
export-time methods import them lazily.

Layout of one request (llava-hf chat template, one image):
    "<s>USER: <image>\\n{prompt} ASSISTANT:"  with <image> expanded to n placeholder tokens, whose rows
    of inputs_embeds are replaced by the n projector outputs. Positions are 0..L-1; after pruning the
    kept sequence is re-packed contiguously 0..L'-1 ("compact"). n is fixed by the checkpoint (one CLIP
    crop); every image row is a candidate.
"""

from __future__ import annotations

from pathlib import Path

from coverpruner.families import clip
from coverpruner.families.contract import ExportSpec
from coverpruner.families.hf import HFFamily, chat_layout, text_dims
from coverpruner.families.llava.runtime import IMAGE_TOKEN, LlavaRuntime


class LlavaFamily(HFFamily):
    """Adapter for LLaVA-1.5 checkpoints in the llava-hf format (model_type "llava")."""

    name = "llava"
    model_class = "LlavaForConditionalGeneration"
    image_token = IMAGE_TOKEN
    position_rank = 1
    request_options = ()  # LLaVA-1.5 has no per-request options beyond the generic ones

    # ------------------------------------------------------------------ run time (no torch)
    def runtime(self, manifest) -> LlavaRuntime:
        return LlavaRuntime(manifest)

    # ------------------------------------------------------------------ checkpoint facts (no torch)
    def processor_settings(self, model_dir: Path) -> dict:
        """CLIP image preprocessing settings, flattened to the manifest's `processor` block."""
        cfg, _ = clip.read_processor_config(model_dir)
        crop = cfg.get("crop_size", {})
        if isinstance(crop, dict):
            if crop.get("height") != crop.get("width"):
                raise ValueError(f"{model_dir}: non-square crop_size {crop} is not supported for LLaVA-1.5")
            crop = crop.get("height")
        size = cfg.get("size", {})
        shortest = size.get("shortest_edge") if isinstance(size, dict) else size
        return {
            "crop_size": int(crop), "shortest_edge": int(shortest), "resample": int(cfg.get("resample", 3)),
            "do_center_crop": bool(cfg.get("do_center_crop", True)), "do_resize": bool(cfg.get("do_resize", True)),
            "do_rescale": bool(cfg.get("do_rescale", True)),
            "rescale_factor": float(cfg.get("rescale_factor", 1 / 255)),
            "do_normalize": bool(cfg.get("do_normalize", True)),
            "image_mean": [float(x) for x in cfg["image_mean"]], "image_std": [float(x) for x in cfg["image_std"]],
            "do_convert_rgb": bool(cfg.get("do_convert_rgb", True)),
        }

    def num_visual_tokens(self, config) -> int:
        return clip.tokens_per_crop(config)

    def dims(self, config) -> dict:
        v = config.vision_config
        return {**text_dims(config.text_config), "image_size": v.image_size, "patch_size": v.patch_size}

    def layout(self) -> dict:
        """Prompt-layout facts for the manifest (what the runtime needs besides the chat template)."""
        return chat_layout(IMAGE_TOKEN, "visual.max_visual_tokens", "tokenizer-post-processor", "0..L-1")

    def manifest_fields(self, config, model_dir: Path) -> dict:
        """The family's part of manifest.json (see contract.Family.manifest_fields)."""
        return self.family_fields(
            config, model_dir, dims=self.dims(config),
            visual={"max_visual_tokens": self.num_visual_tokens(config), "position_rank": 1,
                    "position_mode": "compact"},
            layout=self.layout(), processor=self.processor_settings(model_dir), options={},
            axes={})  # the vision graph's only dynamic axis is the generic "batch"

    # ------------------------------------------------------------------ export time (torch)
    def image_features(self, model, pixel_values):
        """pixel_values float [B,3,H,W] -> projector outputs float [B,n,d] (clip.image_features)."""
        return clip.image_features(model, pixel_values)

    def probe_example_visual(self, config) -> int:
        return self.num_visual_tokens(config)

    def export_specs(self, model, config, dtype) -> dict[str, ExportSpec]:
        """vision: pixel_values float [B,3,s,s] -> image_features float [B,n,d]."""
        return {"vision": clip.vision_export_spec(self, model, config, dtype, "batch")}
