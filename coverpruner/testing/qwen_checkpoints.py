"""Random-weight Qwen2.5-VL checkpoints in the HF format, written locally (no downloads).

`write_qwen_checkpoint(output, preset)` writes config.json, model.safetensors, a byte-level BPE tokenizer
trained with `tokenizers` (Qwen's specials: <|endoftext|>, <|im_start|>, <|im_end|>, <|vision_start|>,
<|vision_end|>, <|image_pad|>, <|video_pad|>), preprocessor_config.json (Qwen2-VL image processor, PIL
backend) and the chat template published with Qwen/Qwen2.5-VL-*-Instruct, so that
`Qwen2_5_VLForConditionalGeneration` and `Qwen2_5_VLProcessor(image_processor=Qwen2VLImageProcessorPil(...))`
load the directory like a hub checkpoint. (`AutoProcessor` would also build the video processor, which
needs torchvision; nothing here or in the runtime depends on it.)

Presets (testing/presets.py):
  qwen2.5-vl-tiny  vision: hidden 64, 4 heads, depth 4, full-attention blocks (1, 3), window 84 px = 3x3
                   merged patches (smaller than every test grid and not dividing most of them, so window
                   padding matters); text: hidden 64, 4 heads / 2 kv heads (GQA), q/k/v bias, head_dim 16,
                   mrope_section [2, 3, 3]; pixels limited to 28*28*[4, 160] (4..160 visual tokens).
  qwen2.5-vl-7b    real widths of Qwen2.5-VL-7B-Instruct (vision 1280 x 16 heads, 3584 out; text 3584, 28
                   heads / 4 kv heads, intermediate 18944, vocab 152064, mrope [16, 24, 24]) with `layers`
                   decoder layers (default 2) and 4 vision blocks (full attention at block 3), fp16 weights.
"""

from __future__ import annotations

from pathlib import Path

from coverpruner.testing.common import default_dtype, randomize, round_up
from coverpruner.testing.presets import QwenPreset, presets_of
from coverpruner.testing.tokenizer import corpus

QWEN_PRESETS = presets_of("qwen2_5_vl")  # testing/presets.py's Qwen2.5-VL rows

# The chat template published with Qwen/Qwen2.5-VL-7B-Instruct (default system turn, ChatML, vision markers).
QWEN2_5_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in "
    "messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful "
    "assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] "
    "== 'image' or 'image' in content or 'image_url' in content %}{% set image_count.value = image_count.value + "
    "1 %}{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|>"
    "<|vision_end|>{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = "
    "video_count.value + 1 %}{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|>"
    "<|video_pad|><|vision_end|>{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}"
    "<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                 "<|image_pad|>", "<|video_pad|>"]


def train_qwen_tokenizer(vocab_size: int = 1000, seed: int = 0):
    """Byte-level BPE `tokenizers.Tokenizer` like Qwen2's (no BOS), specials appended after the trained pieces.

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
    return tok


def build_qwen_tokenizer_and_image_processor(tokenizer, preset: QwenPreset):
    """(PreTrainedTokenizerFast, Qwen2VLImageProcessorPil) for `tokenizer` and the preset's pixel limits.

    The checkpoint stores these two plus chat_template.jinja; a `Qwen2_5_VLProcessor` cannot be built without
    torchvision (its video processor), so none is saved (tests build one around these parts).
    """
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   model_max_length=32768, padding_side="left")
    fast.add_special_tokens({"additional_special_tokens": QWEN_SPECIALS[1:]})
    fast.chat_template = QWEN2_5_VL_CHAT_TEMPLATE
    image_processor = Qwen2VLImageProcessorPil(
        size={"shortest_edge": preset.min_pixels, "longest_edge": preset.max_pixels},
        patch_size=preset.vision["patch_size"], merge_size=preset.vision["spatial_merge_size"],
        temporal_patch_size=preset.vision["temporal_patch_size"])
    return fast, image_processor


def build_qwen_config(preset_name: str, tokenizer, layers: int | None = None):
    """Qwen2_5_VLConfig of a preset (no weights); token ids taken from `tokenizer`."""
    from transformers import Qwen2_5_VLConfig

    p = QWEN_PRESETS[preset_name]
    text = dict(p.text)
    if layers is not None:
        if layers < 1:
            raise ValueError(f"--layers must be >= 1, got {layers}")
        text["num_hidden_layers"] = layers
    text.setdefault("vocab_size", round_up(tokenizer.get_vocab_size(), 64))
    vision = dict(p.vision)
    if p.vision_layers is not None:
        vision["depth"] = p.vision_layers
        vision["fullatt_block_indexes"] = [i for i in vision["fullatt_block_indexes"] if i < p.vision_layers] or \
            [p.vision_layers - 1]
    ids = {t: tokenizer.token_to_id(t) for t in QWEN_SPECIALS}
    text.update(bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
                initializer_range=p.init_range)
    vision["initializer_range"] = p.init_range
    config = Qwen2_5_VLConfig(
        text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False)
    config.dtype = p.dtype
    return config


def write_qwen_checkpoint(output: str | Path, preset: str = "qwen2.5-vl-tiny", layers: int | None = None,
                          seed: int = 0) -> Path:
    """Write a random-weight Qwen2.5-VL checkpoint of `preset` into `output`; returns the directory.

    Weights: normal(0, init_range) for linears, embeddings and biases, 1 + normal for norms; deterministic
    for a given seed. generation_config.json carries the real checkpoint's repetition_penalty (1.05).
    """
    import torch
    from transformers import GenerationConfig, Qwen2_5_VLForConditionalGeneration

    if preset not in QWEN_PRESETS:
        raise ValueError(f"unknown preset {preset!r}; expected one of {sorted(QWEN_PRESETS)}")
    p = QWEN_PRESETS[preset]
    out = Path(output)
    torch.manual_seed(seed)
    tok = train_qwen_tokenizer(seed=seed)
    config = build_qwen_config(preset, tok, layers)
    out.mkdir(parents=True, exist_ok=True)
    with default_dtype(getattr(torch, p.dtype)), torch.no_grad():
        model = Qwen2_5_VLForConditionalGeneration(config)
        randomize(model, p.init_range)
    # The published generation_config (greedy via top_k=1 with a repetition penalty).
    model.generation_config = GenerationConfig(
        bos_token_id=config.text_config.bos_token_id, pad_token_id=config.text_config.pad_token_id,
        eos_token_id=[config.text_config.eos_token_id, config.text_config.bos_token_id], do_sample=True,
        repetition_penalty=1.05, temperature=0.1, top_p=0.001, top_k=1)
    model.save_pretrained(out)
    del model
    fast, image_processor = build_qwen_tokenizer_and_image_processor(tok, p)
    fast.save_pretrained(out)
    image_processor.save_pretrained(out)
    (out / "chat_template.jinja").write_text(QWEN2_5_VL_CHAT_TEMPLATE)
    return out
