"""VQA answer normalization (lmms-eval's EvalAI processor) against hand-worked cases."""

import pytest

from coverpruner.evaluation.answer_processing import digits_and_articles, eval_ai_normalize, strip_punctuation


@pytest.mark.parametrize("raw, expected", [
    ("Yes.", "yes"),               # case and the final period
    ("yes", "yes"),
    ("Two dogs.", "2 dogs"),       # number words become digits
    ("none", "0"),
    ("ten", "10"),
    ("eleven", "eleven"),          # only zero..ten
    ("The cat", "cat"),            # articles dropped
    ("an apple", "apple"),
    ("A", ""),                     # a lone "A" is an article too
    ("dont", "don't"),             # contractions get their apostrophe
    ("isnt it", "isn't it"),
    ("3.5", "3.5"),                # a period before a digit stays
    ("1,000", "1000"),             # ',' is deleted by the tokenize step
    ("man's hat", "man 's hat"),   # "'s" is split off (TextVQA's full processor)
    ("red/blue", "red blue"),      # '/' inside a word -> space
    ("red / blue", "red blue"),    # '/' next to a space -> deleted, spaces collapse
    ("What?", "what"),
    ("  two\tcats\n", "2 cats"),
    ("", ""),
])
def test_eval_ai_normalize(raw, expected):
    assert eval_ai_normalize(raw) == expected


def test_punctuation_rule_depends_on_spaces_and_digit_commas():
    assert strip_punctuation("a-b") == "a b"
    assert strip_punctuation("a - b") == "a  b"          # deleted, the spaces stay until words are re-joined
    assert strip_punctuation("1,000 a-b") == "1000 ab"   # a digit,digit group anywhere: every mark is deleted
    assert strip_punctuation("end.") == "end"
    assert strip_punctuation("v2.0") == "v2.0"


def test_at_most_32_periods_are_removed():
    # lmms-eval passes re.UNICODE (32) as re.sub's count: the 33rd period onwards survives
    assert strip_punctuation("." * 40) == "." * 8


def test_digits_and_articles_lowercases_and_keeps_apostrophes():
    assert digits_and_articles("The Man's TWO hats") == "man's 2 hats"
    assert digits_and_articles("somebody'd") == "somebodyd"  # the original table's backwards entry
