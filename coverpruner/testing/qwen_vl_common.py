"""What the Qwen2.5-VL and Qwen3-VL checkpoint writers share (no downloads): the byte-level BPE test tokenizer with
Qwen's specials, the saved fast tokenizer, the Qwen2-VL PIL image processor of a preset, the config's text/vision
kwargs and token ids, and the write itself (random weights in the preset's dtype, generation_config.json, tokenizer,
preprocessor_config.json, chat_template.jinja). Each family's writer passes its config class, model class, chat
template and what its vision tower needs (qwen_checkpoints.py, qwen3_vl_checkpoints.py).
"""

from __future__ import annotations

from pathlib import Path

from coverpruner.testing.common import default_dtype, randomize, round_up
from coverpruner.testing.presets import QwenPreset
from coverpruner.testing.tokenizer import corpus

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                 "<|image_pad|>", "<|video_pad|>"]
#: Qwen's tool-call and thinking markers: single added tokens that are not special (a real Qwen2.5 / Qwen3
#: vocabulary's <tool_call> 151657 ... </think> 151668, "special": false), so they stay in decoded text and one token
#: opens a call: what a logit_bias stands a trained model's preference on. Appended after the specials (ids 1007..):
#: the trained pieces keep their ids and 1013 rows still round up to the same 1024-row embedding.
QWEN_MARKERS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]


def train_qwen_tokenizer(vocab_size: int = 1000, seed: int = 0, added: tuple[str, ...] = ()):
    """Byte-level BPE `tokenizers.Tokenizer` like Qwen2's (no BOS), specials appended after the trained pieces, then
    ``added`` (tokens that are one id each but not special, kept when decoding), then the tool-call and thinking
    markers (QWEN_MARKERS, added tokens that are not special) not already added.

    Trained on the same generated corpus as the LLaVA test tokenizer plus ChatML pieces.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    chat = ["system\nYou are a helpful assistant.\n", "user\nWhat is shown in this image?\n", "assistant\n"] * 200
    tok.train_from_iterator(chat + corpus(seed), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN_SPECIALS])
    # ``added`` first (Qwen3.5's checkpoints keep <think> / </think> at the ids they had before the markers came)
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t in (*added, *(t for t in QWEN_MARKERS if t not in added))])
    return tok


def fast_tokenizer(tokenizer, chat_template: str, model_max_length: int):
    """PreTrainedTokenizerFast around `tokenizer` as the Instruct checkpoints save it (eos <|im_end|>, pad
    <|endoftext|>, left padding, the chat template)."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   model_max_length=model_max_length, padding_side="left")
    fast.add_special_tokens({"additional_special_tokens": QWEN_SPECIALS[1:]})
    fast.chat_template = chat_template
    return fast


def image_processor(preset: QwenPreset, **kwargs):
    """Qwen2VLImageProcessorPil with the preset's pixel limits and patch / merge / temporal sizes; `kwargs` adds
    what a family sets otherwise (Qwen3-VL: mean / std 0.5)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(
        size={"shortest_edge": preset.min_pixels, "longest_edge": preset.max_pixels},
        patch_size=preset.vision["patch_size"], merge_size=preset.vision["spatial_merge_size"],
        temporal_patch_size=preset.vision["temporal_patch_size"], **kwargs)


def build_config(config_class, preset: QwenPreset, tokenizer, layers: int | None, trim_vision, **kwargs):
    """`config_class` (Qwen2_5_VLConfig / Qwen3VLConfig) of a preset, no weights: `layers` decoder layers when given
    (ValueError below 1), the vocabulary rounded up from the tokenizer's, the specials' ids from `tokenizer`, the
    preset's init range and dtype; `trim_vision(vision kwargs, blocks)` cuts the tower to preset.vision_layers the
    family's way; `kwargs`: further top-level config fields."""
    text = dict(preset.text)
    if layers is not None:
        if layers < 1:
            raise ValueError(f"--layers must be >= 1, got {layers}")
        text["num_hidden_layers"] = layers
    text.setdefault("vocab_size", round_up(tokenizer.get_vocab_size(), 64))
    ids = {t: tokenizer.token_to_id(t) for t in QWEN_SPECIALS}
    text.update(bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
                initializer_range=preset.init_range)
    vision = {**preset.vision, "initializer_range": preset.init_range}
    if preset.vision_layers is not None:
        trim_vision(vision, preset.vision_layers)
    config = config_class(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                          video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                          vision_end_token_id=ids["<|vision_end|>"], **kwargs)
    config.dtype = preset.dtype
    return config


def check_preset(presets: dict, preset: str) -> QwenPreset:
    if preset not in presets:
        raise ValueError(f"unknown preset {preset!r}; expected one of {sorted(presets)}")
    return presets[preset]


def write_qwen_vl_checkpoint(output: str | Path, preset: QwenPreset, tokenizer, config, model_class, generation: dict,
                             chat_template: str, model_max_length: int, processor, seed: int = 0, init=None) -> Path:
    """Write a random-weight checkpoint of `model_class(config)` into `output`; returns the directory.

    Weights: normal(0, init_range) for linears, embeddings and biases, 1 + normal for norms, created in the preset's
    dtype after torch.manual_seed(seed) (deterministic for a given seed); ``init(model, init_range)`` then re-draws
    what a family's parameters mean otherwise (Qwen3.5's zero-centred norms and decay parameters).
    generation_config.json: the text config's bos / pad, eos [<|im_end|>, <|endoftext|>] and `generation`'s sampling fields.
    """
    import torch
    from transformers import GenerationConfig

    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    with default_dtype(getattr(torch, preset.dtype)), torch.no_grad():
        model = model_class(config)
        randomize(model, preset.init_range)
        if init is not None:
            init(model, preset.init_range)
    t = config.text_config
    model.generation_config = GenerationConfig(bos_token_id=t.bos_token_id, pad_token_id=t.pad_token_id,
                                               eos_token_id=[t.eos_token_id, t.bos_token_id], **generation)
    model.save_pretrained(out)
    del model
    fast_tokenizer(tokenizer, chat_template, model_max_length).save_pretrained(out)
    processor.save_pretrained(out)
    (out / "chat_template.jinja").write_text(chat_template)
    return out
