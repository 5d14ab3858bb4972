"""A request's answers as the handlers read them: n choices (OpenAI's ``n``), each with its text pieces, its
per-token logprobs and its end, whichever endpoint formats them (chat completions, completions, responses).

The worker pool emits ``Piece`` / ``Finished`` values (serving.workers.Job); ``items`` turns one of a job's events
into per-choice ``Delta`` / ``End`` items (stop strings were applied where the answers decode: the engine loop,
runtime/stop.py), and the ``*_logprobs`` helpers give OpenAI's two logprob shapes: chat's ``{"content": [{token,
logprob, bytes, top_logprobs}]}`` and the legacy completions' ``{tokens, token_logprobs, top_logprobs,
text_offset}``.

A token's ``bytes`` are its own bytes (TokenText: byte-level BPE's character <-> byte table, Metaspace's word-start
mark as a space) and its string their UTF-8 decoding; a token that holds part of a character is written
``bytes:\\xNN..`` as OpenAI does.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple

from coverpruner.runtime.logprobs import TokenLogprob
from coverpruner.serving.json_body import RawJSON


class Piece(NamedTuple):
    """New text of choice ``index`` (may be "") and the TokenLogprob of the token that produced it (or None)."""

    text: str
    index: int = 0
    logprob: TokenLogprob | None = None


class Finished(NamedTuple):
    """Choice ``index`` ended with its GenerationResult."""

    index: int
    result: object


@dataclass
class Delta:
    """What one event added to choice ``index``: text and logprobs of its tokens."""

    index: int
    text: str = ""
    logprobs: list = field(default_factory=list)


@dataclass
class End:
    """Choice ``index`` ended: its GenerationResult (finish_reason "stop" when a stop string or stop id ended it)."""

    index: int
    result: object


def items(kind: str, value) -> list:
    """One job event ("piece" Piece, "finish" / "done" Finished) -> [Delta] / [End]; [] for a piece that carries
    neither text nor a logprob."""
    if kind == "piece":
        if not value.text and value.logprob is None:
            return []
        return [Delta(value.index, value.text, [value.logprob] if value.logprob is not None else [])]
    return [End(value.index, value.result)]


# -- token strings ----------------------------------------------------------------------------------

def _byte_chars() -> dict[str, int]:
    """The byte-level BPE alphabet: each byte 0..255 as the printable character that stands for it (printable
    Latin-1 bytes as themselves, the others shifted past 255 in order)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


class TokenText:
    """token id -> (string, bytes as a list of ints) for logprob entries (module docstring). The bytes are the
    token's own: byte-level BPE vocabularies map each character back to its byte; Metaspace (sentencepiece-style)
    vocabularies write a space for the word-start mark and ``<0xNN>`` byte-fallback tokens are that byte; other
    tokenizers give the UTF-8 of the id decoded alone. So an answer's token bytes joined are its text (up to the
    space a Metaspace decoder drops before the first word)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        spec = tokenizer.to_str() if hasattr(tokenizer, "to_str") else ""
        self._byte_level = '"ByteLevel"' in spec
        self._metaspace = '"Metaspace"' in spec
        self._chars = _byte_chars()
        self.of = lru_cache(maxsize=65536)(self._of)
        self.json = lru_cache(maxsize=65536)(self._json)

    def _raw(self, tid: int) -> bytes:
        piece = self.tokenizer.id_to_token(int(tid)) or ""
        if self._byte_level and piece and all(c in self._chars for c in piece):
            return bytes(self._chars[c] for c in piece)
        if self._metaspace and piece:
            if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                try:
                    return bytes([int(piece[3:5], 16)])
                except ValueError:
                    pass
            return piece.replace("\u2581", " ").encode("utf-8")
        return self.tokenizer.decode([int(tid)], skip_special_tokens=False).encode("utf-8")

    def _of(self, tid: int) -> tuple[str, list[int]]:
        raw = self._raw(tid)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:  # part of a character: OpenAI writes the bytes
            text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
        return text, list(raw)

    def _json(self, tid: int) -> tuple[str, str]:
        """(string, bytes) of ``of(tid)`` as compact JSON texts (chat_logprobs_json)."""
        token, raw = self.of(tid)
        return json.dumps(token, ensure_ascii=False), "[" + ",".join(map(str, raw)) + "]"


def chat_logprobs(entries: list[TokenLogprob], text: TokenText) -> dict:
    """Chat completions' choice.logprobs: {"content": [{token, logprob, bytes, top_logprobs: [...]}],
    "refusal": None}."""
    def one(tid: int, lp: float) -> dict:
        token, raw = text.of(tid)
        return {"token": token, "logprob": lp, "bytes": raw}

    return {"content": [{**one(e.token, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]}
                        for e in entries], "refusal": None}


def _number(x: float) -> str:
    """A float as json.dumps writes it (float.__repr__); ValueError for NaN / infinity, as its allow_nan=False."""
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"Out of range float values are not JSON compliant: {x!r}")
    return float.__repr__(x)


def chat_logprobs_json(entries: list[TokenLogprob], text: TokenText) -> RawJSON:
    """chat_logprobs(entries, text) as compact JSON text (what json_body.dumps writes for it), built as strings:
    no dict or list per entry. Issue 40: 8 answers of 2,000 tokens with 20 alternatives built 336,000 dicts, and
    the garbage collector's full passes over them (~0.1 s each, holding the GIL) stalled the event loop while the
    body was built in a worker thread."""
    def one(tid: int, lp: float) -> str:
        token, raw = text.json(tid)
        return f'{{"token":{token},"logprob":{_number(lp)},"bytes":{raw}'

    pieces = [one(e.token, e.logprob) + ',"top_logprobs":[' + ",".join(one(t, lp) + "}" for t, lp in e.top) + "]}"
              for e in entries]
    return RawJSON('{"content":[' + ",".join(pieces) + '],"refusal":null}')


def legacy_logprobs(entries: list[TokenLogprob], text: TokenText, offset: int = 0) -> dict:
    """The completions API's choice.logprobs: tokens, token_logprobs, top_logprobs ([{token: logprob}]) and
    text_offset (each token's first character in the answer: the running length of the token strings, from
    ``offset``)."""
    tokens, offsets = [], []
    for e in entries:
        offsets.append(offset)
        token = text.of(e.token)[0]
        tokens.append(token)
        offset += len(token)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{text.of(t)[0]: lp for t, lp in e.top} for e in entries], "text_offset": offsets}
