"""HostKV.prefault: the pages of a slot's first n tokens are committed on the caller's thread (so a later first
write, the staged request's move into that slot at its join, pays no page faults in the engine's step), and no
value anywhere in the buffers changes (it runs while the engine thread uses other slots, or even that one)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from coverpruner.engines import kv_buffers
from coverpruner.engines.kv_buffers import HostKV

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="MADV_POPULATE_WRITE is Linux's")


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_prefault_commits_the_slot_rows():
    heads, hd, capacity, rows = 8, 128, 1024, 512
    kv = HostKV(4, capacity, 1, heads, hd, np.dtype(np.float32))  # np.zeros: no page of it committed yet
    before = _rss_kib()
    kv.prefault(2, rows)
    grown = _rss_kib() - before
    if not kv_buffers._populate_ok:
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux < 5.14)")
    region_kib = 2 * heads * rows * hd * 4 // 1024  # key + value: H_kv runs of n * hd floats
    # at least the region (transparent huge pages may commit whole 2 MiB pages around it), not the whole cache
    assert 0.9 * region_kib <= grown < 2 * heads * capacity * hd * 4 * 4 // 1024, (grown, region_kib)


def test_prefault_changes_no_value():
    heads, hd = 4, 128
    kv = HostKV(3, 256, 2, heads, hd, np.dtype(np.float32))
    rng = np.random.default_rng(0)
    written = rng.standard_normal((heads, 16, hd)).astype(np.float32)
    other = rng.standard_normal((heads, 64, hd)).astype(np.float32)
    for pair in kv.kv:
        for buf in pair:
            buf[2, :, :16] = written  # the slot's first rows already hold values
            buf[1, :, :64] = other  # another slot in use
    kv.prefault(2, 200)
    for pair in kv.kv:
        for buf in pair:
            np.testing.assert_array_equal(buf[2, :, :16], written)
            np.testing.assert_array_equal(buf[1, :, :64], other)
            assert not buf[2, :, 16:].any() and not buf[1, :, 64:].any() and not buf[0].any()


def test_prefault_of_no_rows_and_cuda_are_no_ops():
    kv = HostKV(2, 64, 1, 2, 16, np.dtype(np.float32))
    kv.prefault(0, 0)
    assert not kv.kv[0][0].any()
    assert kv_buffers.CudaKV.prefault(None, 0, 10) is None  # device memory is committed when allocated


def test_state_prefault_commits_the_slot_and_changes_no_value():
    from coverpruner.engines.state_buffers import HostStates, StateSlot

    # a recurrent state [H_v, d_k, d_v]: 4 MiB per slot in float32, so the 2 MiB huge pages slot 0's writes
    # commit reach nothing of slot 3
    shape = (32, 128, 256)
    states = HostStates((StateSlot(0, "recurrent", "past_state.0", "present_state.0", shape, np.dtype(np.float32)),),
                        4)
    kept = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    states.arrays[0][0] = kept
    before = _rss_kib()
    states.prefault(3)
    grown = _rss_kib() - before
    if not kv_buffers._populate_ok:
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux < 5.14)")
    assert grown >= 0.9 * states.arrays[0][3].nbytes // 1024, grown
    np.testing.assert_array_equal(states.arrays[0][0], kept)
    assert not states.arrays[0][1:].any()
