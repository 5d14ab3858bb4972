"""StopMatcher: stop strings found across streamed pieces; the answer ends before the stop string."""

from coverpruner.serving.stop import StopMatcher


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
