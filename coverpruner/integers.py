"""Integers from text, strictly: ASCII digits only, a bounded number of them.

``str.isdigit()`` is true for "²", "①" and other Unicode digits that ``int()`` refuses (issue 40: a logit_bias key
"²" was a 500 "invalid literal for int()"), while ``int()`` takes Arabic-Indic and full-width digits and "1_000";
and ``int()`` of more than 4,300 digits raises. Every place where a string may carry an integer (request fields,
family options, CLI arguments, headers, file names) reads it here, so "what is an integer" has one answer: optional
ASCII spaces / tabs around, an optional "-" where a sign is allowed, then 1..MAX_DIGITS ASCII digits. Anything else
is not an integer, and each caller refuses it in its own one-line message, with the text shown through ``brief``
(a 10 MB string is not repeated back in an error).
"""

from __future__ import annotations

import re

__all__ = ["MAX_DIGITS", "ascii_int", "cli_int", "brief"]

#: digits read at most: 2^63 - 1 has 19; a longer string is no integer any bound here could take
MAX_DIGITS = 24
_UNSIGNED = re.compile(rf"[ \t]*([0-9]{{1,{MAX_DIGITS}}})[ \t]*")
_SIGNED = re.compile(rf"[ \t]*(-?[0-9]{{1,{MAX_DIGITS}}})[ \t]*")


def ascii_int(text: str, signed: bool = False) -> int | None:
    """The integer ``text`` spells in ASCII digits (a leading "-" only when ``signed``), or None."""
    if not isinstance(text, str) or len(text) > MAX_DIGITS + 64:
        return None
    m = (_SIGNED if signed else _UNSIGNED).fullmatch(text)
    return int(m.group(1)) if m else None


def cli_int(text: str) -> int:
    """argparse ``type=``: an ASCII integer (a sign allowed, so a range check can name a negative value); argparse
    turns the ValueError into "invalid integer value: '…'" and exit code 2."""
    value = ascii_int(text, signed=True)
    if value is None:
        raise ValueError(text)
    return value


cli_int.__name__ = "integer"  # argparse names the type by it: "invalid integer value"


def brief(value, limit: int = 60) -> str:
    """repr(value), cut to ``limit`` characters with its full length named (error messages stay one short line)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f"{len(value):,} characters" if isinstance(value, str) else f"{len(text):,} characters as text"
    return f"{text[:limit]}... ({size})"
