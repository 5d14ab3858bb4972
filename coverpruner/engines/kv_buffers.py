"""Where the ORT-form decoder's KV slots and rotary rows live: host memory (CPU provider) or CUDA device memory
(CUDA provider), behind one small interface that engines/ort_form_decoder.KVSlots drives.

Both hold, per layer, a key and a value buffer [B, H_kv, C, hd] in the graph's float dtype (float32 or float16)
and LANES cos / sin tables of R = max(C, B) rows [R, rd/2] (rd = hd, or the dims a partial rotary turns): a call's
rows are written at its table's start (row b*S + s for entry b's s-th new token; GroupQueryAttention wants the table
to have at least total_sequence_length rows, and a call has count*S <= R rows: one entry of up to C tokens, or up to
B entries of one token each). Each thread that runs calls has a lane (a table) of its own: the engine loop's decode
steps (lane 0) and the admission worker's prefill of a request into a slot beside them (lane 1) run at the same time
on different slots. A decoder whose layers rotate with further bases (contract v5 rotary "tables": Gemma 3's local
layers) gets one more cos / sin pair per base and lane, bound under that table's names (engine_dir.rotary_names),
allocated at its first call.

Slot b of a buffer is the contiguous [H_kv, C, hd] block at offset b*H_kv*C*hd, so slots first..first+count-1 are
one [count, H_kv, C, hd] tensor: bound as both past and present (GroupQueryAttention's
past_present_share_buffer: the kernel appends the new rows in place; ORT's CUDA kernel detects the sharing by
the two pointers being equal). A slot's first n tokens are H_kv runs of n*hd values C*hd apart, which the CUDA
side copies with one cudaMemcpy2D per layer and kind.

``CudaKV`` keeps everything on the device (engines/cudart.py, no torch): per call only the new rows' rotary
values go host -> device; snapshot / restore / slot moves copy just the cached prefix. Its copies run on its
own stream and are waited for before ORT runs (ORT's Run synchronises its own stream before returning).
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import sys

import numpy as np
import onnxruntime as ort

#: rotary tables, one per thread that runs decoder calls (0: the engine loop, 1: the admission worker's prefill)
LANES = 2
#: the ORT-form decoder's rotary inputs (a further rotary base's are engine_dir.rotary_names(k))
ROTARY = ("rotary_cos", "rotary_sin")


#: madvise advice that faults pages in writable without changing their contents (Linux >= 5.14)
_MADV_POPULATE_WRITE = 23
_populate_ok = sys.platform == "linux"


@functools.cache
def _libc() -> ctypes.CDLL:
    """The C library, loaded once (populate runs once per head run of every layer's key and value buffer)."""
    return ctypes.CDLL(None, use_errno=True)


def populate(address: int, length: int) -> None:
    """Fault the pages of [address, address + length) in now (their bytes unchanged); a no-op where the kernel
    cannot (other systems, Linux < 5.14): those pages then fault at their first write, as before."""
    global _populate_ok
    if not _populate_ok or length <= 0:
        return
    page = mmap.PAGESIZE
    start = address - address % page
    end = -(-(address + length) // page) * page
    if _libc().madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), _MADV_POPULATE_WRITE) != 0:
        _populate_ok = False


