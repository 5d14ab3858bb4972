"""Torch-free helpers the family adapters share: chat-template rendering, placeholder expansion,
tokenization into a NativeLayout, and the compact position scheme of the LLaVA families.

What a family provides is typed in coverpruner.families.contract (Family, FamilyRuntime).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coverpruner.families.contract import NativeLayout

PROMPT_SENTINEL = "\u2063COVERPRUNER_PROMPT\u2063"  # invisible separator chars: never in real prompts


@dataclass(frozen=True)
class RenderedPrompt:
    """Chat-template output with image placeholders already expanded.

    text: the full prompt string fed to the tokenizer.
    prompt_span: [start, end) character span of the user's prompt text inside `text`.
    """

    text: str
    prompt_span: tuple[int, int]



def render_chat_template(chat_template: str, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """Render an HF chat template with jinja2 the way transformers does (trim/lstrip blocks, sandbox).

    The `{% generation %}` block tag (transformers' assistant-mask extension) is accepted and renders
    its body unchanged, so llava-hf templates work without transformers.
    """
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _Generation(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    def _raise(message):
        raise ValueError(f"chat template raised: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[_Generation,
                                                                                       "jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = _raise
    return env.from_string(chat_template).render(messages=messages, add_generation_prompt=add_generation_prompt)


def instruction_positions_from_offsets(offsets: list[tuple[int, int]], span: tuple[int, int]) -> np.ndarray:
    """Indices of tokens whose non-empty character span [a, b) overlaps `span` (design rule). int64 [T]."""
    start, end = span
    hits = [i for i, (a, b) in enumerate(offsets) if b > a and a < end and b > start]
    return np.asarray(hits, dtype=np.int64)


def render_image_prompt(chat_template: str, prompt: str, image_token: str, num_image_rows: int) -> RenderedPrompt:
    """Apply the chat template to one user turn (image, then text) and expand the image token to
    ``num_image_rows`` copies, as the HF processors do before tokenizing.

    Returns the text the tokenizer sees and the character span of ``prompt`` inside it. ValueError (one
    line) when the prompt holds the image token or the template does not render each exactly once.
    """
    if image_token in prompt:
        raise ValueError(f"the prompt must not contain the image token {image_token!r}; the image is "
                         "placed by the chat template")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT_SENTINEL}]}]
    text = render_chat_template(chat_template, messages, add_generation_prompt=True)
    if text.count(PROMPT_SENTINEL) != 1 or text.count(image_token) != 1:
        raise ValueError("chat template must render the prompt and the image placeholder exactly once; got "
                         f"{text!r}")
    text = text.replace(image_token, image_token * num_image_rows)
    start = text.index(PROMPT_SENTINEL)
    return RenderedPrompt(text.replace(PROMPT_SENTINEL, prompt), (start, start + len(prompt)))


def tokenize_layout(tokenizer, rendered: RenderedPrompt, image_token_id: int, num_image_rows: int) -> NativeLayout:
    """Tokenize ``rendered`` with a `tokenizers.Tokenizer` (BOS from its post-processor, as HF does).

    visual_positions: the image-token ids' indices (must be ``num_image_rows`` of them); instruction
    positions: tokens whose non-empty offsets overlap the prompt span, image tokens excluded. ValueError
    (one line) on a count mismatch or an empty instruction.
    """
    enc = tokenizer.encode(rendered.text)
    ids = np.asarray(enc.ids, dtype=np.int64)
    visual = np.flatnonzero(ids == image_token_id).astype(np.int64)
    if visual.size != num_image_rows:
        raise ValueError(f"tokenized prompt has {visual.size} image tokens (id {image_token_id}), expected "
                         f"{num_image_rows}")
    instr = instruction_positions_from_offsets(enc.offsets, rendered.prompt_span)
    instr = instr[~np.isin(instr, visual)]
    if instr.size == 0:
        raise ValueError("the prompt produced no instruction tokens (empty prompt?)")
    return NativeLayout(ids, visual, instr, rendered.text)


class CompactPositions:
    """Position scheme of the LLaVA families (rank 1): native 0..L-1; a pruned sequence is re-packed
    0..L'-1; the t-th generated token sits at L' + t."""

    position_rank = 1

    def native_positions(self, layout: NativeLayout, vision=None) -> np.ndarray:
        """int64 [1, L] = 0..L-1."""
        return np.arange(len(layout.input_ids), dtype=np.int64)[None, :]

    def pruned_positions(self, native: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """int64 [1, L'] = 0..L'-1 for the L' kept rows."""
        return np.arange(len(rows), dtype=np.int64)[None, :]

    def decode_position(self, native: np.ndarray, pruned: np.ndarray, step: int) -> np.ndarray:
        """int64 [1] = L' + step."""
        return np.array([pruned.shape[1] + step], dtype=np.int64)


def text_dims(text_config) -> dict:
    """The decoder dims every family records in the manifest, from an HF text config (attributes only)."""
    t = text_config
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    return {
        "hidden_size": t.hidden_size, "num_layers": t.num_hidden_layers, "num_heads": t.num_attention_heads,
        "num_kv_heads": t.num_key_value_heads, "head_dim": head_dim, "vocab_size": t.vocab_size,
        "max_position_embeddings": t.max_position_embeddings,
    }
