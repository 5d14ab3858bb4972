"""Greedy / temperature / top-p sampling."""

import numpy as np
import pytest

from coverpruner.runtime.errors import OptionError
from coverpruner.runtime.sampling import Sampler, SamplingConfig, top_p_filter


def test_greedy_takes_lowest_index_on_ties():
    logits = np.array([0.1, 3.0, -1.0, 3.0], np.float32)
    assert Sampler(SamplingConfig())(logits) == 1
    assert Sampler(SamplingConfig())(logits.astype(np.float16)) == 1


def test_temperature_sampling_follows_softmax_and_seed_reproduces():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    cfg = SamplingConfig(temperature=1.0, seed=123)
    draws = [Sampler(cfg)(logits) for _ in range(3)]
    assert len(set(draws)) == 1  # same seed, same first draw
    s = Sampler(cfg)
    counts = np.bincount([s(logits) for _ in range(20000)], minlength=4) / 20000
    np.testing.assert_allclose(counts, [0.5, 0.3, 0.15, 0.05], atol=0.015)
    # a lower temperature sharpens towards the argmax
    s = Sampler(SamplingConfig(temperature=0.25, seed=1))
    assert np.mean([s(logits) == 0 for _ in range(2000)]) > 0.85


def test_top_p_keeps_smallest_prefix_reaching_mass():
    p = np.array([0.1, 0.4, 0.2, 0.3])
    np.testing.assert_allclose(top_p_filter(p, 0.5), [0, 0.4 / 0.7, 0, 0.3 / 0.7])
    np.testing.assert_allclose(top_p_filter(p, 0.39), [0, 1, 0, 0])
    np.testing.assert_allclose(top_p_filter(p, 0.41), [0, 0.4 / 0.7, 0, 0.3 / 0.7])
    np.testing.assert_allclose(top_p_filter(p, 1.0), p)
    s = Sampler(SamplingConfig(temperature=1.0, top_p=0.5, seed=0))
    assert {s(np.log(p)) for _ in range(300)} == {1, 3}


@pytest.mark.parametrize("kw", [dict(temperature=-1), dict(top_p=0), dict(top_p=1.5)])
def test_bad_options(kw):
    with pytest.raises(OptionError):
        SamplingConfig(**kw)


# -- issue 40: sampling is total over every accepted temperature ------------------------------------------------

F32_MAX = float(np.finfo(np.float32).max)
#: every accepted temperature that once broke or borders the greedy floor (GREEDY_BELOW = 1e-5), and the range's ends
TEMPERATURES = [0.0, 5e-324, 1e-310, 1e-300, 1e-30, 9.99e-6, 1e-5, 1e-3, 1.0, 2.0, 1e6]
#: logit rows at float32's extremes (the decoder's output dtype), with ties and -inf (a grammar's masked tokens)
ROWS = {
    "extremes": [F32_MAX, -F32_MAX, 0.0, F32_MAX * 0.5],
    "ties_at_max": [1.0, F32_MAX, F32_MAX, -3.0],
    "tiny_gaps": [0.0, 1e-30, -1e-30, 0.0],
    "masked": [-np.inf, 5.0, -np.inf, 4.0],
    "one_finite": [-np.inf, -np.inf, -F32_MAX, -np.inf],
}


@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("row", list(ROWS), ids=list(ROWS))
def test_every_accepted_temperature_gives_a_valid_choice(temperature, row):
    """Issue 40: temperature 1e-310 divided float32 logits into inf and the softmax into NaN ("Probabilities contain
    NaN", a 500 for its whole batch). Every accepted temperature now draws from a valid distribution: the token is
    one with a finite logit, and below the floor it is the argmax (lowest id on ties), as greedy."""
    from coverpruner.runtime.sampling import GREEDY_BELOW

    logits = np.array(ROWS[row], np.float32)
    finite = set(np.flatnonzero(np.isfinite(logits)).tolist())
    s = Sampler(SamplingConfig(temperature=temperature, seed=7))
    draws = {s(logits) for _ in range(50)}
    assert draws <= finite, (draws, finite)
    # the literal argmax of each row (lowest id on ties)
    argmax = {"extremes": 0, "ties_at_max": 1, "tiny_gaps": 1, "masked": 1, "one_finite": 2}[row]
    if temperature < GREEDY_BELOW:
        assert draws == {argmax}
    if row in ("extremes", "masked", "one_finite") and temperature <= 1e-3:
        # a gap of >= 1 at T <= 1e-3 is a ratio below e^-1000: the argmax always
        assert draws == {argmax}


def test_sampling_under_a_mask_and_adjustments_at_tiny_temperature():
    """Penalties and logit_bias make the row float64 (values beyond float32's range once biased); a grammar's mask
    leaves one token: the choice is still that token at every temperature."""
    logits = np.array([F32_MAX, -F32_MAX, 3.0, 2.0], np.float32)
    allowed = np.array([False, True, False, False])
    for t in TEMPERATURES:
        s = Sampler(SamplingConfig(temperature=t, seed=0, logit_bias={1: -100.0, 0: 100.0}, frequency_penalty=2.0))
        assert [s(logits, allowed) for _ in range(5)] == [1] * 5


def test_nan_logits_fail_that_answer_with_a_typed_error():
    from coverpruner.errors import CODES
    from coverpruner.runtime.errors import SamplingError

    for t in (0.0, 1.0):
        with pytest.raises(SamplingError) as info:
            Sampler(SamplingConfig(temperature=t))(np.array([0.0, np.nan, 1.0], np.float32))
        assert info.value.code == "sampling_failed" and info.value.code in CODES
    with pytest.raises(SamplingError):
        Sampler(SamplingConfig(temperature=1.0))(np.full(3, -np.inf, np.float32))
