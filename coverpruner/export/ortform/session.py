"""In-place KV driver for the ORT-form decoder with continuous batching (prototype; numpy + onnxruntime only).

One preallocated [B, kvH, C, D] float32 array per layer and kind, bound through IOBinding as both
past_key_values.N.* and present.N.* so GroupQueryAttention appends the new rows in place
(past_present_share_buffer): no per-step copy of the past and no Expand to the query heads.
Prefill runs one request at a time on its slot's [1, kvH, C, D] view of the same memory (batch is the outer
axis, so the view is contiguous); decode advances every slot in one call, each at its own length.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort


class OrtFormDecoder:
    """KV slots for `batch` requests of up to `capacity` tokens each.

    kv: [batch, kv_heads, capacity, head_dim] float32 per layer and kind, live for the decoder's lifetime.
    cos/sin: [batch * capacity, head_dim/2] float32, row b*C + t = rotation of slot b's t-th cached token
    (GQA needs cos_cache rows >= total_sequence_length, so a block of this call's rows alone is refused).
    """

    def __init__(self, path: str, batch: int, capacity: int, kv_heads: int, head_dim: int, layers: int,
                 threads: int = 0):
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        self.session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        self.batch, self.capacity = batch, capacity
        shape = (batch, kv_heads, capacity, head_dim)
        self.arrays = [[np.zeros(shape, np.float32) for _ in range(2)] for _ in range(layers)]
        # OrtValues over the same numpy memory: the whole batch, and each slot's contiguous [1, ...] view.
        self.full = [[ort.OrtValue.ortvalue_from_numpy(a) for a in pair] for pair in self.arrays]
        self.slots = [[[ort.OrtValue.ortvalue_from_numpy(a[b:b + 1]) for a in pair] for pair in self.arrays]
                      for b in range(batch)]
        self.lengths = np.zeros(batch, dtype=np.int64)  # tokens cached per slot
        self.cos = np.zeros((batch * capacity, head_dim // 2), np.float32)
        self.sin = np.zeros_like(self.cos)

    def _run(self, embeds, slots, kv) -> np.ndarray:
        """embeds [b, S, hidden] for `slots` (b of them) whose KV values are `kv`; returns logits [b, V]."""
        b, s, _ = embeds.shape
        total = self.lengths[slots] + s
        if total.max() > self.capacity:
            raise ValueError(f"KV capacity {self.capacity} exceeded: {int(total.max())} tokens")
        binding = self.session.io_binding()
        binding.bind_cpu_input("inputs_embeds", np.ascontiguousarray(embeds, np.float32))
        binding.bind_cpu_input("seqlens_k", (total - 1).astype(np.int32))
        binding.bind_cpu_input("total_sequence_length", np.array(total.max(), dtype=np.int32))
        binding.bind_cpu_input("rotary_cos", self.cos)
        binding.bind_cpu_input("rotary_sin", self.sin)
        binding.bind_cpu_input("rotary_row", (slots * self.capacity + self.lengths[slots])[:, None]
                               + np.arange(s, dtype=np.int64)[None, :])
        for i, (k, v) in enumerate(kv):
            for kind, buf in (("key", k), ("value", v)):
                binding.bind_ortvalue_input(f"past_key_values.{i}.{kind}", buf)
                binding.bind_ortvalue_output(f"present.{i}.{kind}", buf)
        binding.bind_output("logits")
        self.session.run_with_iobinding(binding)
        self.lengths[slots] = total
        return binding.copy_outputs_to_cpu()[-1][:, -1, :]  # logits is bound last

    def _write_rotary(self, slot: int, cos: np.ndarray, sin: np.ndarray) -> None:
        start = slot * self.capacity + int(self.lengths[slot])
        self.cos[start:start + len(cos)] = cos
        self.sin[start:start + len(sin)] = sin

    def prefill(self, slot: int, embeds: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """Start slot `slot` afresh: embeds [1, S, hidden], cos/sin [S, D/2] -> last logits [V]."""
        self.lengths[slot] = 0
        self._write_rotary(slot, cos, sin)
        return self._run(embeds, np.array([slot]), self.slots[slot])[0]

    def decode(self, embeds: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """One token for every slot: embeds [B, 1, hidden], cos/sin [B, D/2] -> logits [B, V]."""
        for b in range(self.batch):
            self._write_rotary(b, cos[b:b + 1], sin[b:b + 1])
        return self._run(embeds, np.arange(self.batch), self.full)
