"""The ORT decoder loop: a KV cache in two preallocated ping-pong buffers bound with ORT IO binding.

The decoder graph concatenates past and new keys/values into ``present.{i}.*`` [B,H_kv,P+S,hd].
Instead of letting ORT allocate a fresh present every step (and copying it through numpy), each
layer's key and value own two flat device buffers sized for the whole request (prompt + new
tokens). Step t reads ``past`` from buffer A and has ORT write ``present`` straight into buffer B
(a [B,H_kv,P+S,hd] view of its first elements); step t+1 swaps the roles. Nothing is allocated
or copied on the host per step besides the one-token inputs and the logits row.

Because a [1,H_kv,P,hd] tensor written contiguously from the start of a buffer is also its first
H_kv*P*hd elements, the cached prefix is a plain slice: ``snapshot`` copies it out, ``restore`` writes it back.

A decoder with state that is not KV (contract v5; the graph's past_key_values.N.<state> inputs,
engines/state_buffers.decoder_layout) keeps each state in two [1, *shape] host arrays read and written in turn like
the KV buffers (a standard-op graph may write an output while a node still reads the input it would overwrite).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from coverpruner.engine_dir import DECODER_INPUTS, past_names, present_names
from coverpruner.engines.interfaces import KVSnapshot, check_snapshot, extra_feeds, extra_inputs
from coverpruner.engines.state_buffers import decoder_layout


class OrtDecoderSession:
    """Runs one decoder graph with IO binding and owns its KV cache (a coverpruner.engines.interfaces.DecoderLoop).

    num_layers, num_kv_heads, head_dim: cache geometry (the KV layers are the graph's: every layer, or a hybrid
    decoder's attention layers). dtype: numpy float dtype of the cache and inputs_embeds (float32 or float16).
    device: 'cpu' or 'cuda' (where the cache lives).
    """

    def __init__(self, session: ort.InferenceSession, num_layers: int, num_kv_heads: int, head_dim: int,
                 vocab_size: int, dtype=np.float32, device: str = "cpu"):
        self.session = session
        self.h, self.hd = num_kv_heads, head_dim
        self.vocab_size = vocab_size
        self.dtype = np.dtype(dtype)
        self.device = device
        order = [i.name for i in session.get_inputs()]
        names = set(order)
        kv_layers, self.state_slots = decoder_layout(session.get_inputs())
        kv_layers = kv_layers if (kv_layers or self.state_slots) else tuple(range(num_layers))
        self.num_layers = len(kv_layers)
        self._past, self._present = past_names(kv_layers), present_names(kv_layers)
        missing = sorted({*DECODER_INPUTS, *self._past} - names)
        if missing:
            raise ValueError(f"decoder graph lacks inputs {missing[:4]} (has {sorted(names)[:6]}...)")
        #: the decoder extras (contract v4) the graph takes besides embeddings, positions, KV and states
        self.extra_names = extra_inputs(order, (*DECODER_INPUTS, *self._past))
        #: per state, its two host arrays [1, *shape] (read one, write the other: _cur)
        self._states = [[np.zeros((1, *s.shape), s.dtype) for _ in range(2)] for s in self.state_slots]
        self.capacity = 0
        self.length = 0  # tokens already in the cache (P)
        self._cur = 0

    # -- cache ------------------------------------------------------------------------------
    def _new_buffer(self, size: int) -> tuple[ort.OrtValue, np.ndarray | None]:
        """A flat buffer of ``size`` elements on the device; on the CPU also the numpy array it shares memory
        with (ortvalue_from_numpy does not copy for CPU), which snapshot/restore slice directly."""
        if self.device == "cpu":
            host = np.empty(size, self.dtype)
            return ort.OrtValue.ortvalue_from_numpy(host), host
        return ort.OrtValue.ortvalue_from_shape_and_type([size], self.dtype, self.device, 0), None

    def reset(self, capacity: int) -> None:
        """Empty the cache and make sure the buffers hold ``capacity`` tokens (reused if they do)."""
        if capacity > self.capacity:
            n = self.h * capacity * self.hd
            # [layer][key/value][ping/pong] (OrtValue, host array or None) flat buffers on the provider's device
            self._buf = [[[self._new_buffer(n) for _ in range(2)] for _ in range(2)] for _ in range(self.num_layers)]
            self._mask = ort.OrtValue.ortvalue_from_numpy(np.ones((1, capacity), np.int64), self.device, 0)
            self.capacity = capacity
        self._logits = np.empty((1, 1, self.vocab_size), dtype=self.dtype)
        self._logits_value = ort.OrtValue.ortvalue_from_numpy(self._logits)
        self._cur = 0
        self.length = 0
        for pair in self._states:  # what the model starts from
            pair[0][:] = 0

    def _shape(self, length: int) -> list[int]:
        return [1, self.h, length, self.hd]

    def snapshot(self) -> KVSnapshot:
        """Host copies of the cached prefix: per KV layer key and value [1,H_kv,P,hd] (P = length), and the
        states after those P tokens."""
        keys = tuple(self._prefix(i, 0) for i in range(self.num_layers))
        values = tuple(self._prefix(i, 1) for i in range(self.num_layers))
        return KVSnapshot(self.length, keys, values, tuple(pair[self._cur].copy() for pair in self._states))

    def _prefix(self, layer: int, j: int) -> np.ndarray:
        """A copy of layer ``layer``'s cached keys (j = 0) or values (j = 1): [1,H_kv,P,hd]."""
        shape = tuple(self._shape(self.length))
        if not self.length:
            return np.zeros(shape, self.dtype)
        value, host = self._buf[layer][j][self._cur]
        flat = host if host is not None else value.numpy()  # a device buffer comes to the host whole
        return flat[:int(np.prod(shape))].reshape(shape).copy()

    def restore(self, snapshot: KVSnapshot) -> None:
        """Write the snapshot's prefix into the current buffers; the cache then holds snapshot.length tokens."""
        check_snapshot(snapshot, self.num_layers, self.h, self.hd, self.dtype, self.capacity, self.state_slots)
        for pair, state in zip(self._states, snapshot.states):
            pair[self._cur][:] = state
        size = self.h * snapshot.length * self.hd
        if size:
            for i in range(self.num_layers):
                for j, arrays in enumerate((snapshot.keys, snapshot.values)):
                    value, host = self._buf[i][j][self._cur]
                    if host is not None:
                        host[:size] = arrays[i].reshape(-1)
                    else:  # update_inplace copies a whole buffer: pad the prefix to the buffer's size
                        full = np.zeros(self.h * self.capacity * self.hd, self.dtype)
                        full[:size] = arrays[i].reshape(-1)
                        value.update_inplace(full)
        self.length = snapshot.length

    # -- one forward ------------------------------------------------------------------------
    def forward(self, inputs_embeds: np.ndarray, position_ids: np.ndarray,
                extras: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """Append S tokens. inputs_embeds [1,S,d] (cache dtype), position_ids int64 [1,S] or [R,1,S], extras
        {input name: [1,S,d]} (interfaces.DecoderLoop.forward; zeros for the ones not given).

        Returns logits [V] of the last position (a view that the next call overwrites).
        """
        s = inputs_embeds.shape[1]
        total = self.length + s
        if total > self.capacity:
            raise ValueError(f"KV cache holds {self.capacity} tokens; {total} requested")
        embeds = np.ascontiguousarray(inputs_embeds, dtype=self.dtype)
        b = self.session.io_binding()
        b.bind_cpu_input("inputs_embeds", embeds)
        for name, value in extra_feeds(self.extra_names, extras, embeds).items():
            b.bind_cpu_input(name, value)
        b.bind_cpu_input("position_ids", np.ascontiguousarray(position_ids, dtype=np.int64))
        b.bind_input("attention_mask", self.device, 0, np.int64, [1, total], self._mask.data_ptr())
        src, dst = self._cur, 1 - self._cur
        for i in range(self.num_layers):
            for j in range(2):  # key, value
                past, present = self._past[2 * i + j], self._present[2 * i + j]
                if self.length == 0:
                    # ORT rejects binding a null pointer; an empty host array is an empty past.
                    b.bind_cpu_input(past, np.zeros(self._shape(0), self.dtype))
                else:
                    b.bind_input(past, self.device, 0, self.dtype, self._shape(self.length),
                                 self._buf[i][j][src][0].data_ptr())
                b.bind_output(present, self.device, 0, self.dtype, self._shape(total),
                              self._buf[i][j][dst][0].data_ptr())
        for slot, pair in zip(self.state_slots, self._states):
            b.bind_cpu_input(slot.past, pair[src])
            b.bind_output(slot.present, "cpu", 0, slot.dtype, list(pair[dst].shape), pair[dst].ctypes.data)
        b.bind_ortvalue_output("logits", self._logits_value)
        self.session.run_with_iobinding(b)
        self._cur, self.length = dst, total
        return self._logits[0, -1]
