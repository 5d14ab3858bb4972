"""StopMatcher: stop strings found across streamed pieces; the answer ends before the stop string."""

from coverpruner.runtime.stop import StopMatcher


def _run(pieces, stops):
    m, out = StopMatcher(stops), []
    for p in pieces:
        text, stopped = m.push(p)
        out.append(text)
        if stopped:
            return "".join(out), True
    return "".join(out) + m.flush(), False


def test_stop_inside_one_piece():
    assert _run(["hello wor", "ld END tail"], ["END"]) == ("hello world ", True)


def test_stop_spanning_pieces():
    assert _run(["abc E", "N", "D more"], ["END"]) == ("abc ", True)


def test_held_back_prefix_is_released_when_it_does_not_complete():
    assert _run(["abc E", "x", "yz"], ["END"]) == ("abc Exyz", False)


def test_earliest_of_several_stops_wins():
    assert _run(["one two three"], ["three", "two"]) == ("one ", True)


def test_no_stops_pass_everything():
    assert _run(["a", "b"], []) == ("ab", False)


def _literal(pieces, stops):
    """The rule read literally: after each piece, search the whole text so far (minus what was emitted) for each
    stop string, cut at the earliest start; hold back the longest tail that is a proper prefix of a stop string."""
    emitted, pending = [], ""
    for p in pieces:
        text = pending + p
        found = [i for i in (text.find(s) for s in stops if s) if i >= 0]
        if found:
            return "".join(emitted) + text[:min(found)], True
        hold = max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        emitted.append(text[:len(text) - hold])
        pending = text[len(text) - hold:]
    return "".join(emitted) + pending, False


def test_matcher_equals_the_literal_rule_on_random_streams():
    """Self-overlapping stop strings (aab, abab, aaa) over a small alphabet, split into random pieces: the
    incremental matcher cuts and holds back exactly as a full re-search of the text would."""
    import random

    rng = random.Random(3)
    for _ in range(400):
        stops = ["".join(rng.choice("ab") for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(1, 3))]
        text = "".join(rng.choice("abc") for _ in range(rng.randint(0, 30)))
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 6))))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        assert _run(pieces, stops) == _literal(pieces, stops), (pieces, stops)
