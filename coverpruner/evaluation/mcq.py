"""Option letters from free-form multiple-choice answers, by the rules lmms-eval's MMBench static scorer uses.

``infer_option`` is MMBench's own prefetch (exact letter token, then "A." / "(A)" / ... forms, then a unique
option text quoted in the answer); ``mcq_letter`` is lmms-eval's generic extractor (``mcq_extract``), which
the static scorer falls back to where MMBench's official scorer would ask a GPT judge.
"""

from __future__ import annotations

_LETTERS = "ABCDE"
# (prefix, suffix) wrappers tried in this order once the bare letter is ambiguous or absent
_WRAPPERS = (("", "."), ("", ","), ("", ":"), ("", ")"), ("", ")."), ("(", ")"), ("(", ")."), (":", ""),
             (":", ","), (":", "."), (":", ")"), (":", ")."))


def _letter_token(answer: str) -> str:
    """A letter from the whitespace tokens of the answer, or "" (MMBench's can_infer_option)."""
    tokens = [t.strip() for t in answer.split()]
    bare = [c for c in _LETTERS if c in tokens]
    if len(bare) == 1:
        # "A" with more than three tokens may be the article ("A dog is ..."): then try the wrapped forms
        if not ("A" in tokens and len(tokens) > 3):
            return bare[0]
    for prefix, suffix in _WRAPPERS:
        hits = [c for c in _LETTERS if prefix + c + suffix in tokens]
        if len(hits) == 1:
            return hits[0]
    return ""


def _option_text(answer: str, choices: dict) -> str:
    """The one option whose text (lower-cased) occurs in the answer, or "" when none or several do."""
    low = answer.lower()
    hits = [k for k, v in choices.items() if str(v).lower() in low]
    return hits[0] if len(hits) == 1 else ""


def infer_option(answer: str, choices: dict) -> str:
    """MMBench's rule-based letter: choices maps "A".."D" to option texts; "" when undecided."""
    if "Failed to obtain answer via API" in answer:  # lmms-eval's sentinel, kept for identical results
        return _option_text(answer, choices)
    return _letter_token(answer) or _option_text(answer, choices)


_PHRASES = ("the answer is", "answer is", "the correct answer is", "correct answer is", "the best answer is",
            "best answer is", "the correct option is", "correct option is", "the best option is", "best option is",
            "the choice is", "choice is", "the correct choice is", "correct choice is", "i choose", "i select",
            "i pick", "my answer is", "my choice is", "옵션", "정답은", "답은", "답:", "答案是", "答案为", "选", "答えは")
# higher wins; among equal priorities the later position in the text wins
_PRIORITY = {"start": 10, "end": 9, "phrase": 7, "parentheses": 6, "period": 5, "colon": 4, "right_paren": 3,
             "space": 2, "fallback": 0}


def mcq_letter(response: str, choices: list[str] | None = None) -> str:
    """lmms-eval's ``extract_mcq_answer``: the best-ranked letter of ``choices`` (default A..H) or ""."""
    if not response or not response.strip():
        return ""
    letters = choices or list("ABCDEFGH")
    text = response.strip()
    for ch in ",.!?;:'\"":  # one character class at a time, in this order, as the original does
        text = text.strip(ch)
    text = f" {text} "
    found = []  # (priority, position, letter)
    for kind, fmt in (("parentheses", "({})"), ("period", "{}."), ("colon", "{}:"), ("right_paren", "{})"),
                      ("space", "{} ")):
        for c in letters:
            pos = text.rfind(fmt.format(c))
            if pos != -1:
                found.append((_PRIORITY[kind], pos, c))
    low = text.lower()
    for phrase in _PHRASES:
        at = low.find(phrase)
        if at != -1:
            for c in letters:
                pos = text.find(c, at + len(phrase))
                if pos != -1:
                    found.append((_PRIORITY["phrase"], pos, c))
    core = text.strip()
    for c in letters:
        if core.startswith(c) and (len(core) == 1 or not core[1].isalpha()):
            found.append((_PRIORITY["start"], 0, c))
        if core.endswith(c) and (len(core) == 1 or not core[-2].isalpha()):
            found.append((_PRIORITY["end"], len(text) - 1, c))
    if not found:
        found = [(_PRIORITY["fallback"], text.rfind(c), c) for c in letters if c in text]
    if not found:
        return ""
    # the original sorts (priority, position) descending with a stable sort: the first maximum wins
    best = max(found, key=lambda f: (f[0], f[1]))
    return best[2]
