"""Parse a request body without holding the event loop: JSON in small C calls, parts counted before validation.

``json.loads`` is one C call that holds the GIL for the whole body: 100,000 one-letter text parts (3 MB) took
~0.1-0.6 s of it, and every other thread, the event loop included (/health), waited that long, even with the parse
in a worker thread. ``loads`` gives the same value as ``json.loads`` (same scanner, same errors as
json.JSONDecodeError); a body of many objects and arrays (above FAST_CONTAINERS) it walks the outer
``MAX_PYTHON_DEPTH`` levels of arrays and objects in Python and hands each deeper value to the C scanner on its
own: every C call is one content part or one string, so the GIL is released between them (sys.getswitchinterval)
and the loop keeps answering (at ~3x json.loads' CPU: 100,000 parts ~0.3 s of a worker thread). The server then counts the content
parts (runtime.messages.check_part_count) so a request over MAX_PARTS is refused before pydantic validates every
part (another single long call).
"""

from __future__ import annotations

import json
import json.decoder

#: a body with at most this many '{' and '[' bytes is parsed by json.loads in one C call: ~0.85 us per container on
#: the 2-core dev box, so <= ~0.1 s of GIL (a legit request: MAX_PARTS = 4,096 parts of <= 2 objects each, its
#: messages, tools, is far below; 100,000 one-letter parts take 0.085 s and get their 4xx in ~0.3 s, where the walk
#: took 1-1.5 s on the loaded box); above it the walk below: a body far over every limit, refused anyway, parsed at a
#: few microseconds per value in a worker thread that releases the GIL between values
FAST_CONTAINERS = 131_072
#: containers this deep (body -> messages -> message -> content) are walked in Python; deeper values are one C call
MAX_PYTHON_DEPTH = 4

_DECODER = json.JSONDecoder()
_SCAN = _DECODER.scan_once  # the C scanner json.loads uses (the pure-Python one where the C module is absent)
_WHITESPACE = json.decoder.WHITESPACE  # json's own pattern: a run of whitespace is one C call
_WS_CHARS = frozenset(" \t\n\r")


def _skip(s: str, i: int) -> int:
    return _WHITESPACE.match(s, i).end()


def _error(msg: str, s: str, i: int) -> json.JSONDecodeError:
    return json.JSONDecodeError(msg, s, i)


def _value(s: str, i: int, depth: int):
    """-> (value, index after it); containers above MAX_PYTHON_DEPTH walked here, the rest by the C scanner."""
    if i < len(s) and s[i] in "[{" and depth < MAX_PYTHON_DEPTH:
        return (_object if s[i] == "{" else _array)(s, i + 1, depth + 1)
    try:
        return _SCAN(s, i)
    except StopIteration as exc:
        raise _error("Expecting value", s, exc.value) from None


def _array(s: str, i: int, depth: int):
    out = []
    append, scan, ws, deeper = out.append, _SCAN, _WHITESPACE.match, depth < MAX_PYTHON_DEPTH
    i = ws(s, i).end()
    if s[i:i + 1] == "]":
        return out, i + 1
    while True:  # the hot loop (one turn per content part): locals only
        if deeper and s[i:i + 1] in ("[", "{"):
            value, i = _value(s, i, depth)
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


def _object(s: str, i: int, depth: int):
    out = {}
    i = _skip(s, i)
    if i < len(s) and s[i] == "}":
        return out, i + 1
    while True:
        if i >= len(s) or s[i] != '"':
            raise _error("Expecting property name enclosed in double quotes", s, i)
        key, i = json.decoder.scanstring(s, i + 1)
        i = _skip(s, i)
        if i >= len(s) or s[i] != ":":
            raise _error("Expecting ':' delimiter", s, i)
        out[key], i = _value(s, _skip(s, i + 1), depth)
        i = _skip(s, i)
        if i < len(s) and s[i] == "}":
            return out, i + 1
        if i >= len(s) or s[i] != ",":
            raise _error("Expecting ',' delimiter", s, i)
        i = _skip(s, i + 1)


def loads(raw: bytes | str):
    """json.loads(raw), in short C calls when the body holds more than FAST_CONTAINERS objects and arrays (module
    doc). UnicodeDecodeError / json.JSONDecodeError / RecursionError as json.loads raises them."""
    text = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if text.count(b"{") + text.count(b"[") <= FAST_CONTAINERS:  # counts include brackets inside strings: an upper bound
        return json.loads(raw)
    s = raw.decode(json.detect_encoding(raw), "surrogatepass") if isinstance(raw, bytes) else raw
    if s.startswith("\ufeff"):
        raise _error("Unexpected UTF-8 BOM (decode using utf-8-sig)", s, 0)
    value, i = _value(s, _skip(s, 0), 0)
    i = _skip(s, i)
    if i != len(s):
        raise _error("Extra data", s, i)
    return value
