"""The ORT-form decoder's host-built attention masks (contract v5, engines/attention_inputs.py) against the rule
written out one key at a time: AND(window, OR(causal, same block)) over each entry's cached and new rows."""

from __future__ import annotations

import numpy as np
import pytest

from coverpruner.engines.attention_inputs import AttentionInputs, attention_bias, bias_inputs


def literal(p: int, n: int, blocks, total: int, s_max: int, window) -> np.ndarray:
    """bool [s_max, total]: row s (absolute p + s) attends key k, written one pair at a time."""
    out = np.zeros((s_max, total), bool)
    for s in range(s_max):
        q = p + s
        for k in range(total):
            if s >= n:  # padding rows: causal in the window (their output is unused; never all masked)
                out[s, k] = k <= q and (window is None or k > q - window)
                continue
            same = blocks is not None and p <= k < p + n and blocks[k - p] >= 0 and blocks[k - p] == blocks[s]
            ok = k < p + n and (k <= q or same)
            out[s, k] = ok and (window is None or k > q - window)
    return out


@pytest.mark.parametrize("window", [None, 3, 6])
def test_bias_follows_the_rule(window):
    """Two entries: one with 2 cached rows and a block of 4 new rows straddling text, one a shorter first prompt
    (right-padded) with two blocks; window shorter and longer than the blocks."""
    blocks = [np.array([-1, 0, 0, 0, 0, -1, 1]), np.array([2, 2, -1, 3, 3])]
    starts, lengths = [2, 0], [7, 5]
    total = 9
    bias = attention_bias(starts, lengths, blocks, total, window, np.float32)
    assert bias.shape == (2, 1, 7, total) and bias.dtype == np.float32
    for b in range(2):
        want = literal(starts[b], lengths[b], blocks[b], total, 7, window)
        np.testing.assert_array_equal(bias[b, 0] == 0, want)
        assert np.all(bias[b, 0][~want] == np.finfo(np.float32).min)
    # a block row sees its block's later rows (both ways), a text row never does
    assert bias[0, 0, 1, 2 + 4] == 0 and bias[0, 0, 0, 2 + 1] < 0


def test_decode_rows_are_causal_and_windowed():
    bias = attention_bias([10, 4], [1, 1], None, 11, 4, np.float16)
    assert bias.dtype == np.float16
    np.testing.assert_array_equal(bias[0, 0, 0] == 0, np.arange(11) > 6)
    np.testing.assert_array_equal(bias[1, 0, 0] == 0, (np.arange(11) > 0) & (np.arange(11) <= 4))


def test_inputs_named_by_window():
    names = ["inputs_embeds", "attention_bias", "attention_bias.160", "rotary_cos", "rotary_cos.1", "rotary_sin.1"]
    assert bias_inputs(names) == {"attention_bias": None, "attention_bias.160": 160}
    inputs = AttentionInputs(names, {"theta": 1e6, "factor": 8.0, "tables": [{"theta": 1e4, "factor": 1.0}]}, 16)
    assert inputs.names == ("attention_bias", "attention_bias.160", "rotary_cos.1", "rotary_sin.1")
    (names_1, cos, sin), = inputs.table_rows(np.arange(5)[None])
    assert names_1 == ("rotary_cos.1", "rotary_sin.1") and cos.shape == sin.shape == (5, 8)
