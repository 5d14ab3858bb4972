"""Qwen2.5-VL (HF `Qwen2_5_VLForConditionalGeneration`: window-attention ViT + patch merger + Qwen2 decoder
with multimodal rotary positions).

Everything Qwen-specific lives in families/ (this adapter, qwen_preprocess, qwen_vision, qwen_positions and
the export-time torch wrappers in qwen_graphs). Importing this module does not import torch.

Layout of one request (the published chat template, one image):
    "<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n<|im_start|>user\\n<|vision_start|>"
    "<|image_pad|>*n<|vision_end|>{prompt}<|im_end|>\\n<|im_start|>assistant\\n"
The n image-pad rows of inputs_embeds are replaced by the merger outputs in native (row-major merged-grid)
order; these n rows are the pruning candidates. Positions are 3-D (t, h, w), see qwen_positions: kept rows
keep their native positions, decoding continues at max(native) + 1 + t ("native" position mode).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from coverpruner.families.base import render_image_prompt, text_dims, tokenize_layout
from coverpruner.families.contract import ExportSpec, GridPanel, ImageSpan, NativeLayout, RequestOption, VisionInputs
from coverpruner.families.llava import LlavaFamily
from coverpruner.families.qwen_positions import decode_position, native_positions, pruned_positions
from coverpruner.families.qwen_preprocess import QwenImageSettings, preprocess_qwen_image
from coverpruner.families.qwen_vision import VISION_INPUTS, vision_inputs

IMAGE_TOKEN = "<|image_pad|>"


def parse_image_size(value):
    """'WxH' or (W, H) -> (W, H) ints; ValueError (one line) otherwise. Whether the processor's rules allow the
    size is checked with the checkpoint's limits when the image is prepared."""
    if isinstance(value, str):
        parts = value.lower().split("x")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"image_size must be WIDTHxHEIGHT in pixels (e.g. 1008x1008), got {value!r}")
        return int(parts[0]), int(parts[1])
    try:
        w, h = value
    except (TypeError, ValueError):
        raise ValueError(f"image_size must be (width, height) in pixels, got {value!r}") from None
    if not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in (w, h)):
        raise ValueError(f"image_size must be (width, height) in whole pixels, got {value!r}")
    return int(w), int(h)


IMAGE_SIZE_OPTION = RequestOption(
    name="image_size", parse=parse_image_size, metavar="WxH",
    help="Qwen2.5-VL: resize the image to exactly W x H (e.g. 1008x1008 = 1,296 visual tokens); both sides multiples "
         "of 28 px within the checkpoint's pixel limits. Default: the processor's smart resize.")


