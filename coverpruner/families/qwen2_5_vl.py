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

from coverpruner.families.base import PROMPT_SENTINEL, NativeLayout, RenderedPrompt, render_chat_template
from coverpruner.families.qwen_positions import decode_position, native_positions, pruned_positions
from coverpruner.families.qwen_preprocess import QwenImage, QwenImageSettings, preprocess_qwen_image
from coverpruner.families.qwen_vision import VISION_INPUTS, vision_inputs

IMAGE_TOKEN = "<|image_pad|>"


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
    vision_inputs = VISION_INPUTS
    support_files = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                     "preprocessor_config.json", "chat_template.jinja", "chat_template.json",
                     "generation_config.json")

    # ------------------------------------------------------------------ runtime rules (no torch)
    def render_prompt(self, chat_template: str, prompt: str, num_visual_tokens: int) -> RenderedPrompt:
        """Apply the chat template to one user turn (image, then text); expand <|image_pad|> to n copies."""
        if IMAGE_TOKEN in prompt or "<|vision_start|>" in prompt:
            raise ValueError(f"the prompt must not contain the image markers ({IMAGE_TOKEN!r}, '<|vision_start|>'); "
                             "the image is placed by the chat template")
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
        """Tokenize with a `tokenizers.Tokenizer` (Qwen adds no BOS); the image tokens must be one run of n."""
        from coverpruner.families.base import instruction_positions_from_offsets

        enc = tokenizer.encode(rendered.text)
        ids = np.asarray(enc.ids, dtype=np.int64)
        visual = np.flatnonzero(ids == image_token_id).astype(np.int64)
        if visual.size != num_visual_tokens or (visual.size and visual[-1] - visual[0] + 1 != visual.size):
            raise ValueError(f"tokenized prompt has {visual.size} image tokens (id {image_token_id}), expected one "
                             f"run of {num_visual_tokens}")
        instr = instruction_positions_from_offsets(enc.offsets, rendered.prompt_span)
        instr = instr[~np.isin(instr, visual)]
        if instr.size == 0:
            raise ValueError("the prompt produced no instruction tokens (empty prompt?)")
        return NativeLayout(ids, visual, instr)

    def prepare_image(self, image, settings: dict, vision: dict, image_size=None) -> tuple[QwenImage, dict]:
        """Preprocess one image and compute the vision graph's host-side inputs.

        settings: the manifest's processor block (QwenImageSettings.to_dict()); vision: {"window_size",
        "patch_size", "spatial_merge_size"} from dims(). Returns (QwenImage, {name: array} for VISION_INPUTS).
        """
        s = QwenImageSettings.from_dict(settings)
        img = preprocess_qwen_image(image, s, image_size=image_size)
        return img, vision_inputs(img.pixel_values, img.grid_thw, vision["spatial_merge_size"],
                                  vision["window_size"], vision["patch_size"])

    def native_positions(self, input_ids: np.ndarray, image_token_id: int, grid_thw, merge: int) -> np.ndarray:
        """int64 [3, L]: HF get_rope_index's positions for the full native sequence."""
        return native_positions(input_ids, image_token_id, [grid_thw], merge)

    def pruned_positions(self, native: np.ndarray, kept_rows: np.ndarray) -> np.ndarray:
        """int64 [3, L']: kept rows keep their native positions."""
        return pruned_positions(native, kept_rows)

    def decode_position(self, native: np.ndarray, step: int) -> np.ndarray:
        """int64 [3]: the step-th generated token's position, max(native) + 1 + step."""
        return decode_position(native, step)

    # ------------------------------------------------------------------ checkpoint facts (no torch)
    def chat_template(self, model_dir: Path) -> str:
        """chat_template.jinja, else chat_template.json / tokenizer_config.json 'chat_template'."""
        d = Path(model_dir)
        if (d / "chat_template.jinja").is_file():
            return (d / "chat_template.jinja").read_text()
        for name in ("chat_template.json", "tokenizer_config.json"):
            if (d / name).is_file():
                tpl = json.loads((d / name).read_text()).get("chat_template")
                if isinstance(tpl, str):
                    return tpl
        raise FileNotFoundError(f"{d}: no chat template found (looked for chat_template.jinja, chat_template.json "
                                "and tokenizer_config.json 'chat_template')")

    def processor_settings(self, model_dir: Path) -> dict:
        """Qwen2-VL image processor settings (min/max pixels, patch/merge sizes, mean/std), flattened."""
        f = Path(model_dir) / "preprocessor_config.json"
        if not f.is_file():
            raise FileNotFoundError(f"{model_dir}: preprocessor_config.json is missing")
        return QwenImageSettings.from_dict(json.loads(f.read_text())).to_dict()

    def dims(self, config) -> dict:
        t, v = config.text_config, config.vision_config
        head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
        return {
            "hidden_size": t.hidden_size, "num_layers": t.num_hidden_layers, "num_heads": t.num_attention_heads,
            "num_kv_heads": t.num_key_value_heads, "head_dim": head_dim, "vocab_size": t.vocab_size,
            "max_position_embeddings": t.max_position_embeddings,
            "mrope_section": list(t.rope_parameters["mrope_section"]),
            "patch_size": v.patch_size, "spatial_merge_size": v.spatial_merge_size, "window_size": v.window_size,
            "temporal_patch_size": v.temporal_patch_size, "vision_hidden_size": v.hidden_size,
            "patch_dim": v.in_channels * v.temporal_patch_size * v.patch_size ** 2,
        }

    def token_ids(self, config) -> dict:
        t = config.text_config
        return {"image_token_id": int(config.image_token_id), "vision_start_token_id": config.vision_start_token_id,
                "vision_end_token_id": config.vision_end_token_id, "bos_token_id": t.bos_token_id,
                "eos_token_id": t.eos_token_id, "pad_token_id": t.pad_token_id}

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

    def embed_tokens(self, model):
        return model.get_input_embeddings()

    def language_model(self, model):
        """Qwen2_5_VLTextModel: takes position_ids [3, B, S] (t, h, w)."""
        return model.model.language_model

    def lm_head(self, model):
        return model.lm_head

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

    def graph_module(self, name: str, model):
        """torch module of graph `name` (vision, embed, probe, decoder)."""
        from coverpruner.export.modules import DecoderGraph, EmbedGraph, ProbeGraph

        if name == "vision":
            from coverpruner.families.qwen_graphs import QwenVisionGraph

            return QwenVisionGraph(model.model.visual).eval()
        if name == "embed":
            return EmbedGraph(self.embed_tokens(model)).eval()
        if name == "probe":
            return ProbeGraph(self.probe_parts(model)).eval()
        if name == "decoder":
            return DecoderGraph(self.language_model(model), self.lm_head(model)).eval()
        raise ValueError(f"unknown graph {name!r}")

    def example_inputs(self, name: str, dims: dict, dtype):
        """(args, input_names, output_names, dynamic_shapes) of graph `name` for torch.onnx.export.

        Dynamic axes: vision `num_patches` (N), `num_visual` (n = N/4), `num_windows` (W), `window_slots` (S);
        probe/decoder sequence axes; the
        position ids of probe and decoder are [3, B, L]. Example sizes are >= 2 on every dynamic axis.
        """
        import torch
        from torch.export import Dim

        d = dims["hidden_size"]
        batch, seq = Dim("batch"), Dim("seq")
        if name == "vision":
            grid = (1, 8, 12)  # 96 patches, 24 tokens, windows at the tiny preset's size and larger
            inp = vision_inputs(np.zeros((96, dims["patch_dim"]), np.float32), grid, dims["spatial_merge_size"],
                                dims["window_size"], dims["patch_size"])
            args = tuple(torch.from_numpy(inp[k]) for k in VISION_INPUTS)
            args = (torch.randn(96, dims["patch_dim"], dtype=dtype),) + args[1:]
            patches, tokens, windows = Dim("num_patches", min=4), Dim("num_visual", min=1), Dim("num_windows")
            shapes = ({0: patches}, {0: patches}, {0: tokens}, {0: tokens}, {0: windows, 1: Dim("window_slots")},
                      {0: windows}, {0: patches}, {0: patches})
            return args, list(VISION_INPUTS), ["image_features"], shapes
        if name == "embed":
            ids = torch.randint(0, dims["vocab_size"], (2, 7))
            return (ids,), ["input_ids"], ["inputs_embeds"], ({0: batch, 1: seq},)
        if name == "probe":
            n, length, t = 24, 40, 5
            pos = torch.from_numpy(np.broadcast_to(np.arange(length), (3, length)).copy())[:, None]  # [3,1,L]
            args = (torch.randn(1, length, d, dtype=dtype), pos, torch.arange(3, 3 + n),
                    torch.arange(length - t - 2, length - 2))
            shapes = ({1: seq}, {2: seq}, {0: Dim("num_visual")}, {0: Dim("num_instruction")})
            return args, ["inputs_embeds", "position_ids", "visual_positions", "instruction_positions"], \
                ["relevance"], shapes
        if name == "decoder":
            layers, hkv, hd = dims["num_layers"], dims["num_kv_heads"], dims["head_dim"]
            b, s, p = 2, 3, 4
            past = tuple(torch.randn(b, hkv, p, hd, dtype=dtype) for _ in range(2 * layers))
            pos = torch.arange(p, p + s)[None, None].expand(3, b, s).contiguous()
            args = (torch.randn(b, s, d, dtype=dtype), torch.ones(b, p + s, dtype=torch.long), pos, past)
            past_dim = Dim("past_sequence", min=0)
            shapes = ({0: batch, 1: seq}, {0: batch, 1: Dim("total_sequence")}, {1: batch, 2: seq},
                      tuple({0: batch, 2: past_dim} for _ in past))
            kv = [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
            out = ["logits"] + [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
            return args, ["inputs_embeds", "attention_mask", "position_ids", *kv], out, shapes
        raise ValueError(f"unknown graph {name!r}")
