"""Constrained decoding: OpenAI's ``response_format`` (json_object, json_schema) as token masks from llguidance.

    GrammarCompiler(tokenizer, vocab_size, eos_ids)    one per Pipeline; the llguidance tokenizer bridge is built
                                                       on first use and shared by every Pipeline of the process
    compiler.compile(response_format) -> Grammar | None   checked once per distinct schema (OptionError, param
                                                          "response_format", for a bad format or schema)
    GrammarMatcher(grammar)                             one per running answer (its parser state and CPU budget)
    start_masks(matchers) -> PendingMasks               the next token's allowed ids of every constrained request,
                                                        computed in a background thread while the decoder runs

The engine loop (runtime/engine.py) starts the masks of its constrained requests before its one decoder call and
reads them when it samples (runtime/sampling.Sampler's ``allowed``): llguidance computes a mask with the GIL
released, so it overlaps the decoder's own (GIL-free) ONNX Runtime call instead of adding to the step. A mask
applies to greedy and sampled decoding alike (disallowed logits are -inf before any choice); once the grammar is
complete (llguidance: the matcher is stopped, nothing but EOS may follow) the answer ends with finish_reason
"grammar"; a max_new_tokens limit reached first ends it with "length" (the text is then an unfinished JSON prefix).

What a client can make a grammar cost is bounded (issue 40), each limit checked before the work it guards:
- size: a schema of more than MAX_SCHEMA_NODES values or MAX_SCHEMA_CHARS characters is refused by a walk that
  stops at the limit, before it is serialized or converted (check_schema_size);
- compile: once per distinct schema in the process (a cache keyed by the SHA-256 of its canonical JSON; a refusal
  is cached too, and a second request for a schema being compiled waits for that compile); the compile builds the
  grammar's matcher and times its first mask: a schema that admits no document ({"$ref": "#"}, $ref cycles: the
  matcher fails at once) or whose first mask takes more than FIRST_MASK_S is refused at admission;
- per token: each answer's matcher is a copy of the compiled one and carries a MaskBudget (CPU seconds of its masks and
  tokens against MASK_START_S + max(MASK_FLOOR_S, MASK_STEP_FACTOR x the step's own CPU time) per token); over it, or
  at one of llguidance's own limits mid-answer, that answer alone fails with OptionError code "grammar_too_complex"
  (400), raised where the engine reads its mask, so its neighbours in the batch go on. A mask runs beside its step's
  decoder call, but on a machine whose cores are all busy its CPU time is the step's too: the budget bounds what it
  adds to a neighbour's step to MASK_STEP_FACTOR of it (a neighbour's answer takes at most 1 + MASK_STEP_FACTOR
  times its time alone, plus MASK_START_S per constrained request beside it).

llguidance is the ``serve`` extra's dependency, imported here lazily: without it a response_format is refused in one
line and everything else works.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from coverpruner.integers import brief
from coverpruner.runtime.errors import OptionError

#: separators of the JSON the grammar allows (OpenAI's own spacing); no free whitespace: a random or weak model
#: otherwise fills its token budget with newlines between the keys
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_PARAM = "response_format"
#: the error code of a schema over a limit below (coverpruner.errors.CODES; a 400 naming response_format / the tool)
TOO_COMPLEX = "grammar_too_complex"

# -- limits (docs/serving.md "Structured output limits"): each bounds work a client could otherwise ask for ---------
#: JSON values (objects, arrays, scalars) of one schema: llguidance's compile grows faster than linearly with a
#: schema's size (2,000 optional properties ~0.1 s to check + ~0.6 s to build its matcher, 10,000: 2.3 s + 6.6 s)
MAX_SCHEMA_NODES = 4096
#: characters of one schema's keys and strings (names, descriptions, enum / const values, patterns): a 100 KB const
#: took 0.2-0.4 s for its first mask, part of it holding the GIL
MAX_SCHEMA_CHARS = 65_536
#: seconds a grammar may spend on its first token's mask (wall time, measured when it is compiled, where the lexer
#: is built: a longer one is refused at admission; a JSON schema's masks take ~0.05-1 ms)
FIRST_MASK_S = 0.050
#: CPU seconds an answer's grammar starts with (MaskBudget): its matcher is a copy of the compiled one, whose lexer
#: the first mask already built, so this is room for the states its own answer reaches
MASK_START_S = 0.020
#: CPU seconds per token a grammar may always spend on masks and tokens, whatever the decoder's speed (MaskBudget:
#: the allowance per token is the larger of this and MASK_STEP_FACTOR x the step's CPU time; a tiny test model's
#: step is ~0.4 ms)
MASK_FLOOR_S = 0.00025
#: a grammar's masks may cost this fraction of the CPU time of the steps they run beside (MaskBudget.grant).
#: Issue 40: the allowance was the step's wall time, which a mask competing for the cores stretches itself: a 10 KB
#: const's ~3 ms masks stretched a 0.5 ms step to 5 ms, were always within that, and its neighbour took 2.3x its
#: time alone; counted in CPU time of the engine's thread, a busy machine stretches neither side
MASK_STEP_FACTOR = 0.5
#: the lexer states one grammar may build (llguidance's default 250,000 at ~1-2 KB each: up to ~0.5 GB)
MAX_LEXER_STATES = 65_536
#: Earley items one mask may create (llguidance's default 50,000): a JSON schema's step uses hundreds; a schema that
#: recurses into itself without end ({"required": ["a"], "properties": {"a": {"$ref": "#"}}}) reached the default in
#: 380 ms, and that part of llguidance's mask holds the GIL (the event loop waited); at 5,000 it stops in ~10 ms
STEP_MAX_ITEMS = 5000
#: distinct schemas whose compiled grammar (or refusal) is kept
CACHED_GRAMMARS = 64

_bridges: dict[tuple, object] = {}
_bridges_lock = threading.Lock()


@dataclass(frozen=True)
class Grammar:
    """A checked grammar: ``kind`` ("json_object" / "json_schema"), ``text`` (llguidance's grammar definition, a
    JSON string), ``tokenizer`` (the llguidance.LLTokenizer it was checked with), ``vocab_size`` V (the decoder's
    logits width; masks are bool [V]), ``matcher`` (the llguidance.LLMatcher built and probed when it was
    checked: every request's GrammarMatcher is a copy of it)."""

    kind: str
    text: str
    tokenizer: object
    vocab_size: int
    matcher: object = field(default=None, compare=False, repr=False)


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
        raise OptionError(f"response_format must be an object with a 'type', got {brief(response_format)}",
                          param=_PARAM)
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return kind, {"type": "object"}
    if kind != "json_schema":
        raise OptionError(f"response_format.type must be 'text', 'json_object' or 'json_schema', got {brief(kind)}",
                          param=_PARAM)
    spec = response_format.get("json_schema")
    if not isinstance(spec, Mapping) or not isinstance(spec.get("schema"), Mapping):
        raise OptionError("response_format.json_schema must be an object with a 'schema' object (and a 'name')",
                          param=_PARAM)
    return kind, dict(spec["schema"])


def response_schema(response_format) -> dict | None:
    """The JSON schema a response_format asks for (json_object: any object), None for text."""
    found = _schema_of(response_format)
    return None if found is None else found[1]


def check_schema_size(schema, param: str = _PARAM, max_nodes: int = MAX_SCHEMA_NODES,
                      max_chars: int = MAX_SCHEMA_CHARS) -> None:
    """OptionError (code grammar_too_complex, naming ``param``) when ``schema`` holds more than ``max_nodes`` JSON
    values (objects, arrays and scalars) or more than ``max_chars`` characters of keys and strings. Walked
    iteratively and stopped at the first value over a limit: the cost is bounded by the limits, not by the schema
    (a 36 MB schema was json.dumps-ed, 3 s, and converted by llguidance, 8 s, before its 400)."""
    nodes = chars = 0
    stack = [schema]
    while stack:
        value = stack.pop()
        nodes += 1
        if isinstance(value, Mapping):
            chars += sum(len(k) for k in value if isinstance(k, str))
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
        elif isinstance(value, str):
            chars += len(value)
        if nodes > max_nodes or chars > max_chars:
            what = f"more than {max_nodes:,} values" if nodes > max_nodes else f"more than {max_chars:,} characters"
            raise OptionError(f"{param}: the schema holds {what}; at most {max_nodes:,} values and {max_chars:,} "
                              "characters of keys and strings (docs/serving.md, structured output limits)",
                              param=param, code=TOO_COMPLEX)


def schema_literals(schema) -> list[tuple[str, str]]:
    """(text, what) of the fixed texts a JSON schema makes every document write: the property names under
    ``required`` and the string ``const`` values (walked up to MAX_SCHEMA_NODES values, after check_schema_size),
    for GrammarCompiler.check_spelling."""
    out, stack, seen = [], [schema], 0
    while stack and seen < MAX_SCHEMA_NODES:
        node = stack.pop()
        seen += 1
        if isinstance(node, Mapping):
            required = node.get("required")
            out += [(key, f"the required property {key!r}") for key in (required if isinstance(required, list)
                                                                        else ()) if isinstance(key, str)]
            if isinstance(node.get("const"), str):
                out.append((node["const"], f"the const {node['const']!r}"))
            stack.extend(v for v in node.values() if isinstance(v, (Mapping, list)))
        elif isinstance(node, list):
            stack.extend(v for v in node if isinstance(v, (Mapping, list)))
    return out


def _first_line(value) -> str:
    return str(value).strip().splitlines()[0] if str(value).strip() else type(value).__name__


#: compiled grammars of the process, shared by every GrammarCompiler over the same tokenizer bridge: key (bridge,
#: kind, SHA-256 of the schema's canonical JSON) -> Grammar, or the OptionError it was refused with (a refused
#: schema sent again costs nothing either). Least recently used first; at most CACHED_GRAMMARS entries.
_cache: OrderedDict[tuple, object] = OrderedDict()
_cache_lock = threading.Lock()
#: keys being compiled right now -> the Event set when done (a second request for the same schema waits)
_compiling: dict[tuple, threading.Event] = {}


class GrammarCompiler:
    """Compiles and checks response formats against one tokenizer (the process-wide cache above: one compile per
    distinct schema, whichever Pipeline asks)."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids):
        self._tokenizer, self.vocab_size, self._eos = tokenizer, int(vocab_size), sorted(eos_ids)
        self._bridge = None
        self._markers = None  # literal's table of the vocabulary's marker tokens, built on first use

    @property
    def bridge(self):
        if self._bridge is None:
            self._bridge = llguidance_tokenizer(self._tokenizer, self.vocab_size, self._eos)
        return self._bridge

    def compile(self, response_format, param: str = _PARAM) -> Grammar | None:
        """response_format (OpenAI's object, or None) -> its Grammar, None for none / {"type": "text"}.
        OptionError (``param``, one line) for a malformed format, a schema over the size limits
        (check_schema_size), one llguidance cannot compile, one that admits no JSON document (pure $ref cycles), or
        one whose first mask takes more than FIRST_MASK_S (code grammar_too_complex for the limits)."""
        if response_format is None:
            return None
        found = _schema_of(response_format)
        if found is None:
            return None
        kind, schema = found
        check_schema_size(schema, param)  # before any conversion
        try:
            text = json.dumps(schema, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise OptionError(f"{param} schema is not JSON: {exc}", param=param) from None
        self.check_spelling(schema_literals(schema), param)
        return self._cached(kind, text, param)

    def warm(self) -> bool:
        """Pay structured output's first-use costs now, at a server's start, not in the first request that asks for
        it: the import of llguidance (a 7.7 MB extension: its load holds the GIL, and a cold one held /health
        0.26 s during the first schema request of a quiet run), this tokenizer's bridge, the mask threads and the
        json_object grammar (into the cache). False when llguidance is not installed (response_format is then
        refused per request, as before)."""
        try:
            import llguidance  # noqa: F401
            import llguidance.numpy  # noqa: F401
        except ImportError:
            return False
        try:
            self.compile({"type": "json_object"})
        except OptionError:  # a vocabulary llguidance cannot take: each request that asks gets this refusal
            pass
        _mask_pool()
        return True

    def compile_lark(self, text: str, param: str = _PARAM) -> Grammar:
        """An llguidance lark grammar (runtime/tool_calls.py writes them: tool calls, a schema after the
        reasoning) -> its checked Grammar, cached as compile's; OptionError naming ``param`` as compile's."""
        return self._cached("lark", text, param)

    def literal(self, text: str) -> str:
        """The lark expression of a fixed text: a string, with each marker that is one token of the vocabulary
        (an added token, which llguidance reads as special: Qwen's <tool_call>) written as that token, so a model
        writes it only with that token."""
        if self._markers is None:
            added = self._tokenizer.get_added_tokens_decoder()
            markers = {t.content: i for i, t in added.items()
                       if i < self.vocab_size and self.bridge.is_special_token(i)}
            self._markers = (markers, re.compile("(" + "|".join(re.escape(m) for m in sorted(markers, key=len,
                                                                                          reverse=True)) + ")")
                             if markers else None)
        markers, pattern = self._markers
        pieces = pattern.split(text) if pattern is not None else [text]
        return " ".join(f"<[{markers[p]}]>" if p in markers else json.dumps(p) for p in pieces if p)

    def unspellable(self, text: str) -> str | None:
        """The first character of ``text`` the vocabulary cannot write (no token spells it and no byte fallback
        covers it, e.g. "_" in the tiny LLaVA vocabulary), or None."""
        bridge = self.bridge
        if bridge.decode_bytes(bridge.tokenize_str(text)) == text.encode():
            return None
        for ch in text:
            if bridge.decode_bytes(bridge.tokenize_str(ch)) != ch.encode():
                return ch
        return None

    def check_spelling(self, texts, param: str) -> None:
        """OptionError naming ``param`` for the first (text, what) of ``texts`` the vocabulary cannot spell: the
        grammar would demand text no token sequence writes (refused here, at admission, not mid-answer)."""
        for text, what in texts:
            ch = self.unspellable(text)
            if ch is not None:
                raise OptionError(f"{param}: this model's vocabulary cannot write {ch!r}, which {what} ({text!r}) "
                                  "needs, so no answer could follow the grammar", param=param)

    def _cached(self, kind: str, text: str, param: str) -> Grammar:
        """The checked Grammar of (kind, text) from the process-wide cache, compiled once (module docstring)."""
        key = (id(self.bridge), kind, hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest())
        while True:
            with _cache_lock:
                if key in _cache:
                    _cache.move_to_end(key)
                    found = _cache[key]
                    break
                pending = _compiling.get(key)
                if pending is None:
                    _compiling[key] = threading.Event()
                    found = None
                    break
            pending.wait()  # the same schema, being compiled by another request: its result, then
        if found is None:
            try:
                found = self._compile(kind, text)
            except OptionError as exc:
                found = exc
            finally:
                with _cache_lock:
                    if found is not None:
                        _cache[key] = found
                        while len(_cache) > CACHED_GRAMMARS:
                            _cache.popitem(last=False)
                    _compiling.pop(key).set()
        if isinstance(found, OptionError):
            raise OptionError(str(found).replace(_PARAM, param, 1), param=param, code=found.code)
        return found

    def _compile(self, kind: str, text: str) -> Grammar:
        """The schema's JSON text (or a lark grammar's text) -> its checked Grammar (llguidance: grammar, matcher,
        first mask timed)."""
        llg = _llguidance()
        try:
            if kind == "lark":
                grammar = llg.LLMatcher.grammar_from_lark(text)
            else:
                grammar = llg.LLMatcher.grammar_from_json_schema(text, defaults=JSON_OPTIONS)
        except ValueError as exc:
            raise OptionError(f"{_PARAM} schema: {_first_line(exc)}", param=_PARAM) from None
        matcher = llg.LLMatcher(self.bridge, grammar, log_level=0, limits=parser_limits())  # releases the GIL
        if matcher.is_error():
            raise OptionError(f"{_PARAM} schema is not supported: {_first_line(matcher.get_error())}", param=_PARAM)
        from llguidance.numpy import allocate_token_bitmask

        cost = _mask_into(matcher, allocate_token_bitmask(1, self.vocab_size), 0)
        if matcher.is_error() or matcher.is_stopped():  # e.g. {"$ref": "#"}: nothing but EOS could ever follow
            raise OptionError(f"{_PARAM} schema admits no finite JSON document (a cycle of $refs with nothing else "
                              f"to produce?): {_first_line(matcher.get_error() or 'no token can start it')}",
                              param=_PARAM)
        if cost > FIRST_MASK_S:
            raise OptionError(f"{_PARAM} schema's grammar takes {cost * 1e3:.0f} ms for its first token's mask; at "
                              f"most {FIRST_MASK_S * 1e3:.0f} ms (a very long const, enum or pattern?)", param=_PARAM,
                              code=TOO_COMPLEX)
        return Grammar(kind, grammar, self.bridge, self.vocab_size, matcher)


def parser_limits():
    """llguidance's resource limits for every matcher here: its defaults, but the lexer's states bounded
    (MAX_LEXER_STATES) and the parser's items per mask (STEP_MAX_ITEMS)."""
    return _llguidance().LLParserLimits(max_lexer_states=MAX_LEXER_STATES, step_max_items=STEP_MAX_ITEMS)


class GrammarMatcher:
    """One answer's parser state over its Grammar: a copy of the grammar's checked matcher (it shares the compiled
    lexer, so a request starts in microseconds), and the CPU time it has spent on masks and tokens against its
    budget (MaskBudget)."""

    def __init__(self, grammar: Grammar):
        self.grammar = grammar
        self.matcher = grammar.matcher.deep_copy()
        self.budget = MaskBudget()

    def advance(self, token: int) -> None:
        """Consume the sampled token; OptionError if the grammar refuses it (never after a mask from this
        matcher: a refusal means the parser hit one of llguidance's limits) or the budget is spent."""
        t0 = time.thread_time()
        ok = self.matcher.consume_token(int(token))
        self.budget.spend(time.thread_time() - t0)
        if not ok:
            raise OptionError(f"{_PARAM}: generation left the grammar: {_first_line(self.matcher.get_error())}",
                              param=_PARAM)
        self.budget.check()

    @property
    def done(self) -> bool:
        """The grammar is complete: nothing but EOS may follow."""
        return self.matcher.is_stopped()


class MaskBudget:
    """The CPU time one answer's grammar may spend (its masks and tokens): MASK_START_S at the start, plus
    max(MASK_FLOOR_S, MASK_STEP_FACTOR x the step's own CPU time) per token. Its masks run beside the decoder call
    of their step (start_masks); a grammar over budget is cut (OptionError, code grammar_too_complex) for its own
    request alone, and until then it has added at most MASK_START_S plus MASK_STEP_FACTOR of each step (or
    MASK_FLOOR_S) to its neighbours' steps, even where the cores are all busy."""

    def __init__(self):
        self.spent, self.allowed = 0.0, MASK_START_S

    def spend(self, seconds: float) -> None:
        self.spent += seconds

    def grant(self, step_cpu_s: float) -> None:
        self.allowed += max(MASK_FLOOR_S, MASK_STEP_FACTOR * step_cpu_s)

    def check(self) -> None:
        if self.spent > self.allowed:
            raise OptionError(f"{_PARAM}: the grammar's token masks took {self.spent * 1e3:.0f} ms of CPU, over its "
                              f"budget of {self.allowed * 1e3:.0f} ms ({MASK_START_S * 1e3:.0f} ms plus the larger "
                              f"of {MASK_FLOOR_S * 1e3:g} ms and {MASK_STEP_FACTOR:g} x the decoder step's CPU time "
                              "per token): generation stopped "
                              "(a very long const, enum or pattern?)", param=_PARAM, code=TOO_COMPLEX)


class PendingMasks:
    """The masks of one step, being computed: ``allowed(i)`` -> bool [V] of the i-th matcher given to start, or
    OptionError for that matcher alone (its grammar hit a limit, or its budget is spent). Made and read by the
    engine's thread: the CPU time that thread spends between the two (the step's decoder call, which ONNX Runtime
    runs on the calling thread with its other intra-op threads) is what each budget is granted from."""

    def __init__(self, future, bits: np.ndarray, costs: list, matchers: list, vocab_size: int):
        self._future, self._bits, self._costs, self._matchers, self._v = future, bits, costs, matchers, vocab_size
        self._c0 = time.thread_time()
        self._step_s = None
        self._allowed = None

    def allowed(self, i: int) -> np.ndarray:
        if self._allowed is None:
            self._step_s = time.thread_time() - self._c0  # the CPU time of the step these masks ran beside
            self._future.result()
            self._allowed = np.unpackbits(self._bits.view(np.uint8), axis=1, bitorder="little")[:, :self._v] \
                .astype(bool)
        m = self._matchers[i]
        m.budget.spend(self._costs[i])
        m.budget.grant(self._step_s)
        if m.matcher.is_error():
            raise OptionError(f"{_PARAM}: the grammar hit a limit: {_first_line(m.matcher.get_error())}",
                              param=_PARAM, code=TOO_COMPLEX)
        m.budget.check()
        return self._allowed[i]


#: one background thread (created on first use, shared by every engine of the process) that computes the masks of
#: a step one matcher after another, each timed in CPU seconds of this thread (its budget: robust to a busy
#: machine, where a wall-clock budget cut legitimate grammars and a call through llguidance's executor waited
#: milliseconds for its thread to be scheduled); the thread overlaps the decoder call (ONNX Runtime releases the
#: GIL). A matcher's own mask call holds the GIL: each is bounded by the limits above (and cut by its budget).
_pool: ThreadPoolExecutor | None = None
_executor = None


def _mask_into(matcher, bits: np.ndarray, i: int) -> float:
    """Compute ``matcher``'s next-token mask into row i of ``bits`` (llguidance's int32 bitmask [B, ceil(V/32)])
    with the GIL released, through llguidance's executor -> its wall seconds. For the one mask of a compile (a
    slow one must not hold the event loop: a self-recursive schema's held it 300 ms)."""
    global _executor
    llg = _llguidance()
    from llguidance.numpy import fill_next_token_bitmask_par

    with _bridges_lock:
        if _executor is None:
            _executor = llg.LLExecutor(num_threads=1)
    t0 = time.perf_counter()
    fill_next_token_bitmask_par(_executor, [(matcher, i)], bits)
    return time.perf_counter() - t0


def _fill(matchers: list[GrammarMatcher], bits: np.ndarray, costs: list) -> None:
    row = bits.shape[1] * bits.itemsize
    for i, m in enumerate(matchers):
        t0 = time.thread_time()
        m.matcher.unsafe_compute_mask_ptr(bits[i].ctypes.data, row)
        costs[i] = time.thread_time() - t0


def start_masks(matchers: list[GrammarMatcher]) -> PendingMasks | None:
    """Start computing the next token's mask of every matcher (all over one tokenizer) in the background thread;
    None for none."""
    if not matchers:
        return None
    from llguidance.numpy import allocate_token_bitmask

    v = matchers[0].grammar.vocab_size
    bits = allocate_token_bitmask(len(matchers), v)
    costs = [0.0] * len(matchers)
    return PendingMasks(_mask_pool().submit(_fill, matchers, bits, costs), bits, costs, matchers, v)


def _mask_pool() -> ThreadPoolExecutor:
    """The background thread of start_masks (created on first use)."""
    global _pool
    with _bridges_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")
        return _pool
