"""The session interfaces the runtime drives, declared once; every engine backend implements them.

* ``GraphSession``: one graph (vision, embed, probe, selector). onnxruntime.InferenceSession satisfies it
  as is; engines/trt_session.TrtSession implements it for native TensorRT engines.
* ``DecoderLoop``: the decoder graph plus its KV cache for one request at a time: reset, forward, and a
  snapshot / restore of the cached prefix (what prefix reuse across requests builds on).
  engines/ort_decoder.OrtDecoderSession (ORT IO binding) and engines/trt_session.TrtDecoderSession (cache on
  the GPU) implement it. A GraphSession that brings its own loop offers ``decoder_loop(num_layers,
  num_kv_heads, head_dim, vocab_size, dtype) -> DecoderLoop``; the runtime uses it instead of the ORT loop.
* ``SessionFactory``: ``factory(graph_name, onnx_path) -> GraphSession`` (engines/ort.OrtSessionFactory,
  engines/trt_session.TrtSessionFactory), the ``session_factory`` hook of ``Pipeline.load``.

Tensor names are the engine dir's (coverpruner.engine_dir).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from coverpruner.engine_dir import ATTENTION_BLOCKS


@runtime_checkable
class GraphSession(Protocol):
    def run(self, output_names: list[str] | None, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Run once: numpy inputs by name -> the named outputs (all outputs for None), as numpy arrays."""

    def get_inputs(self) -> list:
        """Input descriptors, each with ``.name`` (and ``.shape`` / ``.type`` where the backend has them)."""


@dataclass(frozen=True)
class KVSnapshot:
    """A host copy of a decoder's cached prefix: the first ``length`` (P) tokens of every KV layer, and (contract v5)
    every state that is not KV as it stands after those P tokens.

    keys, values: one array per KV layer, each [1, H_kv, P, hd] in the cache's float dtype (C-contiguous, owned
    by the snapshot: later forwards do not change it). states: one array per decoder state and layer, each
    [1, *shape] in its own dtype (graph order: engine_dir.state_names); empty for a decoder without states. A
    snapshot with states is only valid at exactly ``length`` tokens: unlike KV rows, a state cannot be cut back.
    """

    length: int
    keys: tuple[np.ndarray, ...]
    values: tuple[np.ndarray, ...]
    states: tuple[np.ndarray, ...] = ()

    @property
    def nbytes(self) -> int:
        """Host bytes held (what a bounded prefix cache counts)."""
        return sum(a.nbytes for a in (*self.keys, *self.values, *self.states))


def check_snapshot(snap: KVSnapshot, num_layers: int, num_kv_heads: int, head_dim: int, dtype: np.dtype,
                   capacity: int, states: tuple = ()) -> None:
    """ValueError (one line) unless ``snap`` fits a cache of this geometry, dtype and capacity (num_layers: the KV
    layers) and, for a decoder with states, holds one array of each (StateSlot items: shape, dtype)."""
    want = (1, num_kv_heads, snap.length, head_dim)
    if len(snap.keys) != num_layers or len(snap.values) != num_layers:
        raise ValueError(f"KV snapshot has {len(snap.keys)} key / {len(snap.values)} value layers; "
                         f"the decoder has {num_layers}")
    for a in (*snap.keys, *snap.values):
        if a.shape != want or a.dtype != dtype:
            raise ValueError(f"KV snapshot array is {a.dtype} {list(a.shape)}; the cache takes {dtype} {list(want)}")
    if len(snap.states) != len(states):
        raise ValueError(f"KV snapshot holds {len(snap.states)} decoder states; the decoder has {len(states)}")
    for a, slot in zip(snap.states, states):
        if a.shape != (1, *slot.shape) or a.dtype != slot.dtype:
            raise ValueError(f"KV snapshot state {slot.past!r} is {a.dtype} {list(a.shape)}; the decoder takes "
                             f"{slot.dtype} {[1, *slot.shape]}")
    if snap.length > capacity:
        raise ValueError(f"KV cache holds {capacity} tokens; the snapshot has {snap.length} (reset to a larger "
                         "capacity first)")


@runtime_checkable
class DecoderLoop(Protocol):
    #: tokens already in the cache (P)
    length: int
    #: tokens the buffers hold (set by reset)
    capacity: int

    def reset(self, capacity: int) -> None:
        """Empty the cache and make room for ``capacity`` tokens (prompt + generated) of one request."""

    def forward(self, inputs_embeds: np.ndarray, position_ids: np.ndarray,
                extras: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """Append S tokens: inputs_embeds float [1, S, d] (graph float dtype), position_ids int64 [1, S] (rank 1)
        or [R, 1, S] (rank R, M-RoPE). extras: the decoder extras (contract v4, graphs.decoder.extras) by input
        name, float [1, S, d] aligned with the fed rows; an extra input not given is fed zeros (decode steps).
        Returns the last position's logits float [V] (valid until the next call)."""

    def snapshot(self) -> KVSnapshot:
        """A host copy of the cached prefix (its ``length`` tokens); the cache itself is unchanged."""

    def restore(self, snapshot: KVSnapshot) -> None:
        """Make the cache hold exactly the snapshot's prefix (length = snapshot.length); the next forward
        continues after it as if those tokens had just been run. Keeps the capacity (``reset`` first to size
        the buffers for the request); ValueError (one line) when the snapshot does not fit."""


def extra_inputs(input_names, fixed) -> tuple[str, ...]:
    """The decoder graph's extra per-row inputs (contract v4): its inputs besides ``fixed`` (embeddings,
    positions / rotary, KV) and its states (contract v5: past_key_values.N.<state>), in graph order. The engines
    feed them by name and never ask the family."""
    fixed = set(fixed)
    return tuple(n for n in input_names if n not in fixed and not n.startswith("past_key_values."))


def extra_feeds(names, extras: dict | None, like: np.ndarray) -> dict[str, np.ndarray]:
    """{name: float [B, S, d]} for every extra input: the given array (cast to ``like``'s dtype, C-contiguous) or
    zeros shaped like ``like`` (inputs_embeds) where none is given; the standard form's attention_blocks (contract
    v5) int64 [B, S], -1 (text rows) where not given. ValueError (one line) for a name the graph does not take or a
    shape that is not inputs_embeds'."""
    extras = extras or {}
    unknown = sorted(set(extras) - set(names))
    if unknown:
        raise ValueError(f"decoder extras {unknown} are no inputs of the decoder graph (it takes {list(names)})")
    out = {}
    for name in names:
        given = extras.get(name)
        if name == ATTENTION_BLOCKS:
            blocks = np.full(like.shape[:2], -1, np.int64) if given is None else np.asarray(given, np.int64)
            if blocks.shape != like.shape[:2]:
                raise ValueError(f"{name} is {list(blocks.shape)}; the rows are {list(like.shape[:2])}")
            out[name] = np.ascontiguousarray(blocks)
            continue
        if given is None:
            out[name] = np.zeros(like.shape, like.dtype)
            continue
        if tuple(given.shape) != tuple(like.shape):
            raise ValueError(f"decoder extra {name!r} is {list(given.shape)}; inputs_embeds is {list(like.shape)}")
        out[name] = np.ascontiguousarray(given, dtype=like.dtype)
    return out


class SessionFactory(Protocol):
    def __call__(self, graph: str, onnx_path: Path) -> GraphSession:
        """The session for graph ``graph`` of an engine dir (``onnx_path``: its ONNX file)."""
