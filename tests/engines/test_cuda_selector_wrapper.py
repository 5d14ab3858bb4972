"""The ctypes wrapper's argument handling that needs no GPU: relevance shapes (tensor or list, [n] or [B, n])."""

from __future__ import annotations

import pytest
import torch

from coverpruner.engines.cuda_selector import relevance_rows


def test_one_relevance_row_applies_to_every_problem_of_a_batch():
    r = relevance_rows([0.1, 0.5, 0.2], batch=4, n=3, device="cpu")
    assert r.shape == (4, 3) and r.dtype == torch.float32 and r.is_contiguous()
    assert torch.equal(r, torch.tensor([[0.1, 0.5, 0.2]] * 4))
    per_problem = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    assert torch.equal(relevance_rows(per_problem, 2, 3, "cpu"), per_problem.float())


@pytest.mark.parametrize("bad", [[0.1, 0.2], [[0.1, 0.2, 0.3]] * 3])
def test_wrong_relevance_shape_names_both_shapes_even_for_lists(bad):
    expected = r"relevance must be \[3\] or \[2, 3\] to match features \[2, 3, d\], got \[(2|3, 3)\]"
    with pytest.raises(ValueError, match=expected):
        relevance_rows(bad, batch=2, n=3, device="cpu")
