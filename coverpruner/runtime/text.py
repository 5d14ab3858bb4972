"""Prompt -> token ids, and generated ids -> text.

Rendering the manifest's chat template (jinja2), expanding the image placeholder and locating the
instruction tokens are the model family's layout rules (``coverpruner.families``, torch-free);
this module loads tokenizer.json with ``tokenizers``, applies those rules, turns their failures into
one-line PromptError/ManifestError, and detokenizes incrementally for streaming.

Instruction positions (design note): the tokens whose non-empty character span (tokenizer
offsets) overlaps the span of the user's prompt text inside the rendered chat template.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from coverpruner.runtime.errors import ManifestError, PromptError


@dataclass(frozen=True)
class EncodedPrompt:
    """The native (unpruned) token sequence of one request.

    input_ids: int64 [L], image placeholders expanded to ``n`` image-token ids.
    visual_positions: int64 [n], where the image tokens sit in input_ids.
    instruction_positions: int64 [T], tokens overlapping the user's prompt text.
    text: the rendered chat template with the placeholders expanded.
    """

    input_ids: np.ndarray
    visual_positions: np.ndarray
    instruction_positions: np.ndarray
    text: str


class PromptEncoder:
    """Chat template + tokenizer for one engine dir.

    The layout rules (how the template places the image, how the placeholder expands, which tokens
    are the instruction) belong to the model family: ``family`` is its adapter from
    ``coverpruner.families.get_family`` (torch-free at run time). This class owns the tokenizer,
    error reporting and decoding.
    tokenizer_path: tokenizer.json. image_token_id: placeholder id. num_visual_tokens: n per image.
    """

    def __init__(self, tokenizer_path: Path, chat_template: str, image_token_id: int, num_visual_tokens: int,
                 family):
        tokenizer_path = Path(tokenizer_path)
        if not tokenizer_path.is_file():
            raise ManifestError(f"tokenizer file not found: {tokenizer_path}")
        try:
            self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        except Exception as exc:
            raise ManifestError(f"{tokenizer_path}: cannot load tokenizer ({exc})") from None
        self.chat_template = chat_template
        self.image_token_id = int(image_token_id)
        if self.tokenizer.id_to_token(self.image_token_id) is None:
            raise ManifestError(f"{tokenizer_path}: image_token_id {image_token_id} is not in the vocabulary")
        self.num_visual_tokens = int(num_visual_tokens)
        self.family = family

    def encode(self, prompt: str) -> EncodedPrompt:
        """Render the chat template around ``prompt``, tokenize, and locate visual / instruction tokens."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise PromptError("prompt is empty")
        try:
            rendered = self.family.render_prompt(self.chat_template, prompt, self.num_visual_tokens)
            layout = self.family.native_layout(self.tokenizer, rendered, self.image_token_id, self.num_visual_tokens)
        except ValueError as exc:  # the adapter's layout rules reject the prompt
            raise PromptError(str(exc).splitlines()[0]) from None
        except Exception as exc:  # jinja2 errors from a broken template in the manifest
            raise ManifestError(f"manifest chat_template failed to render: {exc}") from None
        return EncodedPrompt(layout.input_ids, layout.visual_positions, layout.instruction_positions, rendered.text)

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
