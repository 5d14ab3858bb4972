"""The ORT-form decoder engine: KV slots updated in place, one request (DecoderLoop) or many (BatchDecoder).

The graph (graphs.decoder.form "ort", export/ortform/decoder_graph.py) reads and writes each layer's cache
through GroupQueryAttention with past and present bound to the same preallocated [B, H_kv, C, hd] buffer
(past_present_share_buffer; float32, or float16 for an fp16 export): the new rows are written in place at each
entry's own length, nothing of the past is copied per step and no repeat_kv expansion runs. Batch is the outer
axis, so the first k slots are one contiguous [k, H_kv, C, hd] view: a call runs exactly the active slots (kept
packed at the front; a request that leaves has the last slot moved into its place, one copy per leave, none per
step). The buffers live in host memory for the CPU provider and in device memory for the CUDA provider
(engines/kv_buffers.py).

Rotary rows are computed here (engines/rotary.py) from each token's positions, so any layout works (LLaVA's
compact 1-D, Qwen2.5-VL's M-RoPE 3-D with gaps): a call's rows are written at the start of the cos/sin tables,
entry b's s-th new token at row b*S + s, and ``rotary_row`` [b, s] = b*S + s (the CPU kernel reads row
rotary_row[b, 0] + s, the CUDA kernel rotary_row[b, s]: the same rows). Cached keys are stored rotated, so earlier
tokens' rows are never needed again.
A decoder with state that is not KV (contract v5: a hybrid decoder's Gated DeltaNet layers) has it found in the graph
(engines/state_buffers.py): each slot's states are bound in place beside its KV, move with it, and are part of its
snapshot; they hold what the slot's tokens so far left, so prompts of different lengths never share a padded call.
numpy + onnxruntime only.
"""

from __future__ import annotations

import threading

import numpy as np

from coverpruner.engine_dir import ATTENTION_BLOCKS, ORT_DECODER_INPUTS, past_names
from coverpruner.engines.attention_inputs import AttentionInputs
from coverpruner.engines.interfaces import KVSnapshot, check_snapshot, extra_feeds, extra_inputs
from coverpruner.engines.kv_buffers import kv_buffers
from coverpruner.engines.rotary import rotary_rows
from coverpruner.engines.state_buffers import HostStates, decoder_layout


