"""Random-weight LLaVA-1.5 checkpoints in the llava-hf format, written locally (no downloads).

`write_checkpoint(output, preset="tiny")` writes config.json, model.safetensors, a real fast tokenizer
(tokenizer.json trained with `tokenizers`), preprocessor/processor configs and the llava-hf chat
template, all through `save_pretrained`, so `AutoProcessor` and `LlavaForConditionalGeneration`
load the directory like a hub checkpoint.

Presets:
  tiny          CLIP 168px/14 (144 patches + CLS; "default" drops CLS -> 144 visual tokens), Llama with
                grouped-query attention (4 heads, 2 kv heads), hidden 64; for tests and demos (seconds).
  llava-1.5-7b  real widths (CLIP ViT-L/14-336, hidden 4096, 32 heads, intermediate 11008, vocab 32064)
                with `layers` decoder layers (default 2), fp16 weights; for latency and memory work.

LLaVA-NeXT presets (llava-next-tiny, llava-next-7b) live in coverpruner/testing/llava_next_checkpoints.py;
the CLI writes either family.

CLI: coverpruner-make-checkpoint --preset tiny|llava-1.5-7b|llava-next-tiny|llava-next-7b --layers N
     [--vision-layers N] --output DIR --seed S
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

from coverpruner.testing.tokenizer import train_tokenizer

# The chat template published with llava-hf/llava-1.5-*-hf (images first, then text, "ASSISTANT:").
LLAVA_HF_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}"
    "{% endif %}{# Render all images first #}{% for content in message['content'] | selectattr('type', "
    "'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}{# Render all text next #}{% if message['role'] != "
    "'assistant' %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] + ' '}}{% endfor %}{% else %}{% for content in message['content'] | "
    "selectattr('type', 'equalto', 'text') %}{% generation %}{{ content['text'] + ' '}}{% endgeneration %}"
    "{% endfor %}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)


@dataclass(frozen=True)
class Preset:
    """Shapes of one random checkpoint. `vision`/`text` are CLIPVisionConfig/LlamaConfig kwargs."""

    vision: dict
    text: dict
    tokenizer_vocab: int
    dtype: str  # torch dtype name the weights are created and saved in
    init_range: float
    extra: dict = field(default_factory=dict)


PRESETS: dict[str, Preset] = {
    "tiny": Preset(
        vision=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                    image_size=168, patch_size=14, projection_dim=64, hidden_act="quick_gelu"),
        text=dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=1024, rms_norm_eps=1e-5),
        tokenizer_vocab=1000,
        dtype="float32",
        # Wider than HF's 0.02 so attention maps and greedy tokens are far from uniform / constant.
        init_range=0.1,
    ),
    "llava-1.5-7b": Preset(
        vision=dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                    image_size=336, patch_size=14, projection_dim=768, hidden_act="quick_gelu",
                    layer_norm_eps=1e-5),
        text=dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                  num_key_value_heads=32, max_position_embeddings=4096, rms_norm_eps=1e-5, vocab_size=32064),
        tokenizer_vocab=1000,
        dtype="float16",
        init_range=0.02,
    ),
}


@contextlib.contextmanager
def _default_dtype(dtype):
    """Create parameters directly in `dtype` so a 7B-width model never exists in fp32 first."""
    import torch

    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def _round_up(x: int, multiple: int) -> int:
    return (x + multiple - 1) // multiple * multiple


def fast_tokenizer(tokenizer):
    """PreTrainedTokenizerFast over a trained `tokenizers.Tokenizer`, with the LLaVA specials declared."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
        model_max_length=4096, padding_side="left",
    )
    fast.add_special_tokens({"additional_special_tokens": ["<image>"]})
    return fast


def build_processor(tokenizer, image_size: int, patch_size: int):
    """LlavaProcessor (PIL image backend, fast tokenizer, llava-hf chat template) for `tokenizer`."""
    from transformers import CLIPImageProcessorPil, LlavaProcessor

    fast = fast_tokenizer(tokenizer)
    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size},
        do_center_crop=True, do_resize=True, do_rescale=True, do_normalize=True, do_convert_rgb=True,
        resample=3,
    )
    return LlavaProcessor(
        image_processor=image_processor, tokenizer=fast, patch_size=patch_size,
        vision_feature_select_strategy="default", chat_template=LLAVA_HF_CHAT_TEMPLATE,
        image_token="<image>", num_additional_image_tokens=1,
    )


def tower_configs(p: Preset, pad_token_id: int, tokenizer_size: int, layers: int | None = None,
                  vision_layers: int | None = None):
    """(LlamaConfig, CLIPVisionConfig) of preset `p`; `layers` / `vision_layers` override the layer counts
    (ValueError naming the flag when < 1); the text vocab is the preset's or the tokenizer size rounded up to 64."""
    from transformers import CLIPVisionConfig, LlamaConfig

    text_kw, vision_kw = dict(p.text), dict(p.vision)
    for flag, value, kw in (("--layers", layers, text_kw), ("--vision-layers", vision_layers, vision_kw)):
        if value is not None:
            if value < 1:
                raise ValueError(f"{flag} must be >= 1, got {value}")
            kw["num_hidden_layers"] = value
    text_kw.setdefault("vocab_size", _round_up(tokenizer_size, 64))
    text = LlamaConfig(**text_kw, bos_token_id=1, eos_token_id=2, pad_token_id=pad_token_id,
                       initializer_range=p.init_range, tie_word_embeddings=False)
    return text, CLIPVisionConfig(**vision_kw, initializer_range=p.init_range)