class HostKV:
    """KV slots and rotary table in numpy arrays (the CPU provider reads and writes them in place)."""

    device = "cpu"

    def __init__(self, batch: int, capacity: int, num_layers: int, num_kv_heads: int, head_dim: int,
                 dtype: np.dtype, rotary_dim: int | None = None):
        self.batch, self.capacity, self.h, self.hd, self.dtype = batch, capacity, num_kv_heads, head_dim, dtype
        shape = (batch, num_kv_heads, capacity, head_dim)
        #: [layer][key/value] -> [B, H_kv, C, hd]
        self.kv = [[np.zeros(shape, dtype) for _ in range(2)] for _ in range(num_layers)]
        self.rows = max(capacity, batch)
        half = (rotary_dim or head_dim) // 2  # the rotary tables' width (a partial rotary turns fewer dims)
        self.tables = [(np.zeros((self.rows, half), dtype), np.zeros((self.rows, half), dtype))
                       for _ in range(LANES)]
        self.cos, self.sin = self.tables[0]
        self.extra_tables: dict = {}  # (lane, (cos name, sin name)) -> tables of a further rotary base

    def bind_kv(self, binding, first: int, count: int, names) -> None:
        """Bind slots first..first+count-1 of every layer as past and present (names: [(past, present)] in
        layer-major key/value order)."""
        for (past, present), buf in zip(names, (b for pair in self.kv for b in pair)):
            value = ort.OrtValue.ortvalue_from_numpy(buf[first:first + count])  # a view: written in place
            binding.bind_ortvalue_input(past, value)
            binding.bind_ortvalue_output(present, value)

    def bind_rotary(self, binding, cos: np.ndarray, sin: np.ndarray, lane: int = 0,
                    names: tuple[str, str] = ROTARY) -> None:
        """Write this call's rows (cos, sin [n, hd/2]) at the start of the lane's table and bind the table as ``names``
        (a decoder with a second rotary base has a second table per lane: engine_dir.rotary_names)."""
        n = len(cos)
        if names == ROTARY:
            table_cos, table_sin = self.tables[lane]
        else:
            table_cos, table_sin = self.extra_tables.setdefault((lane, names), (np.zeros_like(self.cos),
                                                                                np.zeros_like(self.sin)))
        table_cos[:n], table_sin[:n] = cos, sin
        binding.bind_cpu_input(names[0], table_cos)
        binding.bind_cpu_input(names[1], table_sin)

    def copy_slot(self, src: int, dst: int, n: int) -> None:
        for pair in self.kv:
            for a in pair:
                a[dst, :, :n] = a[src, :, :n]

    def prefault(self, slot: int, n: int) -> None:
        """Fault in the pages of slot's first n tokens (contents unchanged; safe while another thread uses the slot).
        The buffers are np.zeros: their pages are mapped at their first write, and a first write into a never-used
        slot (a staged request's rows moved there when it joins) cost the engine's step 180-235 ms of page faults
        at LLaVA-7B widths (benchmarks/bench_serve.py --interleave); this moves that cost to the caller's thread
        (the admission worker), once per slot and range."""
        span = n * self.hd * self.dtype.itemsize
        for pair in self.kv:
            for buf in pair:
                base = buf.ctypes.data + slot * buf.strides[0]
                for h in range(self.h):
                    populate(base + h * buf.strides[1], span)

    def read(self, slot: int, n: int, start: int = 0) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
        """Copies of slot's tokens start..start+n-1: (keys, values), per layer [1, H_kv, n, hd]."""
        keys = tuple(np.ascontiguousarray(pair[0][slot:slot + 1, :, start:start + n]) for pair in self.kv)
        values = tuple(np.ascontiguousarray(pair[1][slot:slot + 1, :, start:start + n]) for pair in self.kv)
        return keys, values

    def write(self, slot: int, keys, values, start: int = 0) -> None:
        """Slot's tokens start..start+n-1 from per-layer [1, H_kv, n, hd] arrays."""
        for pair, k, v in zip(self.kv, keys, values):
            n = k.shape[2]
            pair[0][slot, :, start:start + n] = k[0]
            pair[1][slot, :, start:start + n] = v[0]


