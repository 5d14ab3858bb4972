"""LLaVA-1.5 (llava-hf `LlavaForConditionalGeneration`: CLIP ViT + 2-layer MLP projector + Llama).

Everything LLaVA-specific lives here: where the parts sit in the HF model, the chat template and prompt
layout, the image token, and compact positions after pruning. Importing this module does not import
torch or transformers; the export-time methods import them lazily.

Layout of one request (llava-hf chat template, one image):
    "<s>USER: <image>\\n{prompt} ASSISTANT:"  with <image> expanded to n placeholder tokens, whose rows
    of inputs_embeds are replaced by the n projector outputs. Positions are 0..L-1; after pruning the
    kept sequence is re-packed contiguously 0..L'-1 ("compact"). n is fixed by the checkpoint (one CLIP
    crop); every image row is a candidate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from coverpruner.families.base import CompactPositions, render_image_prompt, text_dims, tokenize_layout
from coverpruner.families.contract import ExportSpec, GridPanel, ImageSpan, NativeLayout, VisionInputs

IMAGE_TOKEN = "<image>"


@dataclass
class ProbeParts:
    """Layer-0 pieces the probe graph needs (torch modules / callables from the HF model).

    norm: layer-0 input RMSNorm, [.., d] -> [.., d]; q_proj: [.., d] -> [.., H*hd]; k_proj: [.., d] -> [.., Hkv*hd];
    rotary(x, position_ids) -> (cos, sin) [1,L,hd] in x.dtype for the probe's position_ids ([1,L], or [R,1,L]
    for an M-RoPE family, which mixes its sections here); apply_rope(q, k, cos, sin) -> (q, k) for
    [1,heads,L,hd] tensors; scaling: 1/sqrt(hd).
    """

    norm: Any
    q_proj: Any
    k_proj: Any
    rotary: Any
    apply_rope: Any
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scaling: float


class LlavaFamily:
    """Adapter for LLaVA-1.5 checkpoints in the llava-hf format (model_type "llava")."""

    name = "llava"
    model_types = ("llava",)
    aliases = {
        "llava-1.5-7b": "llava-hf/llava-1.5-7b-hf",
        "llava-1.5-13b": "llava-hf/llava-1.5-13b-hf",
    }
    image_token = IMAGE_TOKEN
    request_options = ()  # LLaVA-1.5 has no per-request options beyond the generic ones
    # Files copied next to the graphs so the runtime can tokenize / preprocess without the checkpoint.
    support_files = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                     "preprocessor_config.json", "processor_config.json", "chat_template.jinja",
                     "chat_template.json", "generation_config.json")

    # ------------------------------------------------------------------ run time (no torch)
    def runtime(self, manifest) -> "LlavaRuntime":
        return LlavaRuntime(manifest)

    # ------------------------------------------------------------------ checkpoint facts (no torch)
    def chat_template(self, model_dir: Path) -> str:
        """The chat template shipped with the checkpoint (chat_template.jinja / .json / configs)."""
        d = Path(model_dir)
        if (d / "chat_template.jinja").is_file():
            return (d / "chat_template.jinja").read_text()
        for name in ("chat_template.json", "processor_config.json", "tokenizer_config.json"):
            f = d / name
            if f.is_file():
                tpl = json.loads(f.read_text()).get("chat_template")
                if isinstance(tpl, str):
                    return tpl
        raise FileNotFoundError(f"{d}: no chat template found (looked for chat_template.jinja, chat_template.json, "
                                "processor_config.json and tokenizer_config.json 'chat_template')")

    def processor_settings(self, model_dir: Path) -> dict:
        """CLIP image preprocessing settings, flattened to the manifest's `processor` block."""
        d = Path(model_dir)
        cfg = None
        if (d / "preprocessor_config.json").is_file():
            cfg = json.loads((d / "preprocessor_config.json").read_text())
        elif (d / "processor_config.json").is_file():
            cfg = json.loads((d / "processor_config.json").read_text()).get("image_processor")
        if not cfg:
            raise FileNotFoundError(f"{d}: no image processor settings (preprocessor_config.json or "
                                    "processor_config.json['image_processor'])")
        crop = cfg.get("crop_size", {})
        if isinstance(crop, dict):
            if crop.get("height") != crop.get("width"):
                raise ValueError(f"{d}: non-square crop_size {crop} is not supported for LLaVA-1.5")
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

    # ------------------------------------------------------------------ export time (torch)
    def load_model(self, model_dir: Path, dtype: str = "float32"):
        """LlavaForConditionalGeneration in eval mode with eager attention (plain MatMul/Softmax in ONNX,
        and the float32 softmax upcast for fp16). Loaded straight into `dtype` to bound RAM."""
        import torch
        from transformers import LlavaForConditionalGeneration

        model = LlavaForConditionalGeneration.from_pretrained(
            str(model_dir), dtype=getattr(torch, dtype), attn_implementation="eager", low_cpu_mem_usage=True)
        return model.eval()

    def num_visual_tokens(self, config) -> int:
        v = config.vision_config
        n = (v.image_size // v.patch_size) ** 2 + 1  # CLIP prepends CLS
        return n - 1 if config.vision_feature_select_strategy == "default" else n

    def image_features(self, model, pixel_values):
        """pixel_values float [B,3,H,W] -> projector outputs float [B,n,d] (feature layer, select strategy).

        Same computation as `get_image_features`, written batch-first so it traces with a dynamic batch.
        """
        import torch

        cfg = model.config
        out = model.model.vision_tower(pixel_values, output_hidden_states=True, return_dict=True)
        layers = cfg.vision_feature_layer
        layers = [layers] if isinstance(layers, int) else list(layers)
        feats = [out.hidden_states[i] for i in layers]
        if cfg.vision_feature_select_strategy == "default":
            feats = [f[:, 1:] for f in feats]
        return model.model.multi_modal_projector(torch.cat(feats, dim=-1) if len(feats) > 1 else feats[0])

    def embed_tokens(self, model):
        """nn.Embedding: input_ids int64 [B,S] -> inputs_embeds [B,S,d]."""
        return model.get_input_embeddings()

    def language_model(self, model):
        """The Llama decoder stack (LlamaModel): inputs_embeds -> last_hidden_state (final norm applied)."""
        return model.model.language_model

    def lm_head(self, model):
        return model.lm_head

    def probe_parts(self, model) -> ProbeParts:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        lm = self.language_model(model)
        attn = lm.layers[0].self_attn
        cfg = lm.config
        return ProbeParts(
            norm=lm.layers[0].input_layernorm, q_proj=attn.q_proj, k_proj=attn.k_proj, rotary=lm.rotary_emb,
            apply_rope=apply_rotary_pos_emb, num_heads=cfg.num_attention_heads,
            num_kv_heads=cfg.num_key_value_heads, head_dim=attn.head_dim, scaling=attn.scaling,
        )

    def dims(self, config) -> dict:
        v = config.vision_config
        return {**text_dims(config.text_config), "image_size": v.image_size, "patch_size": v.patch_size}

    def token_ids(self, config) -> dict:
        t = config.text_config
        return {"image_token_id": int(config.image_token_id), "bos_token_id": t.bos_token_id,
                "eos_token_id": t.eos_token_id, "pad_token_id": t.pad_token_id}

    def layout(self) -> dict:
        """Prompt-layout facts for the manifest (what the runtime needs besides the chat template)."""
        return {
            "image_token": IMAGE_TOKEN,
            "image_placement": "chat-template",  # one {"type": "image"} content item before the text
            "messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "{prompt}"}]}],
            "add_generation_prompt": True,
            "expand_image_token": "visual.max_visual_tokens",  # <image> -> n copies before tokenizing
            "bos": "tokenizer-post-processor",
            "instruction_tokens": "offsets-overlap-prompt-span",
            "position_ids": "0..L-1",
        }

    def manifest_fields(self, config, model_dir: Path) -> dict:
        """The family's part of manifest.json (see contract.Family.manifest_fields)."""
        return {
            "dims": self.dims(config),
            "visual": {"max_visual_tokens": self.num_visual_tokens(config), "position_rank": 1,
                       "position_mode": "compact"},
            "token_ids": self.token_ids(config),
            "chat_template": self.chat_template(model_dir),
            "layout": self.layout(),
            "processor": self.processor_settings(model_dir),
            "options": {},
            "axes": {},  # the vision graph's only dynamic axis is the generic "batch"
        }

    def export_specs(self, model, config, dtype) -> dict[str, ExportSpec]:
        """vision: pixel_values float [B,3,s,s] -> image_features float [B,n,d]; embed/probe/decoder: the
        shared specs with rank-1 positions."""
        import torch
        from torch.export import Dim

        from coverpruner.export.graph_specs import text_graph_specs
        from coverpruner.export.modules import VisionGraph

        s = config.vision_config.image_size
        specs = text_graph_specs(self, model, self.dims(config), dtype, rank=1,
                                 num_visual=self.num_visual_tokens(config))
        specs["vision"] = ExportSpec(VisionGraph(self, model).eval(), (torch.randn(2, 3, s, s, dtype=dtype),),
                                     ["pixel_values"], ["image_features"], ({0: Dim("batch")},))
        return specs

    def write_files(self, model, out_dir: Path) -> dict[str, str]:
        return {}  # nothing beyond the graphs and the support files


def crop_box(width: int, height: int, settings) -> tuple[float, float, float, float]:
    """(left, top, right, bottom) in original-image pixels of the region the CLIP preprocessing keeps:
    optional pad-to-square, shortest-edge resize, center crop (the steps of runtime.preprocess)."""
    from coverpruner.runtime.preprocess import resize_size

    ox = oy = 0.0
    fw, fh = width, height
    if settings.do_pad and width != height:
        side = max(width, height)
        ox, oy = (0.0, (side - height) // 2) if width > height else ((side - width) // 2, 0.0)
        fw = fh = side
    nh, nw = resize_size(fh, fw, settings) if settings.do_resize else (fh, fw)
    sx, sy = fw / nw, fh / nh
    if settings.do_center_crop:
        ch, cw = settings.crop_height, settings.crop_width
        top, left = (nh - ch) // 2, (nw - cw) // 2
    else:
        ch, cw, top, left = nh, nw, 0, 0
    return (left * sx - ox, top * sy - oy, (left + cw) * sx - ox, (top + ch) * sy - oy)


class LlavaRuntime(CompactPositions):
    """LLaVA-1.5's run-time rules for one engine dir (contract.FamilyRuntime): one CLIP crop, n fixed by the
    checkpoint, every image row a candidate, compact positions."""

    def __init__(self, manifest):
        # The CLIP steps live in runtime/preprocess.py (bit-equal to HF's PIL processor); imported here, not at
        # module level, so exporting does not import the runtime package.
        from coverpruner.runtime.preprocess import ImageSettings

        self.settings = ImageSettings.from_dict(manifest.processor)
        self.chat_template = manifest.chat_template
        self.image_token_id = int(manifest.token_ids["image_token_id"])
        self.n = manifest.max_visual_tokens
        self.float_dtype = np.dtype(manifest.float_dtype)
        dims = manifest.dims
        self.side = int(dims["image_size"]) // int(dims["patch_size"])

    def prepare_image(self, image, options: dict) -> VisionInputs:
        """pixel_values [1,3,s,s] in the graph's float dtype; one panel: the crop's patch grid."""
        from coverpruner.runtime.preprocess import load_image, preprocess_image

        img = load_image(image)
        pixel_values = preprocess_image(img, self.settings).astype(self.float_dtype)
        grid = self.side * self.side
        # "full" select strategy keeps CLS as candidate 0: it has no cell in the picture
        cells = np.arange(self.n - grid, self.n, dtype=np.int64)
        panel = GridPanel("kept patches", (self.side, self.side), crop_box(img.width, img.height, self.settings),
                          cells)
        return VisionInputs({"pixel_values": pixel_values}, self.n, (panel,), {"size": (img.width, img.height)})

    def image_span(self, outputs: dict, vision: VisionInputs, options: dict) -> ImageSpan:
        """image_features [1,n,d] -> rows [n,d], all candidates."""
        feats = outputs["image_features"]
        if feats.ndim != 3 or feats.shape[:2] != (1, self.n):
            raise ValueError(f"vision graph returned image_features {list(feats.shape)}, expected [1, {self.n}, d]")
        return ImageSpan(feats[0], np.arange(self.n, dtype=np.int64))

    def layout(self, tokenizer, prompt: str, num_image_rows: int) -> NativeLayout:
        rendered = render_image_prompt(self.chat_template, prompt, IMAGE_TOKEN, num_image_rows)
        return tokenize_layout(tokenizer, rendered, self.image_token_id, num_image_rows)
