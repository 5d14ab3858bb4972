"""Parse a request body without holding the event loop: JSON in small C calls, parts counted before validation.

``json.loads`` is one C call that holds the GIL for the whole body: 100,000 one-letter text parts (3 MB) took
~0.1-0.6 s of it, and every other thread, the event loop included (/health), waited that long, even with the parse
in a worker thread. ``loads`` gives the same value as ``json.loads`` (same scanner, same errors as
json.JSONDecodeError); a body of many objects and arrays (above FAST_CONTAINERS, or FAST_COMMAS commas) it walks
the outer ``MAX_PYTHON_DEPTH`` levels of arrays and objects in Python and hands each deeper value to the C scanner
on its own: every C call is one content part or one string, so the GIL is released between them
(sys.getswitchinterval) and the loop keeps answering (at ~3x json.loads' CPU: 100,000 parts ~0.3 s of a worker
thread). The server then counts the content parts (runtime.messages.check_part_count) so a request over MAX_PARTS
is refused before pydantic validates every part (another single long call).

Issue 40: the fast path bounds the commas too (an upper bound of the values: a logit_bias of 10^6 entries is ONE
object, and json.loads held the GIL 0.6 s for it); a body over BIG_BODY is always walked, every value, its long
strings a slice per C call; and ``caps`` bounds the top-level fields whose size a limit caps: the walk reads such a
field's values one by one (containers at any depth walked here, so each is counted) and stops at its limit with
TooManyValues, so a 36 MB schema, 50,000 tools or 10^6 logit_bias entries are refused after reading a limit's worth
of them, not all of them. ``dumps`` is the other direction: a large answer encoded in short C calls.
"""

from __future__ import annotations

import json
import json.decoder
import sys

#: a body with at most this many '{' and '[' bytes (and FAST_COMMAS commas) is parsed by json.loads in one C call:
#: ~0.85 us per container on the 2-core dev box, so <= ~30 ms of GIL (a legit request: MAX_PARTS = 4,096 parts of
#: <= 2 objects each, its messages, tools, is far below). Above it the walk below: a body far over every limit,
#: parsed at a few microseconds per value in a worker thread that releases the GIL between values, and its capped
#: fields (messages and input included: serving.app.body_caps) refused after a limit's worth of values. Issue 40:
#: it was 131,072, ~0.1 s of GIL in one call, and /v1/responses' 100,000 input items (100,000 containers, one
#: json.loads) held /health 0.1-0.15 s
FAST_CONTAINERS = 32_768
#: ... and at most this many ',' bytes: a scalar costs json.loads a few times less than a container (4,096 text
#: parts, 8,192 commas, stay on the fast path), but 10^6 of them (one logit_bias object) took 0.6 s of GIL
FAST_COMMAS = 4 * FAST_CONTAINERS
#: containers this deep (body -> messages -> message -> content) are walked in Python; deeper values are one C call
MAX_PYTHON_DEPTH = 4

_DECODER = json.JSONDecoder()
_SCAN = _DECODER.scan_once  # the C scanner json.loads uses (the pure-Python one where the C module is absent)
_WHITESPACE = json.decoder.WHITESPACE  # json's own pattern: a run of whitespace is one C call
_WS_CHARS = frozenset(" \t\n\r")
_ESCAPE_CHARS = frozenset("\\u0123456789abcdefABCDEF")  # what the inside of an escape sequence is made of


def _skip(s: str, i: int) -> int:
    return _WHITESPACE.match(s, i).end()


def _error(msg: str, s: str, i: int) -> json.JSONDecodeError:
    return json.JSONDecodeError(msg, s, i)


class TooManyValues(ValueError):
    """A capped top-level field holds more JSON values than its cap (``field``, ``limit``, ``code``: the error code
    the caller reports)."""

    def __init__(self, field: str, limit: int, code: str):
        super().__init__(f"{field} holds more than {limit:,} JSON values; at most {limit:,} (docs/serving.md)")
        self.field, self.limit, self.code = field, limit, code