class CudaKV:
    """KV slots and rotary table in CUDA device memory (device 0, the CUDA provider's default), bound by address.

    Allocation: num_layers x 2 x B*H_kv*C*hd elements plus two [R, hd/2] tables, zeroed once (attention kernels
    may load past a slot's length; zeros keep those loads finite)."""

    device = "cuda"

    def __init__(self, batch: int, capacity: int, num_layers: int, num_kv_heads: int, head_dim: int,
                 dtype: np.dtype, rotary_dim: int | None = None):
        from coverpruner.engines import cudart  # libcudart through ctypes, only where a GPU runs

        self._cudart = cudart
        self.batch, self.capacity, self.h, self.hd, self.dtype = batch, capacity, num_kv_heads, head_dim, dtype
        self.item = np.dtype(dtype).itemsize
        self.slot_elems = num_kv_heads * capacity * head_dim
        self.stream = cudart.Stream()
        self.kv = [[cudart.DeviceBuffer(batch * self.slot_elems * self.item) for _ in range(2)]
                   for _ in range(num_layers)]
        self.rows = max(capacity, batch)
        self.half = (rotary_dim or head_dim) // 2  # the rotary tables' width (a partial rotary turns fewer dims)
        table = self.rows * self.half * self.item
        self.tables = [(cudart.DeviceBuffer(table), cudart.DeviceBuffer(table)) for _ in range(LANES)]
        self.cos, self.sin = self.tables[0]
        self.extra_tables: dict = {}  # (lane, (cos name, sin name)) -> device tables of a further base
        self.lane_streams = [self.stream] + [cudart.Stream() for _ in range(LANES - 1)]  # a lane's uploads
        for buf in (*(b for pair in self.kv for b in pair), *(b for pair in self.tables for b in pair)):
            buf.zero(self.stream)
        self.stream.synchronize()

    def _slot_ptr(self, buf, slot: int) -> int:
        return buf.ptr + slot * self.slot_elems * self.item

    def bind_kv(self, binding, first: int, count: int, names) -> None:
        shape = [count, self.h, self.capacity, self.hd]
        for (past, present), buf in zip(names, (b for pair in self.kv for b in pair)):
            ptr = self._slot_ptr(buf, first)
            binding.bind_input(past, "cuda", 0, self.dtype, shape, ptr)
            binding.bind_output(present, "cuda", 0, self.dtype, shape, ptr)  # same address: in-place update

    def bind_rotary(self, binding, cos: np.ndarray, sin: np.ndarray, lane: int = 0,
                    names: tuple[str, str] = ROTARY) -> None:
        shape = [self.rows, self.half]
        stream = self.lane_streams[lane]
        tables = self.tables[lane] if names == ROTARY else self.extra_tables.get((lane, names))
        if tables is None:  # a further rotary base's table, allocated at its first call
            size = self.rows * self.half * self.item
            tables = self.extra_tables[(lane, names)] = (self._cudart.DeviceBuffer(size),
                                                         self._cudart.DeviceBuffer(size))
            for buf in tables:
                buf.zero(stream)
        for name, buf, rows in zip(names, tables, (cos, sin)):
            buf.upload(np.ascontiguousarray(rows, self.dtype), stream)  # only this call's rows
            binding.bind_input(name, "cuda", 0, self.dtype, shape, buf.ptr)
        stream.synchronize()

    def _copy(self, dst: int, dst_pitch: int, src: int, src_pitch: int, n: int, kind: str) -> None:
        """H_kv runs of n tokens (n*hd values each)."""
        self._cudart.copy_2d(dst, dst_pitch, src, src_pitch, n * self.hd * self.item, self.h, kind, self.stream)

    def prefault(self, slot: int, n: int) -> None:
        """Nothing to do: device memory is committed when it is allocated."""

    def copy_slot(self, src: int, dst: int, n: int) -> None:
        pitch = self.capacity * self.hd * self.item
        for pair in self.kv:
            for buf in pair:
                self._copy(self._slot_ptr(buf, dst), pitch, self._slot_ptr(buf, src), pitch, n, "d2d")
        self.stream.synchronize()

    def read(self, slot: int, n: int, start: int = 0):
        pitch = self.capacity * self.hd * self.item
        skip = start * self.hd * self.item  # token `start` of each head's run
        out = ([], [])
        for pair in self.kv:
            for j, buf in enumerate(pair):
                host = np.empty((1, self.h, n, self.hd), self.dtype)
                self._copy(host.ctypes.data, n * self.hd * self.item, self._slot_ptr(buf, slot) + skip, pitch, n,
                           "d2h")
                out[j].append(host)
        self.stream.synchronize()
        return tuple(out[0]), tuple(out[1])

    def write(self, slot: int, keys, values, start: int = 0) -> None:
        pitch = self.capacity * self.hd * self.item
        skip = start * self.hd * self.item
        hosts = []  # kept alive until the stream is done with them
        for pair, k, v in zip(self.kv, keys, values):
            for buf, a in zip(pair, (k, v)):
                a = np.ascontiguousarray(a, self.dtype)
                hosts.append(a)
                n = a.shape[2]
                self._copy(self._slot_ptr(buf, slot) + skip, pitch, a.ctypes.data, n * self.hd * self.item, n,
                           "h2d")
        self.stream.synchronize()


def kv_buffers(device: str, *args, **kwargs) -> HostKV | CudaKV:
    """HostKV for device 'cpu', CudaKV for 'cuda' (args: batch, capacity, num_layers, num_kv_heads, head_dim,
    dtype; rotary_dim: the rotary tables' dims when a partial rotary turns fewer than head_dim)."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"KV device must be 'cpu' or 'cuda', got {device!r}")
    return HostKV(*args, **kwargs) if device == "cpu" else CudaKV(*args, **kwargs)
