"""Random-weight Gemma 3 checkpoints in the HF format, written locally (no downloads).

`write_gemma3_checkpoint(output, preset)` writes config.json (Gemma3Config: SigLIP vision tower, the multi-modal
projector's RMSNorm + average pool + linear, a Gemma 3 decoder with sliding and full layers), model.safetensors, a
byte-fallback BPE tokenizer shaped like Gemma's (normalizer " " -> "▁", byte pieces <0x00>..<0xFF> in the
vocabulary, <bos> added by the post-processor, Gemma's specials <pad> <eos> <bos> <unk> <mask> <start_of_turn>
<end_of_turn> <start_of_image> <end_of_image> and <image_soft_token> last, as the real vocabulary has it), the
Gemma3ImageProcessor settings (preprocessor_config.json, PIL backend), the processor (image_seq_length) and the chat
template of google/gemma-3-*-it, so `Gemma3ForConditionalGeneration` and `AutoProcessor` load the directory like a
hub checkpoint.

Presets (testing/presets.py): gemma3-tiny for tests; gemma-3-4b / 12b / 27b with the real widths (their config.json)
and `layers` decoder layers (default 2: one sliding, one full) and 4 vision blocks, for benchmarks.
"""

from __future__ import annotations

from pathlib import Path

from coverpruner.testing.common import default_dtype, round_up
from coverpruner.testing.presets import PRESETS, presets_of
from coverpruner.testing.tokenizer import JSON_ADDED, corpus

GEMMA3_PRESETS = presets_of("gemma3")

#: Gemma's specials in Gemma's order (pad 0, eos 1, bos 2, unk 3, mask 4), then the turn and image markers
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>",
            "<end_of_image>"]
#: the soft token, last in the vocabulary (262,144 in the real one)
IMAGE_SOFT_TOKEN = "<image_soft_token>"

# The chat template of google/gemma-3-{4b,12b,27b}-it (tokenizer_config.json / chat_template.json).
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n'}}\n"
    "{%- endif -%}\n"
)


def train_gemma_tokenizer(vocab_size: int = 1000, seed: int = 0):
    """A `tokenizers.Tokenizer` shaped like Gemma's: specials (ids 0..8), the 256 byte pieces <0x00>..<0xFF>, the BPE
    pieces trained on the test corpus (plus Gemma's chat pieces; merges never cross a word start "▁", as
    SentencePiece's), JSON's punctuation the corpus lacks (structured output needs '"', '}', ... as tokens), then
    <image_soft_token>. byte_fallback: any text can be spelled."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers import trainers

    chat = ["<start_of_turn>user\nWhat is shown in this image?<end_of_turn>\n<start_of_turn>model\n",
            "Here is the original image \n\n and here are some crops to help you see better \n\n"] * 200
    lines = [line.replace("<start_of_turn>", "").replace("<end_of_turn>", "") for line in chat] + corpus(seed)
    trainer_tok = Tokenizer(models.BPE())
    trainer_tok.normalizer = normalizers.Replace(" ", "▁")
    # train on words (split before each "▁" and around newlines) so no merge crosses a word start
    trainer_tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex("\n+"), behavior="isolated"), pre_tokenizers.Split("▁", behavior="merged_with_next")])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False, initial_alphabet=["▁", "\n"])
    trainer_tok.train_from_iterator(lines, trainer=trainer)
    trained = trainer_tok.get_vocab()
    vocab = {t: i for i, t in enumerate(SPECIALS)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in sorted(trained.items(), key=lambda kv: kv[1]):
        vocab.setdefault(piece, len(vocab))
    for piece in JSON_ADDED:  # JSON's punctuation as pieces of their own, as Gemma's vocabulary has them
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in _merges(trainer_tok)]
    vocab[IMAGE_SOFT_TOKEN] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")  # GemmaTokenizer's (a no-op)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in [*SPECIALS, IMAGE_SOFT_TOKEN]])
    bos = vocab["<bos>"]
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                       special_tokens=[("<bos>", bos)])
    return tok


def _merges(tok) -> list:
    """The trained BPE merges of a `tokenizers` BPE model, in rank order."""
    import json

    return json.loads(tok.to_str())["model"]["merges"]


def fast_tokenizer(tokenizer):
    """GemmaTokenizer around `tokenizer` as google/gemma-3-*-it saves it (bos added, the image markers named)."""
    from transformers import GemmaTokenizer

    return GemmaTokenizer(tokenizer_object=tokenizer, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>",
                          pad_token="<pad>", mask_token="<mask>", add_bos_token=True, add_eos_token=False,
                          padding_side="left", model_max_length=131072,
                          extra_special_tokens={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                                                "image_token": IMAGE_SOFT_TOKEN})


def build_config(preset: str, tokenizer, layers: int | None = None, vision_layers: int | None = None):
    """Gemma3Config of `preset` (no weights). `layers` / `vision_layers` override the decoder / vision layer counts
    (ValueError naming the flag below 1); layer_types keep the preset's sliding/full pattern, cut or repeated."""
    from transformers import Gemma3Config

    p = PRESETS[preset]
    text, vision = dict(p.text), dict(p.vision)
    for flag, value, kw in (("--layers", layers, text), ("--vision-layers", vision_layers, vision)):
        if value is not None:
            if value < 1:
                raise ValueError(f"{flag} must be >= 1, got {value}")
            kw["num_hidden_layers"] = value
    pattern = text.pop("layer_pattern")  # e.g. ["sliding_attention"] * 5 + ["full_attention"]
    text["layer_types"] = [pattern[i % len(pattern)] for i in range(text["num_hidden_layers"])]
    if layers is not None and layers >= 2 and "full_attention" not in text["layer_types"]:
        text["layer_types"][-1] = "full_attention"  # a cut stack keeps one full layer (1 sliding + 1 full at 2)
    ids = {t: tokenizer.token_to_id(t) for t in [*SPECIALS, IMAGE_SOFT_TOKEN]}
    text.setdefault("vocab_size", round_up(tokenizer.get_vocab_size(), 64))
    text.update(bos_token_id=ids["<bos>"], eos_token_id=[ids["<eos>"], ids["<end_of_turn>"]],
                pad_token_id=ids["<pad>"], initializer_range=p.init_range)
    config = Gemma3Config(text_config=text, vision_config={**vision, "model_type": "siglip_vision_model"},
                          mm_tokens_per_image=p.extra["mm_tokens_per_image"], boi_token_index=ids["<start_of_image>"],
                          eoi_token_index=ids["<end_of_image>"], image_token_index=ids[IMAGE_SOFT_TOKEN],
                          initializer_range=p.init_range, tie_word_embeddings=p.extra.get("tie_word_embeddings", True))
    config.dtype = p.dtype
    return config


