"""LLaVA-NeXT (llava-hf `LlavaNextForConditionalGeneration`: CLIP ViT tiles + MLP projector + Llama).

What differs from LLaVA-1.5 (everything else — chat template, prompt layout, probe parts, decoder,
compact positions — is inherited from `LlavaFamily`):
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

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from coverpruner.families.anyres import (
    NEWLINE_POLICIES,
    AnyresGeometry,
    AnyresSettings,
    kept_rows,
    pack_features,
    prepare_tiles,
)
from coverpruner.families.llava import LlavaFamily

NEWLINE_FILE = "image_newline.npy"  # float32 [d], in the engine dir


@dataclass(frozen=True)
class ImageSpan:
    """The packed image span of one request.

    rows: float [N, d] (N = geometry.num_rows), in native order; newline: bool [N], True at image_newline
    rows; candidates: int64 [n] = rows that the selector may keep (not newline), ascending.
    """

    rows: np.ndarray
    newline: np.ndarray
    candidates: np.ndarray
    geometry: AnyresGeometry


class LlavaNextFamily(LlavaFamily):
    """Adapter for LLaVA-NeXT checkpoints in the llava-hf format (model_type "llava_next")."""

    name = "llava_next"
    model_types = ("llava_next",)
    aliases = {
        "llava-next-7b": "llava-hf/llava-v1.6-vicuna-7b-hf",
        "llava-next-13b": "llava-hf/llava-v1.6-vicuna-13b-hf",
    }
    position_mode = "compact"
    newline_policies = NEWLINE_POLICIES
    default_newline_policy = "drop"
    newline_file = NEWLINE_FILE

    # ------------------------------------------------------------------ runtime rules (no torch)
    def anyres_settings(self, processor: dict) -> AnyresSettings:
        """AnyresSettings from the manifest's `processor` block (see processor_settings)."""
        return AnyresSettings.from_dict(processor)

    def prepare_image(self, image, settings: AnyresSettings) -> tuple[np.ndarray, AnyresGeometry]:
        """Image -> (pixel_values float32 [T,3,tile,tile] for the vision graph, geometry of this request)."""
        return prepare_tiles(image, settings)

    def image_span(self, features: np.ndarray, geometry: AnyresGeometry, newline: np.ndarray) -> ImageSpan:
        """Vision outputs float [T, p*p, d] + image_newline [d] -> the packed span and its candidates."""
        rows = pack_features(features, geometry, newline)
        mask = geometry.newline_mask()
        return ImageSpan(rows, mask, np.flatnonzero(~mask).astype(np.int64), geometry)

    def kept_span_rows(self, span: ImageSpan, keep: np.ndarray, policy: str | None = None) -> np.ndarray:
        """Rows of the span kept after selecting candidates `keep` (int [m], indices into span.candidates).
        policy None -> default_newline_policy. int64 ascending."""
        return kept_rows(span.newline, keep, policy or self.default_newline_policy)

    # ------------------------------------------------------------------ checkpoint facts (no torch)
    def processor_settings(self, model_dir: Path) -> dict:
        """Anyres preprocessing settings, flattened to the manifest's `processor` block."""
        d = Path(model_dir)
        cfg, patch = None, None
        if (d / "processor_config.json").is_file():
            proc = json.loads((d / "processor_config.json").read_text())
            cfg, patch = proc.get("image_processor"), proc.get("patch_size")
        if (d / "preprocessor_config.json").is_file():
            cfg = json.loads((d / "preprocessor_config.json").read_text())
        if not cfg:
            raise FileNotFoundError(f"{d}: no image processor settings (preprocessor_config.json or "
                                    "processor_config.json['image_processor'])")
        if patch is None:
            patch = json.loads((d / "config.json").read_text())["vision_config"]["patch_size"]
        return AnyresSettings.from_dict({**cfg, "patch_size": patch}).to_dict()

    # ------------------------------------------------------------------ export time (torch)
    def load_model(self, model_dir: Path, dtype: str = "float32"):
        """LlavaNextForConditionalGeneration in eval mode, eager attention, loaded straight into `dtype`."""
        import torch
        from transformers import LlavaNextForConditionalGeneration

        model = LlavaNextForConditionalGeneration.from_pretrained(
            str(model_dir), dtype=getattr(torch, dtype), attn_implementation="eager", low_cpu_mem_usage=True)
        return model.eval()

    def tile_tokens(self, config) -> int:
        """Rows one tile gives (p*p with the "default" strategy, which drops CLS)."""
        return LlavaFamily.num_visual_tokens(self, config)

    def num_visual_tokens(self, config) -> int:
        """The most image-span rows one image can produce (newline rows included)."""
        v = config.vision_config
        s = AnyresSettings(tile=v.image_size, patch=v.patch_size,
                           pinpoints=tuple(tuple(p) for p in config.image_grid_pinpoints))
        if s.side * s.side != self.tile_tokens(config):
            raise ValueError("LLaVA-NeXT packing needs the 'default' feature strategy (p*p rows per tile)")
        return s.max_rows

    def image_newline(self, model) -> np.ndarray:
        """The model's image_newline vector as float32 [d] (saved as NEWLINE_FILE in the engine dir)."""
        return model.model.image_newline.detach().float().cpu().numpy()

    def dims(self, config) -> dict:
        v = config.vision_config
        out = super().dims(config)
        pins = [tuple(p) for p in config.image_grid_pinpoints]
        out.update(tile_tokens=self.tile_tokens(config), max_tiles=1 + max(h // v.image_size * (w // v.image_size)
                                                                          for h, w in pins))
        return out

    def layout(self) -> dict:
        out = super().layout()
        out.update(expand_image_token="num_rows of the packed image span (per request)",
                   newline_policy=self.default_newline_policy)
        return out
