"""Stop strings (OpenAI's ``stop``, GenerationOptions.stop) matched on the decoded text as the engine loop decodes.

The engine loop (runtime/engine.py) pushes each token's new text piece; a stop string may span pieces, so text that
could still be the start of a stop string is held back until the next piece decides (a streamed answer never shows
part of a stop string). At a match the answer ends there: its text stops before the stop string, and the token that
completed the match is its last.

Each stop string keeps a Knuth-Morris-Pratt state (the length of the longest suffix of the text so far that is
a prefix of the string), so a piece costs O(characters x stop strings) whatever the strings' lengths and the
answer's length: the text is never searched again, and the held-back tail is the largest state. The option's
limits (runtime.options: MAX_STOP_STRINGS strings of at most MAX_STOP_CHARS characters) bound the tables' size.
"""

from __future__ import annotations


def _failure(s: str) -> list[int]:
    """KMP failure function: fail[k] = length of the longest proper prefix of s[:k+1] that is also its suffix."""
    fail, k = [0] * len(s), 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = fail[k - 1]
        if s[i] == s[k]:
            k += 1
        fail[i] = k
    return fail


class StopMatcher:
    """push(piece) -> (text safe to emit, stopped?); flush() -> held-back text at the end; ``matched``: the stop
    string that ended the text (None until one does).

    Within one push the stop string that starts earliest in the text wins (held-back text included)."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self._fail = [_failure(s) for s in self.stops]
        self._state = [0] * len(self.stops)
        self.pending = ""
        self.stopped = False
        self.matched: str | None = None

    def push(self, piece: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        if not self.stops:
            return piece, False
        text = self.pending + piece
        base = len(self.pending)  # text[base + i] is piece[i]
        cut, matched = -1, None
        for j, (s, fail) in enumerate(zip(self.stops, self._fail)):
            k = self._state[j]
            for i, ch in enumerate(piece):
                while k and ch != s[k]:
                    k = fail[k - 1]
                if ch == s[k]:
                    k += 1
                if k == len(s):  # s ends at text[base + i]: its first occurrence for this string
                    start = base + i + 1 - len(s)
                    if cut < 0 or start < cut:
                        cut, matched = start, s
                    break
            self._state[j] = k
        if cut >= 0:
            self.pending, self.stopped, self.matched = "", True, matched
            return text[:cut], True
        hold = min(max(self._state), len(text))
        self.pending = text[len(text) - hold:] if hold else ""
        return text[:len(text) - hold], False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out