class _Budget:
    """The values a capped field may still hold (not counting the field's own value: a logit_bias of 1,024 entries
    is within a cap of 1,024); ``take`` counts one (TooManyValues past the cap)."""

    __slots__ = ("left", "field", "limit", "code")

    def __init__(self, field: str, limit: int, code: str):
        self.left, self.field, self.limit, self.code = limit + 1, field, limit, code

    def take(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise TooManyValues(self.field, self.limit, self.code)


def _escaped(s: str, q: int) -> bool:
    """Whether the character at q follows an odd run of backslashes."""
    k = q
    while k > 0 and s[k - 1] == "\\":
        k -= 1
    return (q - k) % 2 == 1


def _string(s: str, i: int) -> tuple[str, int]:
    """The JSON string opening at s[i] ('"') -> (its value, index after it), as json's scanstring gives it, but a
    long one (no closing quote within _SLICE characters) decoded a slice per C call (one call over a 40 MB string
    held the GIL 0.25 s). A slice ends where no escape can be cut: with no backslash in its last 12 characters
    (an escape is at most 6, a surrogate pair 12), else right after a character that cannot be inside an escape
    (not a backslash, 'u' or a hex digit)."""
    q = s.find('"', i + 1, i + 1 + _SLICE)
    if q != -1 and not _escaped(s, q):
        return json.decoder.scanstring(s, i + 1)
    pieces, j = [], i + 1
    while True:
        e = min(j + _SLICE, len(s))
        q = s.find('"', j, e)
        while q != -1 and _escaped(s, q):
            q = s.find('"', q + 1, e)
        end = q + 1 if q != -1 else e
        if q == -1:
            if e == len(s):
                raise _error("Unterminated string starting at", s, i)
            if s.rfind("\\", max(j, e - 12), e) != -1:
                while end > j and s[end - 1] in _ESCAPE_CHARS:
                    end -= 1
                if end == j:  # a slice of nothing but escape characters: the rest in one call
                    value, after = json.decoder.scanstring(s, j)
                    return "".join(pieces) + value, after
        try:
            pieces.append(json.decoder.scanstring(s[j:end] if q != -1 else s[j:end] + '"', 0)[0])
        except json.JSONDecodeError as exc:  # positions in the whole body, as json.loads reports them
            raise _error(exc.msg, s, j + exc.pos) from None
        if q != -1:
            return "".join(pieces), end
        j = end


def _value(s: str, i: int, depth: int, budget: _Budget | None = None):
    """-> (value, index after it); containers above MAX_PYTHON_DEPTH (any depth under a budget) walked here, the rest
    by the C scanner; under a budget, strings too (_string)."""
    if budget is not None:
        budget.take()
        if s[i:i + 1] == '"':
            return _string(s, i)
    if i < len(s) and s[i] in "[{" and (depth < MAX_PYTHON_DEPTH or budget is not None):
        return (_object if s[i] == "{" else _array)(s, i + 1, depth + 1, budget)
    try:
        return _SCAN(s, i)
    except StopIteration as exc:
        raise _error("Expecting value", s, exc.value) from None


def _array(s: str, i: int, depth: int, budget: _Budget | None = None):
    out = []
    append, scan, ws = out.append, _SCAN, _WHITESPACE.match
    deeper = depth < MAX_PYTHON_DEPTH or budget is not None
    i = ws(s, i).end()
    if s[i:i + 1] == "]":
        return out, i + 1
    while True:  # the hot loop (one turn per content part): locals only
        if deeper and s[i:i + 1] in ("[", "{"):
            value, i = _value(s, i, depth, budget)
        elif budget is not None:
            value, i = _value(s, i, depth, budget)
        else:
            try:
                value, i = scan(s, i)
            except StopIteration as exc:
                raise _error("Expecting value", s, exc.value) from None
        append(value)
        c = s[i:i + 1]
        if c in _WS_CHARS:
            i = ws(s, i).end()
            c = s[i:i + 1]
        if c == ",":
            i += 1
            if s[i:i + 1] in _WS_CHARS:
                i = ws(s, i).end()
            continue
        if c == "]":
            return out, i + 1
        raise _error("Expecting ',' delimiter", s, i)


def _object(s: str, i: int, depth: int, budget: _Budget | None = None, caps: dict | None = None):
    """caps (the body's own object only): {field: (most values, error code)}: that field's value is read under a
    _Budget."""
    out = {}
    i = _skip(s, i)
    if i < len(s) and s[i] == "}":
        return out, i + 1
    while True:
        if i >= len(s) or s[i] != '"':
            raise _error("Expecting property name enclosed in double quotes", s, i)
        key, i = _string(s, i) if budget is not None else json.decoder.scanstring(s, i + 1)
        i = _skip(s, i)
        if i >= len(s) or s[i] != ":":
            raise _error("Expecting ':' delimiter", s, i)
        sub = _Budget(key, *caps[key]) if caps and key in caps else budget
        out[key], i = _value(s, _skip(s, i + 1), depth, sub)
        i = _skip(s, i)
        if i < len(s) and s[i] == "}":
            return out, i + 1
        if i >= len(s) or s[i] != ",":
            raise _error("Expecting ',' delimiter", s, i)
        i = _skip(s, i + 1)


#: bytes per C call when a large body is counted or decoded (each call ~1 ms; the GIL is free between them)
_SLICE = 1 << 20
#: a body larger than this is walked whatever it holds, every value here and each long string a slice at a time
#: (_string): json.loads decodes a string at ~6 ns per character in one call, so an image's 32 MB data URL or a
#: 40 MB instruction held the GIL 0.2-0.25 s; the walk of such a body is a handful of values
BIG_BODY = 4 * 2 ** 20


def _fast(text) -> bool:
    """Whether the body holds at most FAST_CONTAINERS '{' / '[' bytes and FAST_COMMAS ',' bytes (upper bounds of its
    containers and values: bytes inside strings count too); counted a slice at a time, stopping once over."""
    containers = commas = 0
    for i in range(0, len(text), _SLICE):
        containers += text.count(b"{", i, i + _SLICE) + text.count(b"[", i, i + _SLICE)
        commas += text.count(b",", i, i + _SLICE)
        if containers > FAST_CONTAINERS or commas > FAST_COMMAS:
            return False
    return True


def _decode(raw) -> str:
    """raw.decode(its JSON encoding, "surrogatepass") as json.loads does, a slice per C call (a 42 MB body decoded
    in one call held the GIL ~50 ms)."""
    import codecs

    decoder = codecs.getincrementaldecoder(json.detect_encoding(raw))("surrogatepass")
    parts = [decoder.decode(raw[i:i + _SLICE]) for i in range(0, len(raw), _SLICE)]
    parts.append(decoder.decode(b"", final=True))
    return "".join(parts)


def loads(raw: bytes | str, caps: dict | None = None):
    """json.loads(raw), in short C calls when the body holds more than FAST_CONTAINERS objects and arrays or FAST_COMMAS
    commas (module doc); then each top-level field named in ``caps`` ({field: (most values, error code)}) is refused
    with TooManyValues as soon as it holds more (a body parsed in one C call is small enough to be checked after).
    UnicodeDecodeError / json.JSONDecodeError / RecursionError as json.loads raises them."""
    text = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    big = len(text) > BIG_BODY
    if not big and _fast(text):
        return json.loads(raw)
    s = _decode(raw) if isinstance(raw, (bytes, bytearray)) else raw
    if s.startswith("\ufeff"):
        raise _error("Unexpected UTF-8 BOM (decode using utf-8-sig)", s, 0)
    i = _skip(s, 0)
    whole = _Budget("the request body", sys.maxsize, "invalid_json") if big else None  # every value walked here
    if s[i:i + 1] == "{":
        value, i = _object(s, i + 1, 1, whole, caps)
    else:
        value, i = _value(s, i, 0, whole)
    i = _skip(s, i)
    if i != len(s):
        raise _error("Extra data", s, i)
    return value


#: a list longer than this is encoded one element per C call (dumps)
_ITEMWISE = 32


def dumps(obj) -> bytes:
    """The bytes starlette's JSONResponse renders for obj (json.dumps, compact, UTF-8, no NaN), in short C calls: dicts
    and short lists are walked here, a long list's elements (e.g. one logprob entry per answer token) are encoded one per
    call, so the GIL is released between them. For a large answer encoded in a worker thread (serving.app): 8
    answers of 2,000 tokens with 20 alternatives each (21.7 MB) were one json.dumps call that held the event loop
    for seconds."""
    out: list[str] = []
    _encode(obj, out.append)
    return "".join(out).encode("utf-8")


class RawJSON(str):
    """JSON text that dumps writes as it is (a value encoded beforehand, e.g. serving.choices.chat_logprobs_json)."""


def _encode(obj, put) -> None:
    if isinstance(obj, RawJSON):
        put(obj)
    elif isinstance(obj, dict):
        put("{")
        for k, (key, value) in enumerate(obj.items()):
            put(("," if k else "") + _leaf(key if isinstance(key, str) else str(key)) + ":")
            _encode(value, put)
        put("}")
    elif isinstance(obj, (list, tuple)):
        put("[")
        for k, value in enumerate(obj):
            if k:
                put(",")
            if len(obj) > _ITEMWISE:
                put(_leaf(value))
            else:
                _encode(value, put)
        put("]")
    else:
        put(_leaf(obj))


def _leaf(value) -> str:
    if isinstance(value, RawJSON):
        return value
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
