"""Constrained decoding: OpenAI's ``response_format`` (json_object, json_schema) as token masks from llguidance.

    GrammarCompiler(tokenizer, vocab_size, eos_ids)    one per Pipeline; the llguidance tokenizer bridge is built
                                                       on first use and shared by every Pipeline of the process
    compiler.compile(response_format) -> Grammar | None   checked once per request (OptionError, param
                                                          "response_format", for a bad format or schema)
    GrammarMatcher(grammar)                             one per running request (its parser state)
    start_masks(matchers) -> PendingMasks               the next token's allowed ids of every constrained request,
                                                        computed in a background thread while the decoder runs

The engine loop (runtime/engine.py) starts the masks of its constrained requests before its one decoder call and
reads them when it samples (runtime/sampling.Sampler's ``allowed``): llguidance computes a mask with the GIL
released, so it overlaps the decoder's own (GIL-free) ONNX Runtime call instead of adding to the step. A mask
applies to greedy and sampled decoding alike (disallowed logits are -inf before any choice); once the grammar is
complete (llguidance: the matcher is stopped, nothing but EOS may follow) the answer ends with finish_reason
"grammar"; a max_new_tokens limit reached first ends it with "length" (the text is then an unfinished JSON prefix).

llguidance is the ``serve`` extra's dependency, imported here lazily: without it a response_format is refused in one
line and everything else works.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from coverpruner.runtime.errors import OptionError

#: separators of the JSON the grammar allows (OpenAI's own spacing); no free whitespace: a random or weak model
#: otherwise fills its token budget with newlines between the keys
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_PARAM = "response_format"
_CACHED_GRAMMARS = 64

_bridges: dict[tuple, object] = {}
_bridges_lock = threading.Lock()


@dataclass(frozen=True)
class Grammar:
    """A checked grammar of one request: ``kind`` ("json_object" / "json_schema"), ``text`` (llguidance's grammar
    definition, a JSON string), ``tokenizer`` (the llguidance.LLTokenizer it was checked with), ``vocab_size`` V
    (the decoder's logits width; masks are bool [V])."""

    kind: str
    text: str
    tokenizer: object
    vocab_size: int


def _llguidance():
    try:
        import llguidance
    except ImportError:
        raise OptionError("response_format needs the grammar library llguidance (pip install 'coverpruner[serve]')",
                          param=_PARAM) from None
    return llguidance


def llguidance_tokenizer(tokenizer, vocab_size: int, eos_ids) -> object:
    """The llguidance.LLTokenizer of a ``tokenizers.Tokenizer`` (built once per process per tokenizer: ~0.1-1 s
    for a 150k vocabulary). Byte-level BPE and byte-fallback tokenizers go through llguidance's own reader of
    tokenizer.json; a Metaspace tokenizer without byte fallback (which llguidance does not read) through a
    TokenizerWrapper of each token's bytes ("▁" read as a space)."""
    llg = _llguidance()
    spec = tokenizer.to_str()
    eos = sorted(int(e) for e in eos_ids)
    key = (hashlib.sha256(spec.encode()).hexdigest(), int(vocab_size), tuple(eos))
    with _bridges_lock:
        if key not in _bridges:
            try:
                _bridges[key] = llg.LLTokenizer(spec, n_vocab=int(vocab_size), eos_token=eos)
            except ValueError:  # "can't determine decoder type": e.g. the test tokenizer's plain Metaspace
                _bridges[key] = llg.LLTokenizer(llg.TokenizerWrapper(_MetaspaceTokens(tokenizer, spec, eos,
                                                                                      int(vocab_size))),
                                                n_vocab=int(vocab_size), eos_token=eos)
        return _bridges[key]


class _MetaspaceTokens:
    """What llguidance.TokenizerWrapper reads of a Metaspace tokenizer: each id's bytes (special tokens prefixed
    with 0xff, llguidance's mark; empty for the logits' rows past the tokenizer, up to vocab_size), and a call that tokenizes bytes without Metaspace's leading "▁" (llguidance
    tokenizes text that continues a sequence: a prepended space would turn "ind" into " in" + "d")."""

    def __init__(self, tokenizer, spec: str, eos: list[int], vocab_size: int):
        from tokenizers import Tokenizer

        special = {i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
        self.tokens = []
        for i in range(tokenizer.get_vocab_size(with_added_tokens=True)):
            piece = tokenizer.id_to_token(i) or ""
            self.tokens.append(b"\xff" + piece.encode() if i in special else _piece_bytes(piece))
        self.tokens += [b""] * (vocab_size - len(self.tokens))  # the decoder's rows past the tokenizer: never allowed
        self.special_token_ids = sorted(special)
        self.eos_token_id, self.bos_token_id = eos[0], None
        raw = json.loads(spec)
        _never_prepend(raw)
        self._plain = Tokenizer.from_str(json.dumps(raw))

    def __call__(self, text) -> list[int]:
        text = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
        return self._plain.encode(text, add_special_tokens=False).ids


def _piece_bytes(piece: str) -> bytes:
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):  # a byte-fallback piece
        return bytes([int(piece[3:5], 16)])
    return piece.replace("\u2581", " ").encode()


def _never_prepend(node) -> None:
    if isinstance(node, dict):
        if node.get("type") == "Metaspace":
            node["prepend_scheme"] = "never"
        for value in node.values():
            _never_prepend(value)
    elif isinstance(node, list):
        for value in node:
            _never_prepend(value)


def _schema_of(response_format) -> tuple[str, dict] | None:
    """OpenAI's response_format -> (kind, JSON schema) or None for {"type": "text"}; OptionError naming the
    sub-field otherwise."""
    if not isinstance(response_format, Mapping):
        raise OptionError(f"response_format must be an object with a 'type', got {response_format!r}", param=_PARAM)
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return kind, {"type": "object"}
    if kind != "json_schema":
        raise OptionError(f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}",
                          param=_PARAM)
    spec = response_format.get("json_schema")
    if not isinstance(spec, Mapping) or not isinstance(spec.get("schema"), Mapping):
        raise OptionError("response_format.json_schema must be an object with a 'schema' object (and a 'name')",
                          param=_PARAM)
    return kind, dict(spec["schema"])


