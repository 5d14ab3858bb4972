"""OpenAI ``stop`` strings over streamed text pieces.

The pipeline streams text pieces; a stop string may span pieces, so text that could still be the start
of a stop string is held back until the next piece decides. The answer is cut before the stop string.
"""

from __future__ import annotations


class StopMatcher:
    """push(piece) -> (text safe to emit, stopped?); flush() -> held-back text at the end."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.stopped = False

    def push(self, piece: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        if not self.stops:
            return piece, False
        text = self.pending + piece
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.pending, self.stopped = "", True
            return text[:cut], True
        hold = max((k for s in self.stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        self.pending = text[len(text) - hold:] if hold else ""
        return text[:len(text) - hold], False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out
