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
from pathlib import Path

import numpy as np

from coverpruner.families.anyres import AnyresGeometry, AnyresSettings, pack_features, prepare_tiles
from coverpruner.families.base import CompactPositions, render_image_prompt, tokenize_layout
from coverpruner.families.contract import ExportSpec, GridPanel, ImageSpan, NativeLayout, RequestOption, VisionInputs
from coverpruner.families.llava import IMAGE_TOKEN, LlavaFamily

NEWLINE_POLICIES = ("drop", "keep")
NEWLINE_FILE = "image_newline.npy"  # float32 [d], in the engine dir
NEWLINE_OPTION = RequestOption(
    "newline_policy", "image_newline rows of a pruned LLaVA-NeXT image: 'drop' them with the pruned tokens "
    "(default) or 'keep' all of them", default="drop", choices=NEWLINE_POLICIES, metavar="drop|keep")


class LlavaNextFamily(LlavaFamily):
    """Adapter for LLaVA-NeXT checkpoints in the llava-hf format (model_type "llava_next")."""

    name = "llava_next"
    model_types = ("llava_next",)
    aliases = {
        "llava-next-7b": "llava-hf/llava-v1.6-vicuna-7b-hf",
        "llava-next-13b": "llava-hf/llava-v1.6-vicuna-13b-hf",
    }

    request_options = (NEWLINE_OPTION,)

    # ------------------------------------------------------------------ run time (no torch)
    def runtime(self, manifest) -> "LlavaNextRuntime":
        return LlavaNextRuntime(manifest)

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

    def manifest_fields(self, config, model_dir: Path) -> dict:
        """LLaVA's fields plus: the tile axis range for TensorRT profiles (1..max tiles), the newline policy
        default, the most image-span rows (max_image_rows, newline rows included) and the tile facts."""
        fields = super().manifest_fields(config, model_dir)
        s = self.anyres(config)
        fields["dims"].update(tile_tokens=s.side * s.side, max_tiles=s.max_tiles)
        fields["visual"]["max_image_rows"] = s.max_rows
        fields["options"] = {NEWLINE_OPTION.name: NEWLINE_OPTION.default}
        fields["axes"] = {"tiles": [1, s.max_tiles, s.max_tiles]}
        return fields

    def export_specs(self, model, config, dtype) -> dict[str, ExportSpec]:
        """LLaVA's specs with the vision graph over a dynamic tile axis: pixel_values float [tiles,3,s,s] ->
        image_features float [tiles,p*p,d] (the tower + projector per tile; packing happens at run time)."""
        import torch
        from torch.export import Dim

        from coverpruner.export.modules import VisionGraph

        specs = super().export_specs(model, config, dtype)
        s = config.vision_config.image_size
        specs["vision"] = ExportSpec(VisionGraph(self, model).eval(), (torch.randn(2, 3, s, s, dtype=dtype),),
                                     ["pixel_values"], ["image_features"], ({0: Dim("tiles")},))
        return specs

    def write_files(self, model, out_dir: Path) -> dict[str, str]:
        """image_newline.npy: the model's image_newline vector, float32 [d] (exact for fp16 weights too)."""
        np.save(Path(out_dir) / NEWLINE_FILE, model.model.image_newline.detach().float().cpu().numpy())
        return {"image_newline": NEWLINE_FILE}

    def layout(self) -> dict:
        out = super().layout()
        out.update(expand_image_token="rows of the packed image span (per request)")
        return out


def panels(geo: AnyresGeometry, s: AnyresSettings) -> tuple[GridPanel, GridPanel]:
    """The two picture panels of one image, in original-image pixels.

    base: p x p cells over the whole image (the base tile is the image squeezed to tile x tile).
    high-res: (gh*p) x (gw*p) cells over the padded canvas mapped back through the resize and the centred
    paste (the box extends past the image where the model saw padding); cells cut by unpadding are -1.
    """
    height, width = geo.image_size
    p = geo.p
    base = GridPanel("base image", (p, p), (0.0, 0.0, float(width), float(height)), np.arange(p * p, dtype=np.int64))
    sy, sx = height / geo.resized[0], width / geo.resized[1]
    top, left = geo.paste
    box = (-left * sx, -top * sy, (geo.best[1] - left) * sx, (geo.best[0] - top) * sy)
    cells = np.full((geo.grid[0] * p, geo.grid[1] * p), -1, dtype=np.int64)
    (r0, r1), (c0, c1) = geo.rows_kept, geo.cols_kept
    cells[r0:r1, c0:c1] = p * p + np.arange((r1 - r0) * (c1 - c0)).reshape(r1 - r0, c1 - c0)
    return base, GridPanel("high-res", cells.shape, box, cells.reshape(-1))


class LlavaNextRuntime(CompactPositions):
    """LLaVA-NeXT's run-time rules for one engine dir (contract.FamilyRuntime): anyres tiles, per-request n,
    HF packing with the stored image_newline vector, newline policy, compact positions."""

    def __init__(self, manifest):
        self.settings = AnyresSettings.from_dict(manifest.processor)
        self.chat_template = manifest.chat_template
        self.image_token_id = int(manifest.token_ids["image_token_id"])
        self.float_dtype = np.dtype(manifest.float_dtype)
        path = manifest.files.get("image_newline")
        if path is None:
            raise ValueError("manifest has no files.image_newline (the LLaVA-NeXT newline vector); re-export")
        newline = np.load(path)
        if newline.ndim != 1 or newline.shape[0] != int(manifest.dims["hidden_size"]):
            raise ValueError(f"{path.name}: expected float32 [{manifest.dims['hidden_size']}], got {newline.shape}")
        self.newline = newline

    def prepare_image(self, image, options: dict) -> VisionInputs:
        """pixel_values [tiles,3,s,s] in the graph's float dtype (base image first), n, the two panels."""
        pixels, geo = prepare_tiles(image, self.settings)
        return VisionInputs({"pixel_values": pixels.astype(self.float_dtype)}, geo.num_candidates,
                            panels(geo, self.settings), {"geometry": geo})

    def image_span(self, outputs: dict, vision: VisionInputs, options: dict) -> ImageSpan:
        """image_features [tiles,p*p,d] -> packed rows [S,d]; candidates: the non-newline rows; always kept:
        the newline rows under newline_policy 'keep'."""
        geo = vision.facts["geometry"]
        rows = pack_features(outputs["image_features"], geo, self.newline)
        mask = geo.newline_mask()
        always = np.flatnonzero(mask) if options.get(NEWLINE_OPTION.name) == "keep" else np.zeros(0, np.int64)
        return ImageSpan(rows, np.flatnonzero(~mask).astype(np.int64), always.astype(np.int64))

    def layout(self, tokenizer, prompt: str, num_image_rows: int) -> NativeLayout:
        rendered = render_image_prompt(self.chat_template, prompt, IMAGE_TOKEN, num_image_rows)
        return tokenize_layout(tokenizer, rendered, self.image_token_id, num_image_rows)
