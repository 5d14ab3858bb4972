"""LLaVA-1.5 (llava-hf `LlavaForConditionalGeneration`: CLIP ViT + 2-layer MLP projector + Llama).

Everything LLaVA-specific lives here: where the parts sit in the HF model, the chat template and prompt
layout, the image token, and compact positions after pruning. Importing this module does not import
torch or transformers; the export-time methods import them lazily.

Layout of one request (llava-hf chat template, one image):
    "<s>USER: <image>\\n{prompt} ASSISTANT:"  with <image> expanded to n placeholder tokens, whose rows
    of inputs_embeds are replaced by the n projector outputs. Positions are 0..L-1; after pruning the
    kept sequence is re-packed contiguously 0..L'-1 ("compact").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from coverpruner.families.base import (
    PROMPT_SENTINEL,
    NativeLayout,
    RenderedPrompt,
    instruction_positions_from_offsets,
    render_chat_template,
)

IMAGE_TOKEN = "<image>"


@dataclass
class ProbeParts:
    """Layer-0 pieces the probe graph needs (torch modules / callables from the HF model).

    norm: layer-0 input RMSNorm, [.., d] -> [.., d]; q_proj: [.., d] -> [.., H*hd]; k_proj: [.., d] -> [.., Hkv*hd];
    rotary(x, position_ids[1,L]) -> (cos, sin) [1,L,hd] in x.dtype; apply_rope(q, k, cos, sin) -> (q, k) for
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
    position_mode = "compact"
    image_token = IMAGE_TOKEN
    # Files copied next to the graphs so the runtime can tokenize / preprocess without the checkpoint.
    support_files = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                     "preprocessor_config.json", "processor_config.json", "chat_template.jinja",
                     "chat_template.json", "generation_config.json")

    # ------------------------------------------------------------------ runtime rules (no torch)
    def render_prompt(self, chat_template: str, prompt: str, num_visual_tokens: int) -> RenderedPrompt:
        """Apply the chat template to one user turn (image, then text), expand <image> to n placeholders.

        Returns the text the tokenizer sees (as the HF processor builds it) and the character span of
        `prompt` inside it.
        """
        if IMAGE_TOKEN in prompt:
            raise ValueError(f"the prompt must not contain the image token {IMAGE_TOKEN!r}; the image is "
                             "placed by the chat template")
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT_SENTINEL}]}]
        text = render_chat_template(chat_template, messages, add_generation_prompt=True)
        if text.count(PROMPT_SENTINEL) != 1 or text.count(IMAGE_TOKEN) != 1:
            raise ValueError("chat template must render the prompt and the image placeholder exactly once; got "
                             f"{text!r}")
        text = text.replace(IMAGE_TOKEN, IMAGE_TOKEN * num_visual_tokens)
        start = text.index(PROMPT_SENTINEL)
        return RenderedPrompt(text.replace(PROMPT_SENTINEL, prompt), (start, start + len(prompt)))

    def native_layout(self, tokenizer, rendered: RenderedPrompt, image_token_id: int,
                      num_visual_tokens: int) -> NativeLayout:
        """Tokenize `rendered` with a `tokenizers.Tokenizer` (BOS from its post-processor, as HF does).

        Raises ValueError when the number of image tokens differs from `num_visual_tokens`.
        """
        enc = tokenizer.encode(rendered.text)
        ids = np.asarray(enc.ids, dtype=np.int64)
        visual = np.flatnonzero(ids == image_token_id).astype(np.int64)
        if visual.size != num_visual_tokens:
            raise ValueError(f"tokenized prompt has {visual.size} image tokens (id {image_token_id}), expected "
                             f"{num_visual_tokens}")
        instr = instruction_positions_from_offsets(enc.offsets, rendered.prompt_span)
        instr = instr[~np.isin(instr, visual)]
        if instr.size == 0:
            raise ValueError("the prompt produced no instruction tokens (empty prompt?)")
        return NativeLayout(ids, visual, instr)

    def pruned_position_ids(self, length: int) -> np.ndarray:
        """Compact positions for a pruned sequence of `length` tokens: int64 [1, length] = 0..length-1."""
        return np.arange(length, dtype=np.int64)[None, :]

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
        t, v = config.text_config, config.vision_config
        head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
        return {
            "hidden_size": t.hidden_size, "num_layers": t.num_hidden_layers, "num_heads": t.num_attention_heads,
            "num_kv_heads": t.num_key_value_heads, "head_dim": head_dim, "vocab_size": t.vocab_size,
            "num_visual_tokens": self.num_visual_tokens(config), "image_size": v.image_size,
            "patch_size": v.patch_size, "max_position_embeddings": t.max_position_embeddings,
        }

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
            "expand_image_token": "num_visual_tokens",  # <image> -> n copies before tokenizing
            "bos": "tokenizer-post-processor",
            "instruction_tokens": "offsets-overlap-prompt-span",
            "position_ids": "0..L-1",
        }
