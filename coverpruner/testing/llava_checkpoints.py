"""Random-weight LLaVA-1.5 checkpoints in the llava-hf format, written locally (no downloads).

`write_llava_checkpoint(output, preset="tiny")` writes config.json, model.safetensors, a real fast tokenizer
(tokenizer.json trained with `tokenizers`), preprocessor/processor configs and the llava-hf chat
template, all through `save_pretrained`, so `AutoProcessor` and `LlavaForConditionalGeneration`
load the directory like a hub checkpoint. The presets (tiny, llava-1.5-7b) are in testing/presets.py;
testing/checkpoints.py's `write_checkpoint` writes any preset of any family.
"""

from __future__ import annotations

from pathlib import Path

from coverpruner.testing.common import default_dtype, fast_tokenizer, randomize, round_up
from coverpruner.testing.presets import PRESETS, Preset
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
    text_kw.setdefault("vocab_size", round_up(tokenizer_size, 64))
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


def write_llava_checkpoint(output: str | Path, preset: str = "tiny", layers: int | None = None,
                           seed: int = 0) -> Path:
    """Write a random-weight LLaVA-1.5 checkpoint of `preset` into `output`; returns the directory.

    `layers` overrides the number of decoder layers. Weights: normal(0, init_range) linears/embeddings,
    deterministic for a given seed.
    """
    import torch
    from transformers import LlavaForConditionalGeneration

    p = PRESETS[preset]
    out = Path(output)
    torch.manual_seed(seed)

    tok = train_tokenizer(vocab_size=p.tokenizer_vocab, seed=seed)
    config = build_config(preset, tok.token_to_id("<image>"), tok.token_to_id("<pad>"), tok.get_vocab_size(), layers)
    vision = config.vision_config
    dtype = getattr(torch, p.dtype)
    out.mkdir(parents=True, exist_ok=True)
    with default_dtype(dtype), torch.no_grad():
        model = LlavaForConditionalGeneration(config)
        randomize(model, p.init_range)
    model.save_pretrained(out)
    del model
    build_processor(tok, vision.image_size, vision.patch_size).save_pretrained(out)
    return out


