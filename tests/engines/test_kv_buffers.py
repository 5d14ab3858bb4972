"""CudaKV's address arithmetic without a GPU: libcudart replaced by host memory with cudaMemcpy2D's documented
semantics (`rows` rows of `width` bytes, each `pitch` bytes after the previous one, in source and destination),
written here from the CUDA documentation, not from kv_buffers. Every write / read / slot move / binding of CudaKV
must address the same elements as HostKV's numpy slices of [B, H_kv, C, hd] buffers. (On a GPU the same is checked
against real device memory: test_ort_form_fp16.py::test_cuda_kv_buffers_hold_what_was_written.)"""

from __future__ import annotations

import ctypes
import types

import numpy as np
import pytest

from coverpruner.engines import kv_buffers
from coverpruner.engines.kv_buffers import CudaKV, HostKV


class _HostBuffer:
    """A 'device' allocation in host memory (a numpy byte array; .ptr its address)."""

    def __init__(self, nbytes: int):
        self.mem = np.full(max(nbytes, 1), 0x5C, np.uint8)  # not zero: CudaKV must zero it itself
        self.ptr, self.nbytes = self.mem.ctypes.data, nbytes

    def zero(self, stream) -> None:
        self.mem[:] = 0

    def upload(self, array: np.ndarray, stream) -> None:
        raw = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        assert raw.nbytes <= self.nbytes, "upload past the allocation"
        self.mem[:raw.nbytes] = raw


def _copy_2d(dst, dst_pitch, src, src_pitch, width, rows, kind, stream):
    assert kind in ("h2d", "d2h", "d2d") and width <= dst_pitch and width <= src_pitch
    for r in range(rows):
        ctypes.memmove(dst + r * dst_pitch, src + r * src_pitch, width)


@pytest.fixture
def fake_cudart(monkeypatch):
    fake = types.SimpleNamespace(DeviceBuffer=_HostBuffer, copy_2d=_copy_2d,
                                 Stream=lambda: types.SimpleNamespace(synchronize=lambda: None))
    # CudaKV imports it as `from coverpruner.engines import cudart`: the package attribute is what it gets
    monkeypatch.setattr("coverpruner.engines.cudart", fake, raising=False)
    return fake


class _Binding:
    def __init__(self):
        self.bound = {}

    def bind_input(self, name, device, device_id, dtype, shape, ptr):
        self.bound[name] = (device, np.dtype(dtype), tuple(shape), ptr)

    bind_output = bind_input


def _view(dev: CudaKV, ptr: int, shape, dtype) -> np.ndarray:
    """The elements a binding at `ptr` of `shape` addresses inside one of dev's allocations."""
    for buf in (*(b for pair in dev.kv for b in pair), dev.cos, dev.sin):
        if buf.ptr <= ptr < buf.ptr + buf.nbytes:
            off = ptr - buf.ptr
            n = int(np.prod(shape)) * np.dtype(dtype).itemsize
            assert off + n <= buf.nbytes, "binding runs past its allocation"
            return buf.mem[off:off + n].view(dtype).reshape(shape)
    raise AssertionError(f"address {ptr:#x} is in no allocation")


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_cuda_kv_addresses_what_host_kv_slices(fake_cudart, dtype):
    rng = np.random.default_rng(3)
    b, c, layers, h, hd = 4, 9, 2, 3, 16
    dev, host = CudaKV(b, c, layers, h, hd, np.dtype(dtype)), HostKV(b, c, layers, h, hd, np.dtype(dtype))
    for buf in (*(x for pair in dev.kv for x in pair), dev.cos, dev.sin):
        assert not buf.mem.any()  # zeroed at allocation
    for slot, n in ((0, 5), (3, 9), (2, 1)):
        keys = tuple(rng.standard_normal((1, h, n, hd)).astype(dtype) for _ in range(layers))
        values = tuple(rng.standard_normal((1, h, n, hd)).astype(dtype) for _ in range(layers))
        dev.write(slot, keys, values)
        host.write(slot, keys, values)
        for got, want in zip(dev.read(slot, n), (keys, values)):
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)
    # a block of rows written and read at an offset (the prefix cache's blocks, runtime/prefix_cache.py)
    keys = tuple(rng.standard_normal((1, h, 3, hd)).astype(dtype) for _ in range(layers))
    values = tuple(rng.standard_normal((1, h, 3, hd)).astype(dtype) for _ in range(layers))
    dev.write(3, keys, values, start=4)
    host.write(3, keys, values, start=4)
    for got, want in zip(dev.read(3, 5, start=2), host.read(3, 5, start=2)):
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(host.read(3, 3, start=4)[0][0], keys[0])
    dev.copy_slot(3, 1, 7)
    host.copy_slot(3, 1, 7)
    names = [(f"past.{i}", f"present.{i}") for i in range(2 * layers)]
    binding = _Binding()
    dev.bind_kv(binding, 1, 3, names)
    for (past, present), want in zip(names, (x for pair in host.kv for x in pair)):
        assert binding.bound[past] == binding.bound[present]  # the same address: past_present_share_buffer
        device, dt, shape, ptr = binding.bound[past]
        assert device == "cuda" and dt == np.dtype(dtype) and shape == (3, h, c, hd)
        np.testing.assert_array_equal(_view(dev, ptr, shape, dt), want[1:4])  # every element, slots 1..3
    cos, sin = rng.standard_normal((2, 6, hd // 2)).astype(dtype)
    dev.bind_rotary(binding, cos, sin)
    for name, want in (("rotary_cos", cos), ("rotary_sin", sin)):
        device, dt, shape, ptr = binding.bound[name]
        assert shape == (max(c, b), hd // 2)
        np.testing.assert_array_equal(_view(dev, ptr, shape, dt)[:6], want)


def test_unknown_device_is_one_line():
    with pytest.raises(ValueError, match="KV device must be 'cpu' or 'cuda', got 'gpu'"):
        kv_buffers.kv_buffers("gpu", 1, 1, 1, 1, 16, np.dtype(np.float32))
