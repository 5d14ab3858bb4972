"""Random-weight LLaVA-NeXT checkpoints (llava-hf `LlavaNextForConditionalGeneration`), written locally.

Same recipe as coverpruner/testing/checkpoints.py (LLaVA-1.5): a real fast tokenizer trained with
`tokenizers`, the llava-hf chat template, random weights, everything through `save_pretrained` so
`AutoProcessor` / `LlavaNextForConditionalGeneration` load the directory like a hub checkpoint.

Presets:
  llava-next-tiny  CLIP 84px/14 tiles (6x6 = 36 patches + CLS), anyres pinpoints scaled from llava-v1.6
                   (1x2, 2x1, 2x2, 3x1, 1x3 tiles: non-square grids, 1-4 grid tiles + the base image),
                   Llama with grouped-query attention (4 heads, 2 kv heads), hidden 64. At most
                   36 + 12*12 + 12 = 192 visual rows per image. For tests (seconds).
  llava-next-7b    real widths of llava-hf/llava-v1.6-vicuna-7b-hf (CLIP ViT-L/14-336, pinpoints up to
                   672x672 -> 576 + 48*48 + 48 = 2,928 rows, 2,880 candidates; vicuna-7b hidden 4096,
                   32 heads, intermediate 11008, vocab 32064), `layers` decoder layers (default 32) and
                   `vision_layers` CLIP layers (default 24), fp16 weights; for latency work.
"""

from __future__ import annotations

from pathlib import Path

from coverpruner.testing.common import default_dtype, fast_tokenizer, randomize
from coverpruner.testing.llava_checkpoints import LLAVA_HF_CHAT_TEMPLATE, tower_configs
from coverpruner.testing.presets import presets_of
from coverpruner.testing.tokenizer import train_tokenizer

NEXT_PRESETS = presets_of("llava_next")  # testing/presets.py's LLaVA-NeXT rows

def pinpoints(preset: str) -> list[list[int]]:
    """image_grid_pinpoints of `preset`: [[height, width], ...] in pixels."""
    p = NEXT_PRESETS[preset]
    tile = p.vision["image_size"]
    return [[gh * tile, gw * tile] for gh, gw in p.extra["grids"]]


def build_next_processor(tokenizer, image_size: int, patch_size: int, grid_pinpoints: list[list[int]]):
    """LlavaNextProcessor: PIL image backend (no torchvision here), fast tokenizer, llava-hf template.

    num_additional_image_tokens=1: with the "default" strategy the processor subtracts one token for the
    CLS it assumes was counted; without it the placeholder count is one short of the model's features.
    """
    from transformers import LlavaNextImageProcessorPil, LlavaNextProcessor

    fast = fast_tokenizer(tokenizer)
    image_processor = LlavaNextImageProcessorPil(
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size},
        image_grid_pinpoints=grid_pinpoints, do_center_crop=True, do_resize=True, do_rescale=True,
        do_normalize=True, do_convert_rgb=True, do_pad=True, resample=3,
    )
    return LlavaNextProcessor(
        image_processor=image_processor, tokenizer=fast, patch_size=patch_size,
        vision_feature_select_strategy="default", chat_template=LLAVA_HF_CHAT_TEMPLATE,
        image_token="<image>", num_additional_image_tokens=1,
    )


def build_next_config(preset: str, image_token_id: int, pad_token_id: int, tokenizer_size: int,
                      layers: int | None = None, vision_layers: int | None = None):
    """LlavaNextConfig of `preset` (no weights); `layers` / `vision_layers` override the layer counts."""
    from transformers import LlavaNextConfig

    text, vision = tower_configs(NEXT_PRESETS[preset], pad_token_id, tokenizer_size, layers, vision_layers)
    p = NEXT_PRESETS[preset]
    config = LlavaNextConfig(
        vision_config=vision, text_config=text, image_token_index=image_token_id,
        image_grid_pinpoints=pinpoints(preset), image_seq_length=(vision.image_size // vision.patch_size) ** 2,
        vision_feature_layer=-2, vision_feature_select_strategy="default", projector_hidden_act="gelu",
    )
    config.dtype = p.dtype
    return config


def write_next_checkpoint(output: str | Path, preset: str = "llava-next-tiny", layers: int | None = None,
                          seed: int = 0, vision_layers: int | None = None) -> Path:
    """Write a random-weight LLaVA-NeXT checkpoint of `preset` into `output` (image_newline random too)."""
    import torch
    from transformers import LlavaNextForConditionalGeneration

    if preset not in NEXT_PRESETS:
        raise ValueError(f"unknown preset {preset!r}; expected one of {sorted(NEXT_PRESETS)}")
    p = NEXT_PRESETS[preset]
    out = Path(output)
    torch.manual_seed(seed)
    tok = train_tokenizer(vocab_size=p.tokenizer_vocab, seed=seed)
    config = build_next_config(preset, tok.token_to_id("<image>"), tok.token_to_id("<pad>"), tok.get_vocab_size(),
                               layers, vision_layers)
    out.mkdir(parents=True, exist_ok=True)
    with default_dtype(getattr(torch, p.dtype)), torch.no_grad():
        model = LlavaNextForConditionalGeneration(config)
        randomize(model, p.init_range)
    model.save_pretrained(out)
    del model
    v = config.vision_config
    build_next_processor(tok, v.image_size, v.patch_size, config.image_grid_pinpoints).save_pretrained(out)
    return out
