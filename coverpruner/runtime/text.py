"""Conversation -> token ids (the family's ConversationLayout), and generated ids -> text.

Rendering the manifest's chat template (jinja2), expanding the image placeholder and locating the
instruction tokens are the model family's layout rules (``coverpruner.families``, torch-free);
this module loads tokenizer.json with ``tokenizers``, applies those rules, turns their failures into
one-line PromptError/ManifestError, and detokenizes incrementally for streaming.

Instruction positions (design note): the tokens whose non-empty character span (tokenizer
offsets) overlaps the span of a message's text parts inside the rendered chat template.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from coverpruner.runtime.errors import ManifestError, PromptError


class PromptEncoder:
    """Tokenizer + the family's layout rules for one engine dir.

    The layout rules (chat template, how the template places the image, how the placeholder expands, which
    tokens are the instruction) belong to the model family: ``family`` is its run-time object
    (``Family.runtime(manifest)``, torch-free). This class owns the tokenizer, error reporting and decoding.
    tokenizer_path: tokenizer.json. image_token_id: placeholder id (checked against the vocabulary).
    """

    def __init__(self, tokenizer_path: Path, image_token_id: int, family):
        tokenizer_path = Path(tokenizer_path)
        if not tokenizer_path.is_file():
            raise ManifestError(f"tokenizer file not found: {tokenizer_path}")
        try:
            self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        except Exception as exc:
            raise ManifestError(f"{tokenizer_path}: cannot load tokenizer ({exc})") from None
        #: the most UTF-8 bytes of prompt text one token can stand for (bounds the token count from below)
        self.max_token_bytes = max((len(t.encode("utf-8", "surrogatepass")) for t in self.tokenizer.get_vocab()),
                                   default=1)
        self.image_token_id = int(image_token_id)
        if self.tokenizer.id_to_token(self.image_token_id) is None:
            raise ManifestError(f"{tokenizer_path}: image_token_id {image_token_id} is not in the vocabulary")
        self.family = family

    def fits(self, prompt: str, max_tokens: int) -> bool:
        """False when ``prompt`` certainly needs more than ``max_tokens`` tokens, known without tokenizing: no
        token stands for more than max_token_bytes bytes of text (its vocabulary string, whose byte-level or
        '▁' spelling is never shorter than the text it covers; x4 leaves room for normalizers that shorten text,
        e.g. NFKC's ligatures). Tokenizing megabytes took seconds with the GIL held."""
        return len(prompt) <= 4 * self.max_token_bytes * max_tokens

    def encode_conversation(self, messages: list[dict], rows_per_image: list[int], media: list[dict] | None = None,
                            tools=(), template_kwargs: dict | None = None):
        """Lay out normalised messages (runtime.messages) with the j-th image placeholder expanded to
        ``rows_per_image[j]`` tokens -> the family's ConversationLayout. media: each image's / video's
        VisionInputs.facts (a family's placeholder text may depend on them: Qwen3-VL's video timestamps); tools and
        template_kwargs: the template's variables (given to the family only when the request has them)."""
        try:
            rows = [int(r) for r in rows_per_image]
            extra = {k: v for k, v in (("tools", list(tools)), ("template_kwargs", template_kwargs)) if v}
            if media is None:
                return self.family.conversation_layout(self.tokenizer, messages, rows, **extra)
            return self.family.conversation_layout(self.tokenizer, messages, rows, media=list(media), **extra)
        except ValueError as exc:
            raise PromptError(str(exc).splitlines()[0]) from None
        except Exception as exc:  # jinja2 errors from a broken template in the manifest
            raise ManifestError(f"manifest chat_template failed to render: {exc}") from None

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
