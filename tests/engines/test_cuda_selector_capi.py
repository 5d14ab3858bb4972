"""The C API of libcoverpruner_selector.so through the ctypes wrapper, on any machine with nvcc: symbols,
ABI check, workspace sizes, argument errors. Without a GPU the CUDA launch itself must fail cleanly."""

from __future__ import annotations

import pytest

from coverpruner.engines.cuda_selector import (
    CP_DTYPE_FLOAT16,
    CP_DTYPE_FLOAT32,
    CudaCoverageSelector,
    CudaSelectorError,
    find_selector_library,
)

from .conftest import GPU_AVAILABLE


def _up(x: int) -> int:
    return (x + 255) // 256 * 256


def _expected_workspace(b: int, n: int, d: int, elem: int) -> int:
    # normalized, similarity, weights, cover, gain (f32), gain_error (f32), fresh (f64), changed_row/old/new,
    # selected
    return (_up(b * n * d * elem) + _up(b * n * n * 4) + 4 * _up(b * n * 4) + _up(b * n * 8)
            + 3 * _up(b * n * 4) + _up(b * n))


@pytest.fixture(scope="module")
def selector(native_libs):
    assert native_libs.selector is not None
    return CudaCoverageSelector(native_libs.selector)


@pytest.mark.parametrize("b,n,d", [(1, 576, 4096), (4, 576, 5120), (1, 2880, 4096), (3, 7, 5)])
def test_workspace_size_matches_layout(selector, b, n, d):
    assert selector.workspace_size(b, n, d, CP_DTYPE_FLOAT32) == _expected_workspace(b, n, d, 4)
    assert selector.workspace_size(b, n, d, CP_DTYPE_FLOAT16) == _expected_workspace(b, n, d, 2)


def test_workspace_size_rejects_bad_dtype_and_overflow(selector):
    assert selector.lib.cp_coverage_workspace_size(1, 576, 4096, 7) == 0
    with pytest.raises(CudaSelectorError, match="no valid workspace"):
        selector.workspace_size(1 << 40, 1 << 20, 4, CP_DTYPE_FLOAT32)


def test_invalid_arguments_are_named(selector):
    with pytest.raises(CudaSelectorError, match=r"CP_ERR_INVALID_ARGUMENT.*n=-1"):
        selector.raw_select(0, CP_DTYPE_FLOAT32, None, 1, -1, 8, 4, 0.3, 0, None, 0)
    with pytest.raises(CudaSelectorError, match=r"CP_ERR_INVALID_ARGUMENT.*dtype must be"):
        selector.raw_select(0, 5, None, 1, 16, 8, 4, 0.3, 0, None, 0)
    with pytest.raises(CudaSelectorError, match=r"CP_ERR_INVALID_ARGUMENT.*non-NULL"):
        selector.raw_select(0, CP_DTYPE_FLOAT32, None, 1, 16, 8, 4, 0.3, 0, None, 0)


def test_too_small_workspace_is_reported(selector):
    fake = 1 << 20  # never dereferenced: the size check comes first
    need = selector.workspace_size(1, 16, 8)
    with pytest.raises(CudaSelectorError, match=rf"CP_ERR_WORKSPACE_TOO_SMALL.*needs {need} bytes, got 10"):
        selector.raw_select(fake, CP_DTYPE_FLOAT32, None, 1, 16, 8, 4, 0.3, fake, fake, 10)


def test_trivial_budgets_need_no_workspace(selector):
    # budget 0 (or an empty batch / no tokens) writes nothing and launches nothing: status OK with NULL features,
    # keep and workspace, even without a GPU
    lib = selector.lib
    for batch, n, budget in ((1, 16, 0), (0, 16, 4), (1, 0, 4)):
        status = lib.cp_coverage_select(0, CP_DTYPE_FLOAT32, None, batch, n, 8, budget, None, 0.3, None, 0, None,
                                        None, 0, None, None)
        assert status == 0, (batch, n, budget, lib.cp_last_error().decode())
    selector.raw_select(0, CP_DTYPE_FLOAT32, None, 1, 16, 8, 0, 0.3, 0, None, 0)  # the wrapper agrees: no raise
    # the short cut is taken only for those budgets: budget >= n still writes keep (so it must be given), and a
    # real budget validates its pointers before any launch
    with pytest.raises(CudaSelectorError, match=r"CP_ERR_INVALID_ARGUMENT.*keep must be a non-NULL"):
        selector.raw_select(0, CP_DTYPE_FLOAT32, None, 1, 16, 8, 16, 0.3, 0, None, 0)
    with pytest.raises(CudaSelectorError, match=r"CP_ERR_INVALID_ARGUMENT.*non-NULL"):
        selector.raw_select(0, CP_DTYPE_FLOAT32, None, 1, 16, 8, 4, 0.3, 0, None, 0)


@pytest.mark.skipif(GPU_AVAILABLE, reason="checks the error path of a machine without a CUDA GPU")
def test_launch_without_gpu_fails_cleanly(selector):
    fake = 1 << 20
    with pytest.raises(CudaSelectorError, match=r"CP_ERR_CUDA"):
        selector.raw_select(fake, CP_DTYPE_FLOAT32, None, 1, 16, 8, 64, 0.3, fake, None, 0)  # budget >= n: iota


def test_missing_library_says_how_to_build(tmp_path, monkeypatch):
    monkeypatch.delenv("COVERPRUNER_SELECTOR_LIB", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CudaSelectorError, match="cmake -S coverpruner/engines/csrc"):
        find_selector_library(tmp_path / "nope.so")


def test_batch_beyond_grid_limit_is_refused(selector):
    with pytest.raises(CudaSelectorError, match=r"batch must be <= 65535.*got 70000"):
        selector.raw_select(1 << 20, CP_DTYPE_FLOAT32, None, 70000, 16, 8, 4, 0.3, 1 << 20, 1 << 20, 1 << 30)
