"""HostKV.prefault / HostStates.prefault: the pages of a slot's first n tokens (its states) are committed on the
caller's thread, so a later first write (the staged request's move into that slot at its join) pays no page faults
in the engine's step, and no value anywhere in the buffers changes (it runs while the engine thread uses other
slots). Residency is read with mincore(2) on buffers backed by a fresh anonymous mapping (np.zeros may reuse heap
pages a long-lived process has touched already, which would make the 'before' state unknowable)."""

from __future__ import annotations

import ctypes
import mmap
import sys

import numpy as np
import pytest

from coverpruner.engines import kv_buffers
from coverpruner.engines.kv_buffers import HostKV
from coverpruner.engines.state_buffers import HostStates, StateSlot

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="MADV_POPULATE_WRITE and mincore are Linux's")

_maps = []  # the mappings behind the fresh arrays, kept alive for the tests' lifetime


def _fresh(shape, dtype=np.float32) -> np.ndarray:
    """Zeros in a new anonymous mapping: no page of it committed yet."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    m = mmap.mmap(-1, nbytes)
    _maps.append(m)
    return np.frombuffer(m, dtype).reshape(shape)


def _resident(a: np.ndarray) -> float:
    """Fraction of the pages under a's bytes (a contiguous view) that are resident."""
    page = mmap.PAGESIZE
    start = a.ctypes.data - a.ctypes.data % page
    pages = -(-(a.ctypes.data + a.nbytes - start) // page)
    vec = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(pages * page), vec) == 0, ctypes.get_errno()
    return sum(v & 1 for v in vec) / pages


def _need_populate():
    if not kv_buffers._populate_ok:
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux < 5.14)")


def test_prefault_commits_the_slot_rows_and_changes_no_value():
    heads, hd, capacity, rows = 8, 128, 1024, 512  # a slot: 4 MiB per buffer
    kv = HostKV(4, capacity, 1, heads, hd, np.dtype(np.float32))
    kv.kv = [[_fresh((4, heads, capacity, hd)) for _ in range(2)]]
    other = np.random.default_rng(0).standard_normal((heads, 64, hd)).astype(np.float32)
    for buf in kv.kv[0]:
        buf[0, :, :64] = other  # a slot in use, two slots away
        assert _resident(buf[2, 0, :rows]) == 0.0
    kv.prefault(2, rows)
    _need_populate()
    for buf in kv.kv[0]:
        assert all(_resident(buf[2, h, :rows]) == 1.0 for h in range(heads))  # every head's run of the n tokens
        np.testing.assert_array_equal(buf[0, :, :64], other)
        assert not buf[0, :, 64:].any() and not buf[1:].any()


def test_state_prefault_commits_the_slot_and_changes_no_value():
    shape = (32, 128, 256)  # a recurrent state [H_v, d_k, d_v]: 4 MiB per slot in float32
    states = HostStates((StateSlot(0, "recurrent", "past_state.0", "present_state.0", shape, np.dtype(np.float32)),),
                        4)
    states.arrays = [_fresh((4, *shape))]
    kept = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    states.arrays[0][0] = kept
    assert _resident(states.arrays[0][3]) == 0.0
    states.prefault(3)
    _need_populate()
    assert _resident(states.arrays[0][3]) == 1.0
    np.testing.assert_array_equal(states.arrays[0][0], kept)
    assert not states.arrays[0][1:].any()


def test_prefault_of_no_rows_and_cuda_are_no_ops():
    kv = HostKV(2, 64, 1, 2, 16, np.dtype(np.float32))
    kv.kv = [[_fresh((2, 2, 64, 16)) for _ in range(2)]]
    kv.prefault(0, 0)
    assert _resident(kv.kv[0][0]) == 0.0
    assert kv_buffers.CudaKV.prefault(None, 0, 10) is None  # device memory is committed when allocated
