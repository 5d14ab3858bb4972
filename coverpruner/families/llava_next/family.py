"""LLaVA-NeXT (llava-hf `LlavaNextForConditionalGeneration`: CLIP ViT tiles + MLP projector + Llama): export time.

What differs from LLaVA-1.5 (the chat template, prompt layout, probe parts, decoder and compact positions
are the shared HF base's, families/hf.py; the CLIP tower is families/clip.py's):
  * the image: "anyres" tiles (base image + a grid chosen from image_grid_pinpoints) through the same
    vision graph, whose leading axis is the tile axis (1 + gh*gw tiles, 1-5 for llava-v1.6);
  * the image span: packed as HF `pack_image_features` (base rows, unpadded grid, one image_newline
    row after each grid row); the newline vector is a weight of the model, stored in the engine dir;
  * n per request: the candidates are every image row except the newline rows, in native order
    (base image, then grid); one global budget over them; the newline rows are dropped with the
    pruned tokens ("drop", default) or all kept ("keep").
Importing this module does not import torch or transformers; the export-time methods import them lazily.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from coverpruner.families import clip
from coverpruner.families.contract import ExportSpec
from coverpruner.families.hf import HFFamily, chat_layout, text_dims
from coverpruner.families.llava_next.anyres import AnyresSettings
from coverpruner.families.llava_next.runtime import IMAGE_TOKEN, NEWLINE_FILE, NEWLINE_OPTION, LlavaNextRuntime


class LlavaNextFamily(HFFamily):
    """Adapter for LLaVA-NeXT checkpoints in the llava-hf format (model_type "llava_next")."""

    name = "llava_next"
    model_class = "LlavaNextForConditionalGeneration"
    image_token = IMAGE_TOKEN
    position_rank = 1
    request_options = (NEWLINE_OPTION,)

    # ------------------------------------------------------------------ run time (no torch)
    def runtime(self, manifest) -> LlavaNextRuntime:
        return LlavaNextRuntime(manifest)

    # ------------------------------------------------------------------ checkpoint facts (no torch)
    def processor_settings(self, model_dir: Path) -> dict:
        """Anyres preprocessing settings, flattened to the manifest's `processor` block."""
        cfg, patch = clip.read_processor_config(model_dir)
        if patch is None:
            import json

            patch = json.loads((Path(model_dir) / "config.json").read_text())["vision_config"]["patch_size"]
        return AnyresSettings.from_dict({**cfg, "patch_size": patch}).to_dict()

    def tile_tokens(self, config) -> int:
        """Rows one tile gives (p*p with the "default" strategy, which drops CLS)."""
        return clip.tokens_per_crop(config)

    def anyres(self, config) -> AnyresSettings:
        v = config.vision_config
        s = AnyresSettings(tile=v.image_size, patch=v.patch_size,
                           pinpoints=tuple(tuple(p) for p in config.image_grid_pinpoints))
        if s.side * s.side != self.tile_tokens(config):
            raise ValueError("LLaVA-NeXT packing needs the 'default' feature strategy (p*p rows per tile)")
        return s

    def num_visual_tokens(self, config) -> int:
        """The most candidates one image can have (base p*p + the largest unpadded grid; newline rows excluded)."""
        s = self.anyres(config)
        return s.side * s.side + max(h // s.tile * (w // s.tile) for h, w in s.pinpoints) * s.side * s.side

    def dims(self, config) -> dict:
        v = config.vision_config
        s = self.anyres(config)
        return {**text_dims(config.text_config), "image_size": v.image_size, "patch_size": v.patch_size,
                "tile_tokens": s.side * s.side, "max_tiles": s.max_tiles}

    def layout(self) -> dict:
        return chat_layout(IMAGE_TOKEN, "rows of the packed image span (per request)", "tokenizer-post-processor",
                           "0..L-1")

    def manifest_fields(self, config, model_dir: Path) -> dict:
        """The text fields plus: the tile axis range for TensorRT profiles (1..max tiles), the newline policy
        default, the most image-span rows (max_image_rows, newline rows included) and the tile facts."""
        s = self.anyres(config)
        return self.family_fields(
            config, model_dir, dims=self.dims(config),
            visual={"max_visual_tokens": self.num_visual_tokens(config), "position_rank": 1,
                    "position_mode": "compact", "max_image_rows": s.max_rows},
            layout=self.layout(), processor=self.processor_settings(model_dir),
            options={NEWLINE_OPTION.name: NEWLINE_OPTION.default}, axes={"tiles": [1, s.max_tiles, s.max_tiles]})

    # ------------------------------------------------------------------ export time (torch)
    def image_features(self, model, pixel_values):
        """pixel_values float [tiles,3,s,s] -> image_features float [tiles,p*p,d] (the tower + projector per
        tile; packing happens at run time)."""
        return clip.image_features(model, pixel_values)

    def probe_example_visual(self, config) -> int:
        return self.num_visual_tokens(config)

    def export_specs(self, model, config, dtype) -> dict[str, ExportSpec]:
        """vision over a dynamic tile axis: pixel_values float [tiles,3,s,s] -> image_features [tiles,p*p,d]."""
        return {"vision": clip.vision_export_spec(self, model, config, dtype, "tiles")}

    def write_files(self, model, out_dir: Path) -> dict[str, str]:
        """image_newline.npy: the model's image_newline vector, float32 [d] (exact for fp16 weights too)."""
        np.save(Path(out_dir) / NEWLINE_FILE, model.model.image_newline.detach().float().cpu().numpy())
        return {"image_newline": NEWLINE_FILE}