class GrammarCompiler:
    """Compiles and checks response formats against one tokenizer; the last _CACHED_GRAMMARS checked grammars are
    kept (a request is checked at the server and again in its worker)."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids):
        self._tokenizer, self.vocab_size, self._eos = tokenizer, int(vocab_size), sorted(eos_ids)
        self._bridge = None
        self._cache: OrderedDict[str, Grammar] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def bridge(self):
        if self._bridge is None:
            self._bridge = llguidance_tokenizer(self._tokenizer, self.vocab_size, self._eos)
        return self._bridge

    def compile(self, response_format) -> Grammar | None:
        """response_format (OpenAI's object, or None) -> its Grammar, None for none / {"type": "text"}.
        OptionError (param "response_format", one line with llguidance's reason) for a malformed format or a
        schema llguidance cannot compile."""
        if response_format is None:
            return None
        found = _schema_of(response_format)
        if found is None:
            return None
        kind, schema = found
        try:
            key = kind + json.dumps(schema, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise OptionError(f"response_format schema is not JSON: {exc}", param=_PARAM) from None
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        llg = _llguidance()
        try:
            text = llg.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        except ValueError as exc:
            raise OptionError(f"response_format schema: {_first_line(exc)}", param=_PARAM) from None
        is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(text, self.bridge)
        if is_error:
            raise OptionError(f"response_format schema is not supported: {_first_line(messages[0])}", param=_PARAM)
        grammar = Grammar(kind, text, self.bridge, self.vocab_size)
        with self._lock:
            self._cache[key] = grammar
            while len(self._cache) > _CACHED_GRAMMARS:
                self._cache.popitem(last=False)
        return grammar


def _first_line(value) -> str:
    return str(value).strip().splitlines()[0] if str(value).strip() else type(value).__name__


class GrammarMatcher:
    """One request's parser state over its Grammar (llguidance.LLMatcher)."""

    def __init__(self, grammar: Grammar):
        llg = _llguidance()
        self.grammar = grammar
        self.matcher = llg.LLMatcher(grammar.tokenizer, grammar.text, log_level=0)
        if self.matcher.is_error():  # checked at compile time: only a limit hit here
            raise OptionError(f"response_format: {_first_line(self.matcher.get_error())}", param=_PARAM)

    def advance(self, token: int) -> None:
        """Consume the sampled token; OptionError if the grammar refuses it (never after a mask from this
        matcher: a refusal means the parser hit one of llguidance's limits)."""
        if not self.matcher.consume_token(int(token)):
            raise OptionError(f"response_format: generation left the grammar: "
                              f"{_first_line(self.matcher.get_error())}", param=_PARAM)

    @property
    def done(self) -> bool:
        """The grammar is complete: nothing but EOS may follow."""
        return self.matcher.is_stopped()


class PendingMasks:
    """The masks of one step, being computed: ``allowed(i)`` -> bool [V] of the i-th matcher given to start."""

    def __init__(self, future, bits: np.ndarray, vocab_size: int):
        self._future, self._bits, self._v = future, bits, vocab_size
        self._allowed = None

    def allowed(self, i: int) -> np.ndarray:
        if self._allowed is None:
            self._future.result()
            self._allowed = np.unpackbits(self._bits.view(np.uint8), axis=1, bitorder="little")[:, :self._v] \
                .astype(bool)
        return self._allowed[i]


#: one background thread (created on first use, shared by every engine of the process) that computes the masks of
#: a step with ONE call into llguidance (LLExecutor, one Rust thread): the call holds no GIL, so it overlaps the
#: decoder call; per-matcher calls from Python would hand the GIL back and forth (a 5 ms switch interval each)
_pool: ThreadPoolExecutor | None = None
_executor = None


def start_masks(matchers: list[GrammarMatcher]) -> PendingMasks | None:
    """Start computing the next token's mask of every matcher (all over one tokenizer) in the background thread;
    None for none."""
    global _pool, _executor
    if not matchers:
        return None
    llg = _llguidance()
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask_par

    with _bridges_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")
            _executor = llg.LLExecutor(num_threads=1)
    v = matchers[0].grammar.vocab_size
    bits = allocate_token_bitmask(len(matchers), v)
    pairs = [(m.matcher, i) for i, m in enumerate(matchers)]
    return PendingMasks(_pool.submit(fill_next_token_bitmask_par, _executor, pairs, bits), bits, v)