class KVSlots:
    """`batch` KV slots of `capacity` tokens each for one ORT-form decoder session.

    session: onnxruntime.InferenceSession of the ORT-form graph. rotary: the manifest's {"theta", "mrope_section",
    "mrope_interleaved", "dim"}. device: 'cpu' (numpy buffers) or 'cuda' (device buffers for the CUDA provider,
    engines/kv_buffers.py). The cache's float dtype is the graph's (float32, or float16 for an fp16 export).
    lengths: int64 [batch], tokens cached per slot. Slot indices are positions in the buffers; BatchDecoder keeps
    the active ones at the front. The KV layers and the states (contract v5) are the graph's own
    (state_buffers.decoder_layout; num_layers is then only the decoder's depth).
    """

    def __init__(self, session, batch: int, capacity: int, num_layers: int, num_kv_heads: int, head_dim: int,
                 rotary: dict, device: str = "cpu"):
        self.session, self.batch, self.capacity = session, batch, capacity
        self.h, self.hd = num_kv_heads, head_dim
        self.theta, self.section = float(rotary["theta"]), rotary.get("mrope_section")
        self.interleaved = bool(rotary.get("mrope_interleaved", False))
        self.factor = float(rotary.get("factor", 1.0))  # linear rope scaling
        self.rotary_dim = int(rotary.get("dim") or head_dim)  # a partial rotary turns the first dims only
        listed = session.get_inputs()
        inputs = {i.name: i.type for i in listed}
        self.kv_layers, state_slots = decoder_layout(listed)
        self.num_layers = len(self.kv_layers)  # KV layers
        #: contract v5: the attention biases (bidirectional blocks, windows) and further rotary tables it takes
        self.attention = AttentionInputs(list(inputs), rotary, head_dim)
        #: the decoder extras (contract v4) the graph takes besides embeddings, rotary rows, KV, states and biases
        self.extra_names = extra_inputs(list(inputs), (*ORT_DECODER_INPUTS, *past_names(self.kv_layers),
                                                       *self.attention.names))
        #: float dtype of embeddings, rotary rows and cache (the graph's inputs_embeds)
        self.dtype = np.dtype(np.float16 if inputs.get("inputs_embeds") == "tensor(float16)" else np.float32)
        self.names = [(f"past_key_values.{i}.{kind}", f"present.{i}.{kind}") for i in self.kv_layers
                      for kind in ("key", "value")]
        self.buffers = kv_buffers(device, batch, capacity, self.num_layers, num_kv_heads, head_dim, self.dtype,
                                  rotary_dim=self.rotary_dim)
        #: the states that are not KV (contract v5), host memory for every provider; None without
        self.states = HostStates(state_slots, batch) if state_slots else None
        self.lengths = np.zeros(batch, dtype=np.int64)

    def clear(self, slot: int) -> None:
        """Slot holds nothing: no cached tokens, the states a request starts from."""
        self.lengths[slot] = 0
        if self.states is not None:
            self.states.zero(slot)

    def _rows(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """positions int64 [R, S] -> cos, sin [S, hd/2]."""
        positions = np.asarray(positions)
        return rotary_rows(positions[0] if len(positions) == 1 else positions, self.rotary_dim, self.theta,
                           self.section, self.interleaved, self.factor)

    def _bind_attention(self, binding, starts, lengths, blocks, total: int, positions: list, lane: int = 0) -> None:
        """Contract v5: this call's attention biases (entries' cached rows ``starts``, new rows ``lengths``, their
        blocks) and the further rotary tables' rows (positions: per entry [R, S], laid out as rotary_row says) in
        the lane's tables."""
        for name, bias in self.attention.bias_feeds(starts, lengths, blocks, total, self.dtype).items():
            binding.bind_cpu_input(name, bias)
        if self.attention.tables:
            parts = [self.attention.table_rows(p) for p in positions]
            for k, (names, _, _) in enumerate(parts[0]):
                self.buffers.bind_rotary(binding, np.concatenate([p[k][1] for p in parts]),
                                         np.concatenate([p[k][2] for p in parts]), lane, names)

    def run(self, first: int, count: int, embeds: np.ndarray, positions: list,
            extras: dict | None = None, lane: int = 0, session=None) -> np.ndarray:
        """Append S tokens to slots first..first+count-1: embeds float [count, S, d], positions one int64 [R, S]
        per slot, the decoder extras {input name: float [count, S, d]} (zeros for those not given; contract v5's
        attention_blocks int64 [count, S]: the rows' blocks) -> logits float32 [count, V] of each slot's last new
        token. lane: the calling thread's rotary tables (kv_buffers.LANES: calls on other slots may run meanwhile
        from another thread with another lane); session: another session of the same graph to run it in (the
        staging thread's, BatchDecoder's stage_session)."""
        session = session or self.session
        extras = dict(extras or {})
        blocks = extras.pop(ATTENTION_BLOCKS, None)
        slots = np.arange(first, first + count)
        s = embeds.shape[1]
        total = self.lengths[slots] + s
        if total.max() > self.capacity:
            raise ValueError(f"KV cache holds {self.capacity} tokens; {int(total.max())} requested")
        if count * s > self.buffers.rows:  # one entry's prefill or one token per entry, never both
            raise ValueError(f"a call takes at most {self.buffers.rows} rows; got {count} entries x {s} tokens")
        rows = [self._rows(p) for p in positions]
        binding = session.io_binding()
        embeds = np.ascontiguousarray(embeds, self.dtype)
        binding.bind_cpu_input("inputs_embeds", embeds)
        for name, value in extra_feeds(self.extra_names, extras, embeds).items():
            binding.bind_cpu_input(name, value)
        binding.bind_cpu_input("seqlens_k", (total - 1).astype(np.int32))
        binding.bind_cpu_input("total_sequence_length", np.array(total.max(), dtype=np.int32))
        # this call's rotary rows only, entry b's at b*S..b*S+S-1 (its keys are stored rotated: the cached
        # tokens' rows are never read again)
        self.buffers.bind_rotary(binding, np.concatenate([c for c, _ in rows]), np.concatenate([n for _, n in rows]),
                                 lane)
        binding.bind_cpu_input("rotary_row", (np.arange(count, dtype=np.int64) * s)[:, None]
                               + np.arange(s, dtype=np.int64)[None, :])
        self._bind_attention(binding, self.lengths[slots], np.full(count, s), blocks, int(total.max()),
                             [np.asarray(p) for p in positions], lane)
        self.buffers.bind_kv(binding, first, count, self.names)
        if self.states is not None:
            self.states.bind(binding, first, count)
        binding.bind_output("logits")  # to host memory
        session.run_with_iobinding(binding)
        self.lengths[slots] = total
        # only logits comes back to the host: copy_outputs_to_cpu would also copy every bound present buffer,
        # num_layers x 2 x [count, H_kv, C, hd] per call (320 MB a step at batch 8 on LLaVA-1.5-7B widths)
        return binding.get_outputs()[-1].numpy()[:, -1, :].astype(np.float32, copy=False)  # logits is bound last

    def run_prompts(self, first: int, embeds: list, positions: np.ndarray, extras: list) -> None:
        """Prefill k empty slots first..first+k-1 in ONE call (GroupQueryAttention's first prompt, right-padded):
        embeds [(S_i, d) float32], positions int64 [R, max S_i] of the longest, whose first S_i columns are every
        request's own positions (``shared_prompt_positions``), decoder extras [{name: [S_i, d]} or None].
        Logits are not returned (the engine leaves each request's last prompt row to the next step).

        Why one shared rotary table: in a first prompt (sequence_length == total_sequence_length) ONNX Runtime
        1.32's CPU GroupQueryAttention rotates row s of every batch entry with cos/sin row s, whatever
        position_ids say (measured on the LLaVA-1.5-7B-width engine: a right-padded batch of 8 over per-slot
        rotary tables wrote keys up to 5.1 off those of the per-request prefills). So the call gets the rows of the
        longest request's positions, and a group is formed only of requests whose positions are a prefix of them
        (LLaVA's compact 0..S-1 always are). The
        padding rows (S_i .. max S_i - 1 of a shorter request) are written into its slot but lie past its length:
        attention never reads them and its next rows overwrite them."""
        extras = [dict(x) if x else None for x in extras]
        blocks = [x.pop(ATTENTION_BLOCKS, None) if x else None for x in extras]
        k, lens = len(embeds), np.array([len(e) for e in embeds], dtype=np.int64)
        s = int(lens.max())
        if self.lengths[first:first + k].any() or first + k > self.batch or s > self.capacity:
            raise ValueError(f"run_prompts needs {k} empty slots from {first} of {s} <= {self.capacity} tokens")
        padded = np.zeros((k, s, embeds[0].shape[1]), self.dtype)
        for b, e in enumerate(embeds):
            padded[b, :len(e)] = e
        names = {n for x in extras if x for n in x}
        pad_extras = None
        if names:
            pad_extras = {n: np.zeros_like(padded) for n in names}
            for b, x in enumerate(extras):
                for n, v in (x or {}).items():
                    pad_extras[n][b, :len(v)] = v
        cos, sin = self._rows(positions)
        binding = self.session.io_binding()
        binding.bind_cpu_input("inputs_embeds", padded)
        for name, value in extra_feeds(self.extra_names, pad_extras, padded).items():
            binding.bind_cpu_input(name, value)
        binding.bind_cpu_input("seqlens_k", (lens - 1).astype(np.int32))
        binding.bind_cpu_input("total_sequence_length", np.array(s, dtype=np.int32))
        self.buffers.bind_rotary(binding, cos, sin)
        # row s of the shared table, under either reading of position_ids ([b, 0] + s, or [b, s])
        binding.bind_cpu_input("rotary_row", np.broadcast_to(np.arange(s, dtype=np.int64), (k, s)).copy())
        self._bind_attention(binding, np.zeros(k, np.int64), lens, blocks, s, [positions])
        self.buffers.bind_kv(binding, first, k, self.names)
        if self.states is not None:  # only prompts of one length share a call (BatchDecoder._prompt_group)
            self.states.bind(binding, first, k)
        binding.bind_output("logits")
        self.session.run_with_iobinding(binding)
        self.lengths[first:first + k] = lens

    def copy(self, src: int, dst: int) -> None:
        """Slot dst holds what slot src holds: its cached tokens and (contract v5) its states."""
        n = int(self.lengths[src])
        self.buffers.copy_slot(src, dst, n)
        if self.states is not None:
            self.states.copy_slot(src, dst)
        self.lengths[dst] = n

    def prefault(self, slot: int, n: int) -> None:
        """Commit the memory of slot's first n tokens and its states (contents unchanged; kv_buffers.HostKV.prefault)."""
        self.buffers.prefault(slot, n)
        if self.states is not None:
            self.states.prefault(slot)

    def move(self, src: int, dst: int) -> None:
        """Copy slot src's cached tokens and states into slot dst (src is then free)."""
        self.copy(src, dst)
        self.lengths[src] = 0

    def snapshot(self, slot: int) -> KVSnapshot:
        """Host copies of slot's cached tokens: per KV layer key and value [1, H_kv, P, hd], and its states."""
        n = int(self.lengths[slot])
        states = self.states.read(slot) if self.states is not None else ()
        return KVSnapshot(n, *self.buffers.read(slot, n), states)

    def read(self, slot: int, start: int, stop: int) -> tuple[tuple, tuple]:
        """Host copies of slot's cached tokens start..stop-1: (keys, values), per layer [1, H_kv, stop-start, hd]."""
        if not 0 <= start <= stop <= self.lengths[slot]:
            raise ValueError(f"slot {slot} holds {int(self.lengths[slot])} tokens; rows {start}..{stop} asked")
        return self.buffers.read(slot, stop - start, start)

    def restore(self, slot: int, snap: KVSnapshot) -> None:
        """Slot holds exactly the snapshot's prefix (keys are stored rotated: no rotary rows needed) and states."""
        check_snapshot(snap, self.num_layers, self.h, self.hd, self.dtype, self.capacity, self.state_slots)
        self.buffers.write(slot, snap.keys, snap.values)
        if self.states is not None:
            self.states.write(slot, snap.states)
        self.lengths[slot] = snap.length

    def append(self, slot: int, keys, values) -> None:
        """Append cached rows to slot after its length: per layer keys / values [1, H_kv, n, hd] (a prefix block).
        ValueError for a decoder with states: KV rows without the states they were written with would answer wrong
        (its prefix is restored whole, ``restore``)."""
        if self.states is not None:
            raise ValueError("a decoder with states (graphs.decoder.states) restores a prefix whole, with its states; "
                             "KV blocks alone cannot be appended")
        n, start = keys[0].shape[2], int(self.lengths[slot])
        if start + n > self.capacity:
            raise ValueError(f"KV cache holds {self.capacity} tokens; {start + n} requested")
        self.buffers.write(slot, keys, values, start)
        self.lengths[slot] = start + n

    @property
    def state_slots(self) -> tuple:
        """The graph's states (state_buffers.StateSlot), () without."""
        return self.states.slots if self.states is not None else ()


def _positions(position_ids: np.ndarray) -> np.ndarray:
    """DecoderLoop position_ids [1, S] (rank 1) or [R, 1, S] -> [R, S]."""
    p = np.asarray(position_ids, dtype=np.int64)
    return p if p.ndim == 2 else p[:, 0, :]


def shared_prompt_positions(positions: list) -> list[int]:
    """Which of several prompts (positions int64 [R, S_i] each) can prefill in one KVSlots.run_prompts call: the
    indices of those whose positions are the first S_i columns of the longest one's (the longest included;
    ties: the first). Others run alone."""
    if not positions:
        return []
    ref = max(range(len(positions)), key=lambda i: positions[i].shape[1])
    longest = np.asarray(positions[ref])
    return [i for i, p in enumerate(positions)
            if np.array_equal(np.asarray(p), longest[:, :np.asarray(p).shape[1]])]


class OrtFormDecoderSession:
    """A coverpruner.engines.interfaces.DecoderLoop over an ORT-form decoder: one slot, cache in place.

    session: the decoder's onnxruntime.InferenceSession; rotary: graphs.decoder.rotary of the manifest; device:
    where the cache lives ('cpu', or 'cuda' for the CUDA provider: engines/kv_buffers.py). The cache has the
    graph's float dtype (float32; float16 for an fp16 export, the form the CUDA provider runs).
    """

    def __init__(self, session, num_layers: int, num_kv_heads: int, head_dim: int, vocab_size: int, rotary: dict,
                 device: str = "cpu"):
        self.session, self.rotary, self.device = session, dict(rotary), device
        self.num_layers, self.h, self.hd, self.vocab_size = num_layers, num_kv_heads, head_dim, vocab_size
        half = any(i.name == "inputs_embeds" and i.type == "tensor(float16)" for i in session.get_inputs())
        self.dtype = np.dtype(np.float16 if half else np.float32)
        self.capacity = 0
        self._slots: KVSlots | None = None

    @property
    def length(self) -> int:
        return 0 if self._slots is None else int(self._slots.lengths[0])

    def reset(self, capacity: int) -> None:
        """Empty the cache; buffers are reallocated only when `capacity` exceeds the current one."""
        if capacity > self.capacity:
            self._slots = KVSlots(self.session, 1, capacity, self.num_layers, self.h, self.hd, self.rotary,
                                  self.device)
            self.capacity = capacity
        self._slots.clear(0)

    def forward(self, inputs_embeds: np.ndarray, position_ids: np.ndarray,
                extras: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """Append S tokens: inputs_embeds [1, S, d], position_ids int64 [1, S] or [R, 1, S], decoder extras
        {name: [1, S, d]} (zeros for those not given) -> logits [V]."""
        return self._slots.run(0, 1, inputs_embeds, [_positions(position_ids)], extras)[0]

    def snapshot(self) -> KVSnapshot:
        """Host copies of the cached prefix: per KV layer key and value [1, H_kv, P, hd], and the states."""
        if self._slots is None:
            self.reset(1)  # an empty cache: no tokens, the states a request starts from
        return self._slots.snapshot(0)

    def restore(self, snapshot: KVSnapshot) -> None:
        """The cache holds exactly the snapshot's prefix; the next forward continues after it."""
        if self._slots is None:
            raise ValueError("KV cache holds 0 tokens; reset to the request's capacity before restoring")
        self._slots.restore(0, snapshot)


class BatchDecoder:
    """Continuous batching over an ORT-form decoder (public API; runtime/engine.py drives it for Pipeline).

    A request takes a slot (``open``: empty, or holding a restored prefix; ``append``: more cached rows after it),
    prefills its prompt rows in as many calls as it likes (``extend``: several requests' rows, one call for the
    ones that start from an empty slot with positions that fit one rotary table, one call each for the others),
    and from then on advances in the one batched call per ``step`` that every active request shares; ``fork``
    copies a request's cache into new slots (n answers of one prompt); it leaves at any step (EOS, length, cancel)
    without waiting for the others. Greedy answers equal batch-1 answers (each batch entry's attention reads only
    its own cache; tests/export/test_ortform_decoder.py). ``join`` / ``admit`` are open + extend for one request /
    several.

    Staging: another thread may prefill one request at a time beside the steps (``stage`` reserves the highest free
    slot, outside the packed active slots every step runs; ``stage_append`` / ``stage_extend`` fill it on the
    second rotary lane; ``join_staged`` moves it to the active slots from the stepping thread; ``unstage`` gives it
    up). Only the staged slot is touched from the other thread; the bookkeeping is locked.

    max_batch: slots; capacity: tokens per request (prompt + generated); the cache is
    num_layers x 2 x [max_batch, H_kv, capacity, hd] in the graph's float dtype, allocated once, on `device`
    ('cpu', or 'cuda' for the CUDA provider with an fp16 ORT-form graph: nothing but the new rows and the logits
    crosses PCIe per step).
    """

    def __init__(self, session, max_batch: int, capacity: int, num_layers: int, num_kv_heads: int, head_dim: int,
                 rotary: dict, device: str = "cpu", stage_session=None):
        if max_batch < 1 or capacity < 1:
            raise ValueError(f"max_batch and capacity must be >= 1, got {max_batch} and {capacity}")
        self._slots = KVSlots(session, max_batch, capacity, num_layers, num_kv_heads, head_dim, rotary, device)
        self.max_batch, self.capacity = max_batch, capacity
        self._order: list[int] = []  # handle of each active slot, slot i = self._order[i]
        self._next = 0
        self._staged: int | None = None  # the slot another thread prefills (the highest free one), if any
        self._reserved = 0  # slots promised to forks to come (open / join_staged ``reserve``)
        self._lock = threading.Lock()
        #: the session of the same graph the staging thread's calls run in (None: ``session``): its own threads, so
        #: the steps' threads never serve a staging call (runtime/admission.py, "Sharing the cores in turns")
        self.stage_session = stage_session

    @property
    def free(self) -> int:
        """Slots neither active, staged nor reserved."""
        return self.max_batch - len(self._order) - (self._staged is not None) - self._reserved

    def _take(self, count: int) -> None:
        if count > self.free:
            raise ValueError(f"batch is full ({self.max_batch} requests, {self.free} free, {count} asked); leave one "
                             "first")

    @property
    def active(self) -> list[int]:
        """Handles of the requests in the batch, in slot order."""
        return list(self._order)

    def length(self, handle: int) -> int:
        """Tokens request `handle` has in the cache."""
        return int(self._slots.lengths[self._order.index(handle)])

    def open(self, prefix: KVSnapshot | None = None, reserve: int = 0) -> int:
        """Take a free slot for a new request, empty or holding ``prefix``, and promise ``reserve`` more to its forks
        -> its handle. ValueError (one line) when the slots do not suffice or the prefix does not fit."""
        with self._lock:
            self._take(1 + reserve)
            self._reserved += reserve
            slot = len(self._order)
            self._slots.clear(slot)
            if prefix is not None:
                self._slots.restore(slot, prefix)
            handle, self._next = self._next, self._next + 1
            self._order.append(handle)
        return handle

    def stage(self) -> int | None:
        """Reserve the highest free slot for a request another thread prefills beside the steps -> its slot index;
        None when no slot is free or one is staged already."""
        with self._lock:
            if self._staged is not None or self.free < 1:
                return None
            self._staged = self.max_batch - 1  # the top slot: the active ones are packed below it
            self._slots.clear(self._staged)
            return self._staged

    def stage_append(self, keys, values) -> None:
        """Cached rows after the staged slot's (a prefix block), from the staging thread."""
        self._slots.append(self._staged, keys, values)

    def stage_restore(self, prefix: KVSnapshot) -> None:
        """The staged slot holds exactly ``prefix`` (its KV rows and, contract v5, its states), from the staging
        thread."""
        self._slots.restore(self._staged, prefix)

    def stage_snapshot(self) -> KVSnapshot:
        """Host copies of what the staged slot holds (KV rows and states), from the staging thread."""
        return self._slots.snapshot(self._staged)

    def stage_extend(self, embeds: np.ndarray, positions: np.ndarray, extras: dict | None = None) -> None:
        """Prompt rows into the staged slot (embeds float [S, d], positions int64 [R, S], decoder extras {name:
        [S, d]} or None), in one call on the second rotary lane, from the staging thread."""
        self._slots.run(self._staged, 1, np.asarray(embeds)[None], [positions],
                        {k: v[None] for k, v in extras.items()} if extras else None, lane=1,
                        session=self.stage_session)

    def stage_read(self, start: int, stop: int) -> tuple[tuple, tuple]:
        """Host copies of the staged slot's rows start..stop-1 (as ``read``), from the staging thread."""
        return self._slots.read(self._staged, start, stop)

    def prefault_join(self) -> None:
        """From the staging thread once its rows are in: fault in the pages ``join_staged`` will copy them into (the
        slot after the active ones now), so the engine's step does not pay for them (kv_buffers.HostKV.prefault;
        if the batch changes before the join, that step faults what differs, as it would have anyway)."""
        with self._lock:
            src, dst = self._staged, len(self._order)
        if src is not None and src != dst:
            self._slots.prefault(dst, int(self._slots.lengths[src]))

    def join_staged(self, reserve: int = 0) -> int:
        """The staged request joins the active slots (its rows moved next to them unless the batch is now full and
        it is there already) and ``reserve`` slots are promised to its forks -> its handle. From the stepping thread,
        once the staging thread is done with it."""
        with self._lock:
            self._take(reserve)
            self._reserved += reserve
            src, dst = self._staged, len(self._order)
            if src != dst:
                self._slots.move(src, dst)
            self._staged = None
            handle, self._next = self._next, self._next + 1
            self._order.append(handle)
        return handle

    def unstage(self) -> None:
        """Give the staged slot up (its request was cancelled or failed)."""
        with self._lock:
            if self._staged is not None:
                self._slots.lengths[self._staged] = 0
            self._staged = None

    def append(self, handle: int, keys, values) -> None:
        """Cached rows after request ``handle``'s: per layer keys / values [1, H_kv, n, hd] (a stored prefix block,
        keys rotated as the decoder wrote them)."""
        self._slots.append(self._order.index(handle), keys, values)

    def read(self, handle: int, start: int, stop: int) -> tuple[tuple, tuple]:
        """Host copies of request ``handle``'s cached rows start..stop-1: (keys, values) per layer [1, H_kv, n, hd]."""
        return self._slots.read(self._order.index(handle), start, stop)

    def extend(self, items: list[tuple]) -> None:
        """Prompt rows of several requests: items (handle, embeds float [S, d], positions int64 [R, S], decoder
        extras {name: [S, d]} or None), S >= 1, appended after each one's cached rows; no logits (a request's last
        prompt row goes into a ``step``, whose logits start its answer).

        The requests whose slots are empty prefill together in one right-padded call (KVSlots.run_prompts) when
        their slots are next to each other and their positions are prefixes of the longest one's
        (``shared_prompt_positions``); the others (rows after cached ones, or positions of their own, e.g. two
        M-RoPE images of different grids) run one call each: ONNX Runtime's GroupQueryAttention (1.32, CPU) takes
        several rows of several requests in one call only as a first prompt (otherwise "batch_size must be 1 when
        sequence_length > 1 and past context is given"). ValueError (one line) when a slot's capacity does not
        suffice (checked before any row runs)."""
        slots = [self._order.index(h) for h, *_ in items]
        for slot, (_, embeds, _, *_) in zip(slots, items):
            if self._slots.lengths[slot] + len(embeds) > self.capacity:
                raise ValueError(f"KV cache holds {self.capacity} tokens; "
                                 f"{int(self._slots.lengths[slot]) + len(embeds)} requested")
        alone = set(range(len(items)))
        for group in self._prompt_groups(items, slots):
            longest = max(group, key=lambda i: len(items[i][1]))
            self._slots.run_prompts(slots[group[0]], [np.asarray(items[i][1]) for i in group], items[longest][2],
                                    [items[i][3] if len(items[i]) > 3 else None for i in group])
            alone -= set(group)
        for i in sorted(alone):
            _, embeds, positions, *extras = items[i]
            extras = extras[0] if extras else None
            self._slots.run(slots[i], 1, np.asarray(embeds)[None], [positions],
                            {k: v[None] for k, v in extras.items()} if extras else None)

    def _prompt_groups(self, items: list, slots: list[int]) -> list[list[int]]:
        """The items ``extend`` prefills in one batched call each: runs of two or more whose slots are empty and
        consecutive, and whose positions are prefixes of their run's longest one's (shared_prompt_positions); with
        decoder states (contract v5) only of one length (a shorter prompt's padding rows would run through its
        states)."""
        empty = sorted((i for i, s in enumerate(slots) if self._slots.lengths[s] == 0 and len(items[i][1])),
                       key=lambda i: slots[i])
        runs, groups = [], []
        for i in empty:
            if runs and slots[i] == slots[runs[-1][-1]] + 1:
                runs[-1].append(i)
            else:
                runs.append([i])
        for run in runs:
            fit = [run[j] for j in shared_prompt_positions([items[i][2] for i in run])]
            # a group must be consecutive slots: its fitting members from the run's first on
            group = [i for k, i in enumerate(run) if k < len(fit) and fit[k] == i]
            if self._slots.states is not None:  # of the first one's length, from the first on
                group = group[:next((k for k, i in enumerate(group) if len(items[i][1]) != len(items[group[0]][1])),
                                    len(group))]
            if len(group) > 1:
                groups.append(group)
        return groups

    def unreserve(self, count: int) -> None:
        """Give back slots promised to forks that will not come (their request ended first)."""
        with self._lock:
            self._reserved -= count

    def fork(self, handle: int, count: int) -> list[int]:
        """Copy request ``handle``'s cached rows into ``count`` new slots (n answers of one prompt; a copy inside the
        cache's memory, no forward; reserved slots are used first) -> their handles."""
        with self._lock:
            used = min(count, self._reserved)
            self._reserved -= used
            self._take(count - used)
            src, out = self._order.index(handle), []
            for _ in range(count):
                self._slots.copy(src, len(self._order))  # its KV rows and its states
                out.append(self._next)
                self._order.append(self._next)
                self._next += 1
        return out

    def join(self, inputs_embeds: np.ndarray, positions: np.ndarray,
             extras: dict[str, np.ndarray] | None = None) -> tuple[int, np.ndarray]:
        """Prefill a new request: inputs_embeds float32 [1, S, d], positions int64 [R, S], decoder extras
        {name: float32 [1, S, d]} (contract v4; zeros for those not given) -> (handle, logits [V]).
        ValueError (one line) when every slot is taken or S exceeds the capacity."""
        handle = self.open()
        try:
            logits = self._slots.run(len(self._order) - 1, 1, inputs_embeds, [positions], extras)[0]
        except Exception:
            self.leave(handle)
            raise
        return handle, logits

    def admit(self, inputs: list[tuple[np.ndarray, np.ndarray]], prefixes: list | None = None) -> list[int]:
        """Admit k new requests without their last prompt row: per request a KVSnapshot restored into its slot
        (prefixes[i], or None) and then its rows (inputs[i]: embeds float32 [S_i, d], positions int64 [R, S_i]
        [, decoder extras {name: [S_i, d]}], S_i >= 0) -> handles in input order: ``open`` + ``extend``. Each
        request's last prompt row then goes into the next ``step`` beside the others' tokens, whose logits start
        its answer. ValueError (one line) when the slots or the capacity do not suffice (nothing is admitted)."""
        k = len(inputs)
        prefixes = list(prefixes) if prefixes is not None else [None] * k
        self._take(k)
        need = max((0 if p is None else p.length) + len(e) + 1 for (e, *_), p in zip(inputs, prefixes))
        if need > self.capacity:
            raise ValueError(f"KV cache holds {self.capacity} tokens; {need} requested")
        handles = [self.open(p) for p in prefixes]
        self.extend([(h, *item) for h, item in zip(handles, inputs) if len(item[0])])
        return handles

    def snapshot(self, handle: int) -> KVSnapshot:
        """Host copies of request ``handle``'s cached tokens: per layer key and value [1, H_kv, P, hd]."""
        return self._slots.snapshot(self._order.index(handle))

    def step(self, feeds: dict[int, tuple[np.ndarray, np.ndarray]]) -> dict[int, np.ndarray]:
        """One token for every active request: {handle: (embedding float32 [d], position int64 [R][, decoder
        extras {name: [d]} or None])} ->
        {handle: logits float32 [V]}. Every active request must be fed (leave the ones that stop first)."""
        if set(feeds) != set(self._order):
            raise ValueError(f"step feeds requests {sorted(feeds)}; the batch holds {sorted(self._order)}")
        count = len(self._order)
        embeds = np.stack([feeds[h][0] for h in self._order])[:, None, :]
        positions = [np.asarray(feeds[h][1], dtype=np.int64).reshape(-1, 1) for h in self._order]
        # decoder extras of a row that has them (a request's last prompt row may be a visual row): a third item
        # {name: [d]}; the others' rows get zeros
        given = [(i, feeds[h][2]) for i, h in enumerate(self._order) if len(feeds[h]) > 2 and feeds[h][2]]
        # contract v5: a row fed alone attends causally whatever its block (its block's other rows, if any, are
        # never split from it: the runtime's whole ranges keep a block in one prefill call)
        given = [(i, {k: v for k, v in x.items() if k != ATTENTION_BLOCKS}) for i, x in given]
        given = [(i, x) for i, x in given if x]
        extras = None
        if given:
            extras = {name: np.zeros_like(embeds) for name in self._slots.extra_names}
            for i, x in given:
                for name, value in x.items():
                    extras[name][i, 0] = value
        logits = self._slots.run(0, count, embeds, positions, extras)
        return {h: logits[i] for i, h in enumerate(self._order)}

    def leave(self, handle: int) -> None:
        """Drop request `handle`; the last active slot moves into its place so the active slots stay packed."""
        with self._lock:
            slot = self._order.index(handle)
            last = len(self._order) - 1
            if slot != last:
                self._slots.move(last, slot)
                self._order[slot] = self._order[last]
            self._slots.lengths[last] = 0
            self._order.pop()
