"""VQA answer normalization as lmms-eval applies it (its ``EvalAIAnswerProcessor``, from MMF / the VQA eval).

Three steps, each a function here because the tasks combine them differently:

* ``eval_ai_tokenize``: lower-case, drop ``,`` and ``?``, split ``'s`` off its word ("man's" -> "man 's").
  Only TextVQA's scorer runs it (the full processor); VQAv2's does not.
* ``strip_punctuation``: each of ``; / [ ] " { } ( ) = + \\ _ - > < @ ` , ? !`` is deleted when it touches a
  space in the original text (or the text has a digit-comma-digit group anywhere), else replaced by a space;
  then periods not followed by a digit are deleted (so "2.5" keeps its point).
* ``digits_and_articles``: lower-case, split on whitespace, number words zero..ten (and "none") -> digits,
  drop "a", "an", "the", then restore apostrophes of known contractions ("dont" -> "don't").

The behaviour follows lmms-eval exactly, quirks included (see docs/evaluation.md): the period rule is a
broken look-behind in the original that never looks behind, and lmms-eval passes ``re.UNICODE`` (= 32) where
``re.sub`` expects a count, so at most 32 periods are removed from one answer.
"""

from __future__ import annotations

import re

_PUNCTUATION = (";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",",
                "?", "!")
_DIGIT_COMMA_DIGIT = re.compile(r"(?<=\d),+(?=\d)")
_PERIOD_NOT_BEFORE_DIGIT = re.compile(r"\.(?!\d)")
_MAX_PERIODS_REMOVED = 32  # lmms-eval passes re.UNICODE (32) as re.sub's count argument

_NUMBER_WORDS = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
                 "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10"}
_ARTICLES = frozenset(("a", "an", "the"))


def _contractions() -> dict[str, str]:
    """Apostrophe-less spelling -> spelling with apostrophes (the VQA eval's table; lower-case keys only,
    since the words are lower-cased before the lookup: the original's 'Im', 'Ive', "Id've" never match)."""
    table = {}
    # "<stem>nt" -> "<stem>n't" and the "'ve" forms of the modal ones
    for stem in ("are", "ca", "could", "did", "does", "do", "had", "has", "have", "is", "might", "must", "need",
                 "ought", "should", "was", "were", "would", "wo", "sha"):
        table[f"{stem}nt"] = f"{stem}n't"
    table["aint"] = "ain't"
    for stem in ("could", "had", "might", "should", "would"):
        table[f"{stem}nt've"] = table[f"{stem}n'tve"] = f"{stem}n't've"
    for stem in ("could", "might", "must", "should", "would", "who", "what", "where", "they", "we", "you"):
        table[f"{stem}ve"] = f"{stem}'ve"
    for pronoun in ("he", "it", "they", "you", "who", "there", "someone", "something", "somebody"):
        table[f"{pronoun}d've"] = table[f"{pronoun}'dve"] = f"{pronoun}'d've"
    table.update({
        "hed": "he'd", "hes": "he's", "howd": "how'd", "howll": "how'll", "hows": "how's",
        "itd": "it'd", "itll": "it'll", "let's": "let's", "maam": "ma'am", "notve": "not've", "oclock": "o'clock",
        "ow's'at": "'ow's'at", "'ows'at": "'ow's'at", "'ow'sat": "'ow's'at", "she's": "she's",
        "somebody'd": "somebodyd",  # sic: the original table maps this one backwards
        "somebodyll": "somebody'll", "somebodys": "somebody's", "someoned": "someone'd", "someonell": "someone'll",
        "someones": "someone's", "somethingd": "something'd", "somethingll": "something'll", "thats": "that's",
        "thered": "there'd", "therere": "there're", "theres": "there's", "theyd": "they'd", "theyll": "they'll",
        "theyre": "they're", "twas": "'twas", "whatll": "what'll", "whatre": "what're", "whats": "what's",
        "whens": "when's", "whered": "where'd", "wheres": "where's", "whod": "who'd", "wholl": "who'll",
        "whos": "who's", "whyll": "why'll", "whyre": "why're", "whys": "why's", "yall": "y'all",
        "yall'll": "y'all'll", "y'allll": "y'all'll", "yall'd've": "y'all'd've", "y'alld've": "y'all'd've",
        "y'all'dve": "y'all'd've", "youd": "you'd", "youll": "you'll", "youre": "you're",
    })
    for pronoun in ("we", "she"):
        table[f"{pronoun}d've"] = table[f"{pronoun}'dve"] = f"{pronoun}'d've"
    return table


CONTRACTIONS = _contractions()


def eval_ai_tokenize(text: str) -> str:
    """Lower-case; delete ',' and '?'; "'s" -> " 's"; strip."""
    return text.lower().replace(",", "").replace("?", "").replace("'s", " 's").strip()


def strip_punctuation(text: str) -> str:
    """The VQA eval's punctuation rule (see the module docstring)."""
    has_digit_comma = _DIGIT_COMMA_DIGIT.search(text) is not None
    out = text
    for p in _PUNCTUATION:
        # the test reads the original text, the replacement edits the running output (as in the original)
        touches_space = (p + " ") in text or (" " + p) in text
        out = out.replace(p, "" if touches_space or has_digit_comma else " ")
    return _PERIOD_NOT_BEFORE_DIGIT.sub("", out, count=_MAX_PERIODS_REMOVED)


def digits_and_articles(text: str) -> str:
    """Number words -> digits, articles dropped, contractions restored; words joined by one space."""
    words = [_NUMBER_WORDS.get(w, w) for w in text.lower().split()]
    return " ".join(CONTRACTIONS.get(w, w) for w in words if w not in _ARTICLES)


def eval_ai_normalize(text: str) -> str:
    """lmms-eval's full ``EvalAIAnswerProcessor()(text)`` (TextVQA's scorer)."""
    text = eval_ai_tokenize(text).replace("\n", " ").replace("\t", " ").strip()
    return digits_and_articles(strip_punctuation(text))
