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
