"""A stop string that a given answer completes at its k-th token, found from the answer's own tokens (so a test
knows, before asking, where decoding must end and what text must come back)."""

from __future__ import annotations


def stop_at(decode, token_ids: list[int], k: int) -> tuple[str, str]:
    """decode(ids) -> text; token_ids: an answer's tokens (at least k) -> (stop, expected text): a stop string whose
    first appearance in the answer's text ends inside the text token k adds, and the text before it: the shortest
    such string made of the new text and the characters before it; ValueError when there is none."""
    before, upto = decode(token_ids[:k - 1]), decode(token_ids[:k])
    if not upto.startswith(before) or len(upto) == len(before) or upto.endswith("\ufffd"):
        raise ValueError(f"token {k} adds no whole text of its own")
    for back in range(len(before) + 1):
        stop = upto[max(0, len(before) - back):]
        where = upto.find(stop)
        if where + len(stop) > len(before):  # its first appearance ends in token k's text
            return stop, upto[:where]
    raise ValueError(f"every stop candidate ending at token {k} appears earlier")