class Qwen25VLFamily:
    """Adapter for Qwen2.5-VL checkpoints in the HF format (model_type "qwen2_5_vl")."""

    name = "qwen2_5_vl"
    model_types = ("qwen2_5_vl",)
    aliases = {
        "qwen2.5-vl-7b": "Qwen/Qwen2.5-VL-7B-Instruct",
        "qwen2.5-vl-3b": "Qwen/Qwen2.5-VL-3B-Instruct",
    }
    position_mode = "native"
    position_rank = 3
    image_token = IMAGE_TOKEN
    request_options = (IMAGE_SIZE_OPTION,)
    support_files = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                     "preprocessor_config.json", "chat_template.jinja", "chat_template.json",
                     "generation_config.json")

    # ------------------------------------------------------------------ run time (no torch)
    def runtime(self, manifest) -> "QwenRuntime":
        return QwenRuntime(manifest)

    # ------------------------------------------------------------------ checkpoint facts (no torch)
    # The same files as every HF checkpoint (chat_template.jinja, else a "chat_template" field of the JSON configs).
    chat_template = LlavaFamily.chat_template

    def processor_settings(self, model_dir: Path) -> dict:
        """Qwen2-VL image processor settings (min/max pixels, patch/merge sizes, mean/std), flattened."""
        f = Path(model_dir) / "preprocessor_config.json"
        if not f.is_file():
            raise FileNotFoundError(f"{model_dir}: preprocessor_config.json is missing")
        return QwenImageSettings.from_dict(json.loads(f.read_text())).to_dict()

    def dims(self, config) -> dict:
        t, v = config.text_config, config.vision_config
        return {
            **text_dims(t),
            "mrope_section": list(t.rope_parameters["mrope_section"]),
            "patch_size": v.patch_size, "spatial_merge_size": v.spatial_merge_size, "window_size": v.window_size,
            "temporal_patch_size": v.temporal_patch_size, "vision_hidden_size": v.hidden_size,
            "patch_dim": v.in_channels * v.temporal_patch_size * v.patch_size ** 2,
        }

    def token_ids(self, config, model_dir: Path | None = None) -> dict:
        """Special ids; eos_token_id is generation_config.json's list when the checkpoint has one (the Instruct
        models stop on <|im_end|> and <|endoftext|>, as HF generate does), else the text config's."""
        t = config.text_config
        eos = t.eos_token_id
        gen = Path(model_dir) / "generation_config.json" if model_dir is not None else None
        if gen is not None and gen.is_file():
            eos = json.loads(gen.read_text()).get("eos_token_id", eos)
        return {"image_token_id": int(config.image_token_id), "vision_start_token_id": config.vision_start_token_id,
                "vision_end_token_id": config.vision_end_token_id, "bos_token_id": t.bos_token_id,
                "eos_token_id": eos, "pad_token_id": t.pad_token_id}

    def layout(self) -> dict:
        return {
            "image_token": IMAGE_TOKEN, "image_placement": "chat-template",
            "messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "{prompt}"}]}],
            "add_generation_prompt": True, "expand_image_token": "grid_thw / merge^2", "bos": "none",
            "instruction_tokens": "offsets-overlap-prompt-span",
            "position_ids": "mrope [3, L]: native; pruned rows keep native; decode at max+1+t",
        }

    # ------------------------------------------------------------------ export time (torch)
    def load_model(self, model_dir: Path, dtype: str = "float32"):
        """Qwen2_5_VLForConditionalGeneration in eval mode, eager attention, loaded straight into `dtype`."""
        import torch
        from transformers import Qwen2_5_VLForConditionalGeneration

        model = Qwen2_5_VLForConditionalGeneration.from_pretrained(
            str(model_dir), dtype=getattr(torch, dtype), attn_implementation="eager", low_cpu_mem_usage=True)
        return model.eval()

    # Where the token table, the decoder stack (Qwen2_5_VLTextModel: position_ids [3, B, S]) and the LM head sit:
    # the same attributes as in every HF *ForConditionalGeneration.
    embed_tokens = LlavaFamily.embed_tokens
    language_model = LlavaFamily.language_model
    lm_head = LlavaFamily.lm_head

    def probe_parts(self, model):
        """Layer-0 pieces for export.modules.ProbeGraph: q/k projections with bias, GQA, and the M-RoPE
        rotary module (position_ids [3, 1, L] -> cos/sin [1, L, hd] with the checkpoint's mrope_section)."""
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import apply_rotary_pos_emb

        from coverpruner.families.llava import ProbeParts

        lm = self.language_model(model)
        attn = lm.layers[0].self_attn
        cfg = lm.config
        return ProbeParts(norm=lm.layers[0].input_layernorm, q_proj=attn.q_proj, k_proj=attn.k_proj,
                          rotary=lm.rotary_emb, apply_rope=apply_rotary_pos_emb, num_heads=cfg.num_attention_heads,
                          num_kv_heads=cfg.num_key_value_heads, head_dim=attn.head_dim, scaling=attn.scaling)

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
        return {
            "dims": dims,
            "visual": {"max_visual_tokens": n_max, "position_rank": 3, "position_mode": "native"},
            "token_ids": self.token_ids(config, model_dir),
            "chat_template": self.chat_template(model_dir),
            "layout": self.layout(),
            "processor": settings.to_dict(),
            "options": {},
            "axes": {"num_patches": [unit, unit * n_opt, unit * n_max],
                     "num_windows": [1, max(1, n_opt // (side * side)), n_max],
                     "window_slots": [unit, unit * side * side, unit * side * side]},
        }

    def export_specs(self, model, config, dtype) -> dict[str, ExportSpec]:
        """vision: QwenVisionGraph over the host tables (dynamic num_patches / num_visual / num_windows /
        window_slots) -> image_features [n, d]; embed/probe/decoder: the shared specs with position_ids
        [3, B, S]."""
        import torch
        from torch.export import Dim

        from coverpruner.export.graph_specs import text_graph_specs
        from coverpruner.families.qwen_graphs import QwenVisionGraph

        dims = self.dims(config)
        specs = text_graph_specs(self, model, dims, dtype, rank=3, num_visual=24)
        grid = (1, 8, 12)  # 96 patches, 24 tokens; 4 windows at the tiny preset's window, 2 at the real one
        feeds = vision_inputs(np.zeros((96, dims["patch_dim"]), np.float32), grid, dims["spatial_merge_size"],
                              dims["window_size"], dims["patch_size"])
        args = (torch.randn(96, dims["patch_dim"], dtype=dtype),) + tuple(torch.from_numpy(feeds[k])
                                                                          for k in VISION_INPUTS[1:])
        patches, tokens, windows = Dim("num_patches", min=4), Dim("num_visual", min=1), Dim("num_windows")
        shapes = ({0: patches}, {0: patches}, {0: tokens}, {0: tokens}, {0: windows, 1: Dim("window_slots")},
                  {0: windows}, {0: patches}, {0: patches})
        specs["vision"] = ExportSpec(QwenVisionGraph(model.model.visual).eval(), args, list(VISION_INPUTS),
                                     ["image_features"], shapes)
        return specs

    def write_files(self, model, out_dir: Path) -> dict[str, str]:
        return {}  # the graphs and the support files are all the runtime needs


class QwenRuntime:
    """Qwen2.5-VL's run-time rules for one engine dir (contract.FamilyRuntime): dynamic resolution, host-side
    window tables, every merger output a candidate, native M-RoPE positions (rank 3)."""

    position_rank = 3

    def __init__(self, manifest):
        self.settings = QwenImageSettings.from_dict(manifest.processor)
        self.chat_template = manifest.chat_template
        self.image_token_id = int(manifest.token_ids["image_token_id"])
        self.float_dtype = np.dtype(manifest.float_dtype)
        dims = manifest.dims
        self.merge, self.window, self.patch = (int(dims["spatial_merge_size"]), int(dims["window_size"]),
                                               int(dims["patch_size"]))

    def prepare_image(self, image, options: dict) -> VisionInputs:
        """Vision feeds (VISION_INPUTS; pixel_values [N, 1176] in the graph's float dtype), n = gh*gw/merge^2,
        and one picture panel: the merged-patch grid (28x28 px cells of the resized image), which covers the
        whole original image (the resize keeps everything)."""
        img = preprocess_qwen_image(image, self.settings, image_size=options.get("image_size"))
        feeds = vision_inputs(img.pixel_values.astype(self.float_dtype, copy=False), img.grid_thw, self.merge,
                              self.window, self.patch)
        n = img.num_visual_tokens
        rows, cols = img.grid_thw[1] // self.merge, img.grid_thw[2] // self.merge
        h, w = img.original
        cell = self.merge * self.patch
        panel = GridPanel(f"{cell}x{cell} px cells of the {img.resized[1]}x{img.resized[0]} resized image",
                          (rows, cols), (0.0, 0.0, float(w), float(h)), np.arange(n, dtype=np.int64))
        return VisionInputs(feeds, n, (panel,), {"grid_thw": img.grid_thw, "resized": img.resized,
                                                 "original": img.original})

    def image_span(self, outputs: dict, vision: VisionInputs, options: dict) -> ImageSpan:
        """image_features [n, d] (native order) -> rows [n, d], every row a candidate."""
        feats = outputs["image_features"]
        n = vision.num_candidates
        if feats.ndim != 2 or feats.shape[0] != n:
            raise ValueError(f"vision graph returned image_features {list(feats.shape)}, expected [{n}, d]")
        return ImageSpan(feats, np.arange(n, dtype=np.int64))

    def layout(self, tokenizer, prompt: str, num_image_rows: int) -> NativeLayout:
        """The published chat template around [image, prompt], <|image_pad|> expanded to n (no BOS)."""
        if any(m in prompt for m in ("<|vision_start|>", "<|vision_end|>")):
            raise ValueError("the prompt must not contain the image markers '<|vision_start|>' / '<|vision_end|>'")
        rendered = render_image_prompt(self.chat_template, prompt, IMAGE_TOKEN, num_image_rows)
        return tokenize_layout(tokenizer, rendered, self.image_token_id, num_image_rows)

    def native_positions(self, layout: NativeLayout, vision: VisionInputs) -> np.ndarray:
        """int64 [3, L]: HF get_rope_index's positions for the full native sequence."""
        return native_positions(layout.input_ids, self.image_token_id, [vision.facts["grid_thw"]], self.merge)

    def pruned_positions(self, native: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """int64 [3, L']: kept rows keep their native positions (no re-packing)."""
        return pruned_positions(native, rows)

    def decode_position(self, native: np.ndarray, pruned: np.ndarray, step: int) -> np.ndarray:
        """int64 [3]: the step-th generated token at max(native) + 1 + step, where it sits without pruning."""
        return decode_position(native, step)