def build_processor(tokenizer, preset: str):
    """Gemma3Processor (PIL image backend, the chat template) for `tokenizer` and the preset's image size."""
    from transformers import Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    p = PRESETS[preset]
    size = p.vision["image_size"]
    image_processor = Gemma3ImageProcessorPil(
        size={"height": size, "width": size}, resample=2, do_resize=True, do_rescale=True, do_normalize=True,
        image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5], do_convert_rgb=None, do_pan_and_scan=None,
        pan_and_scan_min_crop_size=None, pan_and_scan_max_num_crops=None, pan_and_scan_min_ratio_to_activate=None)
    return Gemma3Processor(image_processor=image_processor, tokenizer=fast_tokenizer(tokenizer),
                           chat_template=GEMMA3_CHAT_TEMPLATE, image_seq_length=p.extra["mm_tokens_per_image"])


def randomize_gemma(model, std: float) -> None:
    """Re-draw every weight: normal(0, std) for linears, embeddings and Gemma's RMSNorms (which scale by 1 + w: a
    scale ~1), except the per-head q/k norms, 1 + normal(0, std) (a scale ~2: sharper layer-0 attention, so the demand
    is far from uniform and answers depend on the image and the question), and 1 + normal(0, std) for SigLIP's
    LayerNorm weights."""
    import torch

    for name, param in model.named_parameters():
        vision_norm = "vision_tower" in name and ("layer_norm" in name or "layernorm" in name)
        if (vision_norm and name.endswith("weight")) or name.endswith(("q_norm.weight", "k_norm.weight")):
            param.copy_(1.0 + std * torch.randn_like(param))
        else:
            param.normal_(0.0, std)


def write_gemma3_checkpoint(output: str | Path, preset: str = "gemma3-tiny", layers: int | None = None,
                            seed: int = 0, vision_layers: int | None = None) -> Path:
    """Write a random-weight Gemma 3 checkpoint of `preset` into `output`; returns the directory. Weights are
    deterministic for a given seed (created in the preset's dtype); generation_config.json stops on <eos> and
    <end_of_turn> as google/gemma-3-*-it's does."""
    import torch
    from transformers import Gemma3ForConditionalGeneration, GenerationConfig

    if preset not in GEMMA3_PRESETS:
        raise ValueError(f"unknown preset {preset!r}; expected one of {sorted(GEMMA3_PRESETS)}")
    p = PRESETS[preset]
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    tok = train_gemma_tokenizer(vocab_size=p.tokenizer_vocab, seed=seed)
    config = build_config(preset, tok, layers, vision_layers if vision_layers is not None
                          else p.extra.get("vision_layers"))
    with default_dtype(getattr(torch, p.dtype)), torch.no_grad():
        model = Gemma3ForConditionalGeneration(config)
        randomize_gemma(model, p.init_range)
    t = config.text_config
    model.generation_config = GenerationConfig(bos_token_id=t.bos_token_id, pad_token_id=t.pad_token_id,
                                               eos_token_id=list(t.eos_token_id), cache_implementation="hybrid")
    model.save_pretrained(out)
    del model
    build_processor(tok, preset).save_pretrained(out)
    (out / "chat_template.jinja").write_text(GEMMA3_CHAT_TEMPLATE)
    return out