def build_config(preset: str, image_token_id: int, pad_token_id: int, tokenizer_size: int,
                 layers: int | None = None):
    """LlavaConfig of `preset` (no weights). `layers` overrides the number of decoder layers; the text vocab
    is the preset's or the tokenizer size rounded up to 64 (as llava-hf pads 32002 -> 32064)."""
    from transformers import LlavaConfig

    p = PRESETS[preset]
    text, vision = tower_configs(p, pad_token_id, tokenizer_size, layers)
    config = LlavaConfig(
        vision_config=vision, text_config=text, image_token_index=image_token_id,
        image_seq_length=(vision.image_size // vision.patch_size) ** 2,
        vision_feature_layer=-2, vision_feature_select_strategy="default", projector_hidden_act="gelu",
    )
    config.dtype = p.dtype
    return config


def all_presets() -> list[str]:
    """Every preset the CLI can write (LLaVA-1.5, LLaVA-NeXT and Qwen2.5-VL)."""
    from coverpruner.testing.llava_next_checkpoints import NEXT_PRESETS
    from coverpruner.testing.qwen_checkpoints import QWEN_PRESETS

    return sorted([*PRESETS, *NEXT_PRESETS, *QWEN_PRESETS])


def write_checkpoint(output: str | Path, preset: str = "tiny", layers: int | None = None, seed: int = 0,
                     vision_layers: int | None = None) -> Path:
    """Write a random-weight checkpoint of `preset` into `output`; returns the directory.

    `layers` overrides the number of decoder layers, `vision_layers` the CLIP layers (LLaVA-NeXT presets).
    Weights: normal(0, init_range) linears/embeddings, deterministic for a given seed.
    """
    import torch
    from transformers import LlavaForConditionalGeneration

    from coverpruner.testing.llava_next_checkpoints import NEXT_PRESETS, write_next_checkpoint
    from coverpruner.testing.qwen_checkpoints import QWEN_PRESETS, write_qwen_checkpoint

    if preset in NEXT_PRESETS:
        return write_next_checkpoint(output, preset, layers=layers, seed=seed, vision_layers=vision_layers)
    if vision_layers is not None:
        raise ValueError(f"--vision-layers is only supported for the LLaVA-NeXT presets, not {preset!r}")
    if preset in QWEN_PRESETS:
        return write_qwen_checkpoint(output, preset=preset, layers=layers, seed=seed)
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; expected one of {all_presets()}")
    p = PRESETS[preset]
    out = Path(output)
    torch.manual_seed(seed)

    tok = train_tokenizer(vocab_size=p.tokenizer_vocab, seed=seed)
    config = build_config(preset, tok.token_to_id("<image>"), tok.token_to_id("<pad>"), tok.get_vocab_size(), layers)
    vision = config.vision_config
    dtype = getattr(torch, p.dtype)
    out.mkdir(parents=True, exist_ok=True)
    with _default_dtype(dtype), torch.no_grad():
        model = LlavaForConditionalGeneration(config)
        _randomize(model, p.init_range)
    model.save_pretrained(out)
    del model
    build_processor(tok, vision.image_size, vision.patch_size).save_pretrained(out)
    return out


def _randomize(model, std: float) -> None:
    """Re-draw every weight: HF's init leaves norms at 1 and biases at 0; random values exercise them."""
    import torch

    for name, param in model.named_parameters():
        if name.endswith("norm.weight") or "layer_norm" in name or "layrnorm" in name:
            param.copy_(1.0 + std * torch.randn_like(param))
        else:
            param.normal_(0.0, std)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="coverpruner-make-checkpoint",
        description="Write a random-weight LLaVA-1.5 / LLaVA-NeXT / Qwen2.5-VL checkpoint (HF format, real local "
                    "tokenizer).",
    )
    parser.add_argument("--preset", choices=all_presets(), default="tiny",
                        help="tiny / llava-next-tiny / qwen2.5-vl-tiny: test models; llava-1.5-7b / llava-next-7b / "
                             "qwen2.5-vl-7b: real 7B widths for latency work")
    parser.add_argument("--layers", type=int, default=None,
                        help="number of decoder layers (default: tiny 2, 7b presets 32; use 2 for benchmarks)")
    parser.add_argument("--vision-layers", type=int, default=None,
                        help="number of CLIP layers, LLaVA-NeXT presets only (default: tiny 3, llava-next-7b 24)")
    parser.add_argument("--output", required=True, help="directory to write the checkpoint into")
    parser.add_argument("--seed", type=int, default=0, help="random seed for weights and tokenizer corpus")
    args = parser.parse_args(argv)
    try:
        out = write_checkpoint(args.output, preset=args.preset, layers=args.layers, seed=args.seed,
                               vision_layers=args.vision_layers)
    except ValueError as exc:
        parser.exit(2, f"coverpruner-make-checkpoint: error: {exc}\n")
    print(f"wrote {args.preset} checkpoint to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
