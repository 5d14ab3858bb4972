"""Run serialized TensorRT engines with ONNX Runtime's call shape: `session.run(output_names, feed)`.

    factory = TrtSessionFactory("engine_dir")            # checks version / GPU against manifest "tensorrt"
    vision = factory("vision")                            # or factory("vision", onnx_path): runtime hook shape
    (features,) = vision.run(["image_features"], {"pixel_values": pixels})

Feeds are numpy arrays; outputs come back as numpy arrays. Device memory and the stream come from the CUDA
runtime through ctypes (cudart.py), so nothing here imports torch. Shape-tensor inputs (the selector's
`budget` in the loop form) live in host memory, as TensorRT requires; outputs whose size depends on data
(the plugin selector's `keep`) are allocated through an IOutputAllocator when TensorRT reports their size.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from coverpruner.engine_dir import DECODER_INPUTS, past_names, present_names, read_raw

from .cudart import DeviceBuffer, Stream
from .interfaces import KVSnapshot, check_snapshot, extra_feeds, extra_inputs
from .tensorrt import (
    ENGINE_SUFFIX,
    EngineMismatchError,
    TrtModule,
    check_engine_compat,
    detect_compute_capability,
    load_plugin_library,
    load_tensorrt,
    make,
)


class TrtSessionError(ValueError):
    """Bad feed (missing/extra name, wrong dtype or rank, shape outside the engine's profile)."""


@dataclass(frozen=True)
class TensorInfo:
    """ORT NodeArg look-alike: name, shape (-1 for dynamic axes) and numpy dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype


def _make_output_allocator(trt_mod):
    class _OutputAllocator(trt_mod.IOutputAllocator):
        """Allocates data-dependent outputs when TensorRT knows their size; remembers their final shape."""

        def __init__(self):
            trt_mod.IOutputAllocator.__init__(self)
            self.buffers: dict[str, DeviceBuffer] = {}
            self.shapes: dict[str, tuple[int, ...]] = {}

        def reallocate_output(self, tensor_name, memory, size, alignment):
            buf = self.buffers.setdefault(tensor_name, DeviceBuffer())
            return buf.ensure(size)

        def reallocate_output_async(self, tensor_name, memory, size, alignment, stream):
            return self.reallocate_output(tensor_name, memory, size, alignment)

        def notify_shape(self, tensor_name, shape):
            self.shapes[tensor_name] = tuple(shape)

    return _OutputAllocator()


class TrtSession:
    """One engine, one execution context, one stream. Not thread-safe (like a single ORT run at a time)."""

    def __init__(self, engine_path: str | Path, trt: TrtModule | None = None, expected_sha256: str | None = None,
                 plugin: str | Path | None = None, verbose: bool = False):
        self.trt = trt or load_tensorrt()
        mod = self.trt.module
        self.path = Path(engine_path)
        if not self.path.is_file():
            raise FileNotFoundError(f"engine {self.path} does not exist; build it with coverpruner-build")
        blob = self.path.read_bytes()
        if expected_sha256 is not None and hashlib.sha256(blob).hexdigest() != expected_sha256:
            raise EngineMismatchError(f"{self.path}: sha256 differs from manifest.json (engine rebuilt or "
                                      "corrupted; rerun coverpruner-build)")
        self._logger = mod.Logger(mod.Logger.VERBOSE if verbose else mod.Logger.WARNING)
        if plugin is not None:
            load_plugin_library(self.trt, Path(plugin), self._logger)
        self._runtime = make(self.trt, "Runtime", self._logger, f"run {self.path.name}")
        self.engine = self._runtime.deserialize_cuda_engine(blob)
        if self.engine is None:
            raise EngineMismatchError(f"{self.path}: TensorRT could not deserialize the engine (built by another "
                                      "TensorRT version or for another GPU? see the TensorRT log)")
        self.context = self.engine.create_execution_context()
        self.stream = Stream()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        is_input = {n: self.engine.get_tensor_mode(n) == mod.TensorIOMode.INPUT for n in names}
        self._inputs = [self._info(n) for n in names if is_input[n]]
        self._outputs = [self._info(n) for n in names if not is_input[n]]
        self._host_inputs = {n for n in names if is_input[n]
                             and self.engine.get_tensor_location(n) == mod.TensorLocation.HOST}
        self._buffers: dict[str, DeviceBuffer] = {}
        self._allocator = None

    def _info(self, name: str) -> TensorInfo:
        dtype = np.dtype(self.trt.module.nptype(self.engine.get_tensor_dtype(name)))
        return TensorInfo(name, tuple(self.engine.get_tensor_shape(name)), dtype)

    def decoder_loop(self, num_layers: int, num_kv_heads: int, head_dim: int, vocab_size: int, dtype=np.float32):
        """The runtime's hook: when this engine is the decoder, Pipeline runs its KV-cache loop on the GPU."""
        return TrtDecoderSession(self, num_layers, num_kv_heads, head_dim, vocab_size, dtype)

    def get_inputs(self) -> list[TensorInfo]:
        return list(self._inputs)

    def get_outputs(self) -> list[TensorInfo]:
        return list(self._outputs)

    def _check_feed(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        want = {i.name for i in self._inputs}
        missing, extra = sorted(want - feed.keys()), sorted(feed.keys() - want)
        if missing or extra:
            raise TrtSessionError(f"{self.path.name}: feed is missing {missing} and has unknown {extra}; "
                                  f"inputs are {sorted(want)}")
        out = {}
        for info in self._inputs:
            arr = np.asarray(feed[info.name])
            if arr.dtype != info.dtype:
                raise TrtSessionError(f"{self.path.name}: input {info.name!r} must be {info.dtype}, got {arr.dtype}")
            if arr.ndim != len(info.shape) or any(e >= 0 and e != g for e, g in zip(info.shape, arr.shape)):
                raise TrtSessionError(f"{self.path.name}: input {info.name!r} must have shape {list(info.shape)} "
                                      f"(-1 = any), got {list(arr.shape)}")
            out[info.name] = np.ascontiguousarray(arr)
        return out

    def run(self, output_names: list[str] | None, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Runs the engine; returns the requested outputs (all when output_names is None) as numpy arrays."""
        mod = self.trt.module
        feed = self._check_feed(feed)
        names = output_names or [o.name for o in self._outputs]
        known = {o.name for o in self._outputs}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise TrtSessionError(f"{self.path.name}: unknown outputs {unknown}; outputs are {sorted(known)}")
        host_keepalive = []
        for info in self._inputs:
            arr = feed[info.name]
            if not self.context.set_input_shape(info.name, tuple(arr.shape)):
                raise TrtSessionError(self._profile_message(info.name, arr.shape))
            if info.name in self._host_inputs:
                # shape tensors (the loop selector's budget): TensorRT reads their values on the host
                self._check_shape_values(info.name, arr)
                host_keepalive.append(arr)
                self.context.set_tensor_address(info.name, arr.ctypes.data)
            else:
                buf = self._buffers.setdefault(info.name, DeviceBuffer())
                buf.upload(arr, self.stream)
                self.context.set_tensor_address(info.name, buf.ptr)
        dynamic = []
        for info in self._outputs:
            shape = tuple(self.context.get_tensor_shape(info.name))
            if any(d < 0 for d in shape):
                dynamic.append(info.name)
                continue
            buf = self._buffers.setdefault(info.name, DeviceBuffer())
            buf.ensure(int(np.prod(shape)) * info.dtype.itemsize)
            self.context.set_tensor_address(info.name, buf.ptr)
        if dynamic:
            if self._allocator is None:
                self._allocator = _make_output_allocator(mod)
            for name in dynamic:
                self.context.set_output_allocator(name, self._allocator)
        if not self.context.execute_async_v3(self.stream.handle):
            raise TrtSessionError(f"{self.path.name}: TensorRT execution failed (see the TensorRT log)")
        results = []
        for name in names:
            info = next(o for o in self._outputs if o.name == name)
            if name in dynamic:
                shape = self._allocator.shapes[name]
                buf = self._allocator.buffers[name]
            else:
                shape = tuple(self.context.get_tensor_shape(name))
                buf = self._buffers[name]
            results.append(buf.download(np.empty(shape, info.dtype), self.stream))
        self.stream.synchronize()
        del host_keepalive
        return results

    def _check_shape_values(self, name: str, arr: np.ndarray) -> None:
        lo, _, hi = self.engine.get_tensor_profile_values(0, name)
        flat = arr.reshape(-1)
        if any(v < a or v > b for v, a, b in zip(flat, lo, hi)):
            raise TrtSessionError(f"{self.path.name}: input {name!r} = {flat.tolist()} is outside the engine's "
                                  f"profile (min {list(lo)}, max {list(hi)}); rebuild with coverpruner-build "
                                  "--budgets covering it")

    def _profile_message(self, name: str, shape) -> str:
        lo, opt, hi = self.engine.get_tensor_profile_shape(name, 0)
        return (f"{self.path.name}: input {name!r} shape {list(shape)} is outside the engine's profile "
                f"(min {list(lo)}, max {list(hi)}); rebuild with coverpruner-build --max-context/--max-batch/--shape")


class TrtSessionFactory:
    """Sessions for the engines of one engine dir, after checking them against this machine.

    Call as factory(graph) or factory(graph, onnx_path) (the runtime's session_factory(name, path) hook; the
    ONNX path is ignored in favour of DIR/<graph>.engine recorded in the manifest).
    """

    def __init__(self, engine_dir: str | Path, trt: TrtModule | None = None, verbose: bool = False):
        self.engine_dir = Path(engine_dir)
        self.manifest = read_raw(self.engine_dir)  # ManifestError (one line) when missing or unreadable
        self.trt = trt or load_tensorrt(self.manifest.get("tensorrt", {}).get("flavour"))
        self.section = self.manifest.get("tensorrt")
        compute_capability = detect_compute_capability()
        check_engine_compat(self.section, self.trt.flavour, self.trt.version, compute_capability)
        if compute_capability is None:  # engines built without a GPU (TensorRT-RTX) still need one to run
            raise EngineMismatchError(f"{self.engine_dir}: TensorRT engines run on a CUDA GPU and none is usable "
                                      "here (no CUDA device or driver), so provider 'cuda' cannot run either; use provider 'cpu' (an "
                                      "engine dir exported for the CPU: docs/usage.md)")
        plugin = self.section.get("plugin")
        self.plugin = self.engine_dir / plugin["file"] if plugin else None
        self.verbose = verbose

    def __call__(self, graph: str, onnx_path: Any = None) -> TrtSession:
        rec = self.section["engines"].get(graph)
        if rec is None:
            raise EngineMismatchError(f"no TensorRT engine for graph {graph!r} in {self.engine_dir / 'manifest.json'}"
                                      f" (built: {sorted(self.section['engines'])})")
        return TrtSession(self.engine_dir / rec["file"], self.trt, expected_sha256=rec.get("sha256"),
                          plugin=self.plugin, verbose=self.verbose)


def engine_path(engine_dir: str | Path, graph: str) -> Path:
    return Path(engine_dir) / f"{graph}{ENGINE_SUFFIX}"


class TrtDecoderSession:
    """The decoder engine with its KV cache kept on the GPU: a `coverpruner.engines.interfaces.DecoderLoop`,
    the TensorRT twin of engines/ort_decoder.OrtDecoderSession.

    Each layer's key and value own two device buffers sized for the whole request; step t reads `past` from
    one and TensorRT writes `present` ([1, H_kv, P+S, hd], contiguous) straight into the other, so the cache
    never leaves the device. Only the new tokens' embeddings/positions go up and the logits row comes down.
    The cached prefix is the first H_kv*P*hd elements of the current buffers: `snapshot` copies it to the host,
    `restore` copies it back.
    """

    def __init__(self, session: TrtSession, num_layers: int, num_kv_heads: int, head_dim: int, vocab_size: int,
                 dtype=np.float32):
        self.session = session
        self.num_layers, self.h, self.hd, self.vocab_size = num_layers, num_kv_heads, head_dim, vocab_size
        self.dtype = np.dtype(dtype)
        order = [i.name for i in session.get_inputs()]
        missing = sorted({*DECODER_INPUTS, *past_names(num_layers)} - set(order))
        if missing:
            raise TrtSessionError(f"decoder engine lacks inputs {missing[:4]}")
        self._past, self._present = past_names(num_layers), present_names(num_layers)
        #: the decoder extras (contract v4) the engine takes besides embeddings, positions and KV
        self.extra_names = extra_inputs(order, (*DECODER_INPUTS, *self._past))
        self._extras = {name: DeviceBuffer() for name in self.extra_names}
        self.capacity = 0
        self.length = 0
        self._cur = 0
        self._kv: list = []
        self._mask = DeviceBuffer()
        self._embeds, self._positions, self._logits_dev = DeviceBuffer(), DeviceBuffer(), DeviceBuffer()

    def reset(self, capacity: int) -> None:
        """Empty the cache; buffers grow to `capacity` tokens (and are reused when large enough)."""
        if capacity > self.capacity:
            nbytes = self.h * capacity * self.hd * self.dtype.itemsize
            self._kv = [[[DeviceBuffer(nbytes) for _ in range(2)] for _ in range(2)] for _ in range(self.num_layers)]
            self._mask.upload(np.ones(capacity, np.int64), self.session.stream)
            self.capacity = capacity
        self._logits = np.empty((1, 1, self.vocab_size), self.dtype)
        self._cur = 0
        self.length = 0

    def forward(self, inputs_embeds: np.ndarray, position_ids: np.ndarray,
                extras: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """Append S tokens: inputs_embeds [1, S, d] (cache dtype), position_ids int64 [1, S] or [R, 1, S], decoder
        extras {name: [1, S, d]} (contract v4; zeros for those not given). Returns logits [V]."""
        ctx, stream = self.session.context, self.session.stream
        s = inputs_embeds.shape[1]
        total = self.length + s
        if total > self.capacity:
            raise TrtSessionError(f"KV cache holds {self.capacity} tokens; {total} requested")
        embeds = np.ascontiguousarray(inputs_embeds, dtype=self.dtype)
        positions = np.ascontiguousarray(position_ids, dtype=np.int64)
        shapes = {"inputs_embeds": embeds.shape, "position_ids": positions.shape, "attention_mask": (1, total)}
        self._embeds.upload(embeds, stream)
        self._positions.upload(positions, stream)
        addresses = {"inputs_embeds": self._embeds.ptr, "position_ids": self._positions.ptr,
                     "attention_mask": self._mask.ptr}
        try:
            feeds = extra_feeds(self.extra_names, extras, embeds)
        except ValueError as exc:
            raise TrtSessionError(str(exc)) from None
        for name, value in feeds.items():  # zeros at decode steps: [1, 1, d] uploads
            self._extras[name].upload(value, stream)
            shapes[name], addresses[name] = value.shape, self._extras[name].ptr
        src, dst = self._cur, 1 - self._cur
        for i in range(self.num_layers):
            for j in range(2):  # key, value
                past, present = self._past[2 * i + j], self._present[2 * i + j]
                shapes[past] = (1, self.h, self.length, self.hd)
                addresses[past] = self._kv[i][j][src].ptr
                addresses[present] = self._kv[i][j][dst].ptr
        for name, shape in shapes.items():
            if not ctx.set_input_shape(name, tuple(shape)):
                raise TrtSessionError(self.session._profile_message(name, shape))
        self._logits_dev.ensure(self._logits.nbytes)
        addresses["logits"] = self._logits_dev.ptr
        for name, ptr in addresses.items():
            ctx.set_tensor_address(name, ptr)
        if not ctx.execute_async_v3(stream.handle):
            raise TrtSessionError("decoder engine: TensorRT execution failed (see the TensorRT log)")
        self._logits_dev.download(self._logits, stream)
        stream.synchronize()
        self._cur, self.length = dst, total
        return self._logits[0, -1]

    def snapshot(self) -> KVSnapshot:
        """Host copies of the cached prefix: per layer key and value [1, H_kv, P, hd] (P = length)."""
        stream = self.session.stream
        keys, values = [], []
        for i in range(self.num_layers):
            for j, out in enumerate((keys, values)):
                arr = np.empty((1, self.h, self.length, self.hd), self.dtype)
                if self.length:
                    self._kv[i][j][self._cur].download(arr, stream)
                out.append(arr)
        stream.synchronize()
        return KVSnapshot(self.length, tuple(keys), tuple(values))

    def restore(self, snapshot: KVSnapshot) -> None:
        """Upload the snapshot's prefix into the current buffers; the cache then holds snapshot.length tokens."""
        check_snapshot(snapshot, self.num_layers, self.h, self.hd, self.dtype, self.capacity)
        stream = self.session.stream
        if snapshot.length:
            for i in range(self.num_layers):
                for j, arrays in enumerate((snapshot.keys, snapshot.values)):
                    self._kv[i][j][self._cur].upload(arrays[i], stream)
        stream.synchronize()  # the host arrays may go away once restore returns
        self.length = snapshot.length
