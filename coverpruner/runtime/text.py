"""Prompt -> token ids: chat template (jinja2), tokenization (``tokenizers``), image-token
expansion and the instruction positions the probe reads.

Instruction positions (design note): the tokens whose non-empty character span (tokenizer
offsets) overlaps the span of the user's prompt text inside the rendered chat template.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from coverpruner.runtime.errors import ManifestError, PromptError

# A marker the user cannot plausibly type; used to locate the prompt inside the rendered template.
_SENTINEL = "\x00coverpruner-prompt\x00"


class _GenerationTag(Extension):
    """``{% generation %}...{% endgeneration %}`` (HF assistant-mask marker): render the body as is."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _raise(msg):
    raise PromptError(f"chat template: {msg}")


def compile_template(source: str):
    """A jinja2 template with the environment HF chat templates expect (sandboxed, trim/lstrip)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = _raise
    try:
        return env.from_string(source)
    except Exception as exc:
        raise ManifestError(f"manifest chat_template does not compile: {exc}") from None


def user_messages(prompt: str, num_images: int = 1) -> list[dict]:
    """HF-style messages: one user turn with the image(s) first, then the text."""
    return [{"role": "user", "content": [{"type": "image"}] * num_images + [{"type": "text", "text": prompt}]}]


@dataclass(frozen=True)
class EncodedPrompt:
    """The native (unpruned) token sequence of one request.

    input_ids: int64 [L], image placeholders expanded to ``n`` image-token ids.
    visual_positions: int64 [n], where the image tokens sit in input_ids.
    instruction_positions: int64 [T], tokens overlapping the user's prompt text.
    text: the rendered chat template (one image placeholder, not expanded).
    """

    input_ids: np.ndarray
    visual_positions: np.ndarray
    instruction_positions: np.ndarray
    text: str


class PromptEncoder:
    """Chat template + tokenizer for one engine dir.

    tokenizer_path: tokenizer.json. image_token_id: id of the image placeholder token.
    num_visual_tokens: n, how many image tokens one image expands to.
    """

    def __init__(self, tokenizer_path: Path, chat_template: str, image_token_id: int, num_visual_tokens: int,
                 special_tokens: dict | None = None):
        tokenizer_path = Path(tokenizer_path)
        if not tokenizer_path.is_file():
            raise ManifestError(f"tokenizer file not found: {tokenizer_path}")
        try:
            self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        except Exception as exc:
            raise ManifestError(f"{tokenizer_path}: cannot load tokenizer ({exc})") from None
        self.template = compile_template(chat_template)
        self.image_token_id = int(image_token_id)
        self.image_token = self.tokenizer.id_to_token(self.image_token_id)
        if self.image_token is None:
            raise ManifestError(f"{tokenizer_path}: image_token_id {image_token_id} is not in the vocabulary")
        self.num_visual_tokens = int(num_visual_tokens)
        self.special_tokens = dict(special_tokens or {})

    def render(self, prompt: str) -> tuple[str, tuple[int, int]]:
        """Rendered chat text and the (start, end) character span of ``prompt`` inside it."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise PromptError("prompt is empty")
        if self.image_token in prompt:
            raise PromptError(f"prompt contains the image placeholder {self.image_token!r}; pass the image separately")
        kw = dict(add_generation_prompt=True, **self.special_tokens)
        marked = self.template.render(messages=user_messages(_SENTINEL), **kw)
        text = self.template.render(messages=user_messages(prompt), **kw)
        if marked.count(_SENTINEL) != 1:
            raise PromptError("chat template does not place the user's text exactly once")
        start = marked.index(_SENTINEL)
        tail = len(marked) - start - len(_SENTINEL)
        if text[:start] != marked[:start] or text[len(text) - tail:] != marked[len(marked) - tail:]:
            raise PromptError("chat template changes the text around the prompt; cannot locate the prompt span")
        return text, (start, len(text) - tail)

    def encode(self, prompt: str) -> EncodedPrompt:
        """Render, tokenize (special tokens added as the tokenizer's post-processor says), expand."""
        text, (p0, p1) = self.render(prompt)
        enc = self.tokenizer.encode(text, add_special_tokens=True)
        ids = np.asarray(enc.ids, dtype=np.int64)
        is_image = ids == self.image_token_id
        if int(is_image.sum()) != 1:
            raise PromptError(f"rendered prompt holds {int(is_image.sum())} image placeholders, expected 1")
        overlap = np.array([e > s and s < p1 and e > p0 for s, e in enc.offsets], dtype=bool) & ~is_image
        # Expand the one placeholder to n image tokens; later indices shift by n - 1.
        at = int(np.flatnonzero(is_image)[0])
        n = self.num_visual_tokens
        expanded = np.concatenate([ids[:at], np.full(n, self.image_token_id, np.int64), ids[at + 1:]])
        instr = np.flatnonzero(overlap)
        instr = np.where(instr > at, instr + n - 1, instr).astype(np.int64)
        if instr.size == 0:
            raise PromptError("no prompt token found inside the rendered chat template")
        return EncodedPrompt(expanded, np.arange(at, at + n, dtype=np.int64), instr, text)

    def decode(self, ids) -> str:
        """Token ids -> text, skipping special tokens."""
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)


class StreamDecoder:
    """Incremental detokenizer: ``push(id)`` returns the newly completed text (maybe "").

    Decodes the whole generated sequence each step (sentencepiece-style decoders strip or merge
    spaces depending on context, so pieces decoded alone are wrong) and holds back text that
    ends in U+FFFD, an incomplete multi-byte character that the next token completes.
    """

    def __init__(self, encoder: PromptEncoder):
        self.encoder = encoder
        self.ids: list[int] = []
        self.emitted = ""

    def push(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        text = self.encoder.decode(self.ids)
        if text.endswith("\ufffd") or not text.startswith(self.emitted):
            return ""
        piece, self.emitted = text[len(self.emitted):], text
        return piece

    def flush(self) -> str:
        text = self.encoder.decode(self.ids)
        piece = text[len(self.emitted):] if text.startswith(self.emitted) else ""
        self.emitted = text
        return piece
