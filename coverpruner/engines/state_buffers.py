"""Decoder state that is not KV (contract v5): what the engines find in a decoder graph and where they keep it.

A decoder graph's cache inputs are named past_key_values.{layer}.{kind}: kind "key" / "value" is a KV layer's
cache (engines/kv_buffers.py), any other kind a state of that layer (a Gated DeltaNet layer's "conv" and
"recurrent"), with the output present.{layer}.{kind}, one [B, *shape] tensor per batch entry whose shape has no
sequence axis. ``decoder_layout`` reads both from the graph's own inputs, so engines never ask the family (as they
find the decoder extras, interfaces.extra_inputs).

``HostStates``: the states of `batch` slots in numpy arrays [B, *shape], bound as both past and present of a call
(updated in place, as the KV buffers: ONNX Runtime's CausalConvWithState and LinearAttention CPU kernels read the
past state before they write the present one; tests/engines/test_state_buffers.py checks in place == separate
buffers). Slot b is row b, so slots first..first+count-1 are one contiguous [count, *shape] view.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from coverpruner.engines.kv_buffers import populate

_CACHE_INPUT = re.compile(r"^past_key_values\.(\d+)\.(\w+)$")
_ORT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


@dataclass(frozen=True)
class StateSlot:
    """One state tensor of one layer: graph input ``past`` / output ``present``, per-entry ``shape``, ``dtype``."""

    layer: int
    kind: str
    past: str
    present: str
    shape: tuple[int, ...]
    dtype: np.dtype


def decoder_layout(inputs) -> tuple[tuple[int, ...], tuple[StateSlot, ...]]:
    """(KV layers ascending, state slots in graph order) of a decoder graph's inputs (items with .name, .shape,
    .type, as onnxruntime's get_inputs). ValueError (one line) for a state input whose shape is not static past
    its batch axis."""
    kv, states = set(), []
    for item in inputs:
        m = _CACHE_INPUT.match(item.name)
        if m is None:
            continue
        layer, kind = int(m.group(1)), m.group(2)
        if kind in ("key", "value"):
            kv.add(layer)
            continue
        shape = tuple(item.shape[1:])
        if any(not isinstance(d, int) or d < 1 for d in shape):
            raise ValueError(f"decoder state {item.name!r} has shape {list(item.shape)}; a state has a fixed size "
                             "past its batch axis")
        states.append(StateSlot(layer, kind, item.name, f"present.{layer}.{kind}", shape,
                                np.dtype(_ORT_TYPES.get(getattr(item, "type", "tensor(float)"), np.float32))))
    return tuple(sorted(kv)), tuple(states)


def dims_problem(inputs, num_layers: int, num_kv_heads: int, head_dim: int) -> str | None:
    """What a manifest's dims (num_layers, num_kv_heads, head_dim) get wrong about a decoder graph whose inputs
    (items with .name and .shape, as onnxruntime's get_inputs) are ``inputs``, as "field dims.X is A; ..." (one
    line), or None when they agree. The layers are those the cache inputs past_key_values.{layer}.{kind} name (every
    layer holds a KV cache or a state: KV and states are both read from the graph, so a wrong depth would otherwise
    pass unnoticed); H_kv and hd are a KV input's static axes [B, H_kv, T, hd]."""
    layers, kv = set(), None
    for item in inputs:
        m = _CACHE_INPUT.match(item.name)
        if m is None:
            continue
        layers.add(int(m.group(1)))
        if m.group(2) in ("key", "value") and kv is None:
            kv = item
    if layers and layers != set(range(num_layers)):
        return (f"field dims.num_layers is {num_layers}; the decoder graph's cache inputs (past_key_values.N.*) "
                f"name layers {min(layers)}..{max(layers)} ({len(layers)} layers)")
    shape = list(getattr(kv, "shape", None) or [])
    for field, want, axis in (("num_kv_heads", num_kv_heads, 1), ("head_dim", head_dim, 3)):
        got = shape[axis] if len(shape) == 4 else None
        if isinstance(got, int) and got > 0 and got != want:
            return f"field dims.{field} is {want}; the decoder graph's {kv.name} has {got} (axes [B, H_kv, T, hd])"
    return None


class HostStates:
    """The decoder states of ``batch`` slots in host memory, bound in place (module docstring); zero at start."""

    def __init__(self, slots: tuple[StateSlot, ...], batch: int):
        self.slots = slots
        self.arrays = [np.zeros((batch, *s.shape), s.dtype) for s in slots]

    @property
    def nbytes_per_slot(self) -> int:
        """Bytes one request's states take (what a snapshot of them holds)."""
        return sum(a[0].nbytes for a in self.arrays)

    def bind(self, binding, first: int, count: int) -> None:
        """Bind slots first..first+count-1 of every state as past and present (one view: written in place)."""
        for slot, a in zip(self.slots, self.arrays):
            value = ort.OrtValue.ortvalue_from_numpy(a[first:first + count])
            binding.bind_ortvalue_input(slot.past, value)
            binding.bind_ortvalue_output(slot.present, value)

    def zero(self, slot: int) -> None:
        """A new request's states: what the model starts from."""
        for a in self.arrays:
            a[slot] = 0

    def copy_slot(self, src: int, dst: int) -> None:
        for a in self.arrays:
            a[dst] = a[src]

    def prefault(self, slot: int) -> None:
        """Commit slot's pages now, contents unchanged (kv_buffers.HostKV.prefault: np.zeros maps them at their
        first write, which a staged request's move at its join would otherwise pay inside the engine's step)."""
        for a in self.arrays:
            populate(a.ctypes.data + slot * a.strides[0], a.strides[0])

    def read(self, slot: int) -> tuple[np.ndarray, ...]:
        """Copies of slot's states, each [1, *shape]."""
        return tuple(a[slot:slot + 1].copy() for a in self.arrays)

    def write(self, slot: int, states) -> None:
        """Slot's states from [1, *shape] arrays (a snapshot's)."""
        for a, s in zip(self.arrays, states):
            a[slot] = s[0]
