"""The input stages of one request, before its decoder rows: native sequence (family preprocessing, vision, image
spans, conversation layout, embeddings, native positions), selection (layer-0 probe + selector per image) and the
pruned sequence (the rows the decoder sees, their positions and row identities). ``InputProcessor.prepare`` runs
them all -> ``Prepared``, what the engine loop schedules (runtime/engine.py); the admission worker runs it beside
the decode steps (runtime/admission.py), so it takes a ``check`` called between stages that raises once the
request was cancelled.

Everything family-specific is asked of the family runtime (families.contract.FamilyRuntime); shapes as in
runtime/stages.py (n candidates, S image-span rows, d hidden, L native length, L' pruned length, R position rank).
Thread-safety: one InputProcessor serves one admission worker at a time; the prefix cache it reads and fills is
locked (runtime/prefix_cache.py).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

import numpy as np

from coverpruner.engine_dir import ATTENTION_BLOCKS, graph_spec
from coverpruner.runtime.attention_blocks import native_blocks, whole_ranges
from coverpruner.runtime.errors import CoverPrunerError, ImageError, ManifestError, PromptError
from coverpruner.runtime.model import Model
from coverpruner.runtime.prefix_cache import PrefixCache, feeds_hash, hash63, row_identity
from coverpruner.runtime.result import TIMING_KEYS
from coverpruner.runtime.stages import DecodeState, ImageSelection, NativeSequence, Request, Selection
from coverpruner.selection import get_method, get_selector, uses_relevance  # numpy; torch only for torch tensors
from coverpruner.selection.windowed import select_in_windows
from coverpruner.video import VideoInput


def _method_kwargs(request: Request) -> dict:
    """The method options the request's selector takes (its registry declaration), from request.options."""
    return {o.name: request.options.get(o.name, o.default) for o in get_method(request.method).options}


def _with_extras(digest: bytes, span) -> bytes:
    """An image's feeds digest extended by its decoder extras' bytes (ImageSpan.extras, sorted by name) and its
    rows' blocks (contract v5)."""
    h = hashlib.sha256(digest)
    for name in sorted(span.extras):
        h.update(name.encode())
        h.update(np.ascontiguousarray(span.extras[name]).data)
    if span.blocks is not None:
        h.update(b"blocks")
        h.update(np.ascontiguousarray(span.blocks, dtype=np.int64).data)
    return h.digest()


def _block_hashes(digest: bytes, blocks: np.ndarray, kept_rows: np.ndarray) -> dict[int, int]:
    """{block value: hash63 of (image digest, the value, the block's kept rows)} of one image's blocks (contract v5):
    a kept row of a block attends to the block's later kept rows, so its KV is named by all of them."""
    kept_blocks = np.asarray(blocks)[kept_rows]
    out = {}
    for v in np.unique(kept_blocks).tolist():
        h = hashlib.sha256(digest)
        h.update(np.asarray([v], np.int64).data)
        h.update(np.ascontiguousarray(kept_rows[kept_blocks == v], dtype=np.int64).data)
        out[v] = hash63(h.digest())
    return out


def _no_check() -> None:
    """A request nobody can cancel."""


@dataclass
class Prepared:
    """A request whose inputs are ready for the decoder: its native sequence and selection, the pruned rows int64
    [L'] (ascending native indices), their positions int64 [R,L'], the DecodeState, the rows' identities int64
    [L', 2+R] (None with the prefix cache off: runtime.prefix_cache.row_identity), the stages' timings and the row
    ranges [a, b) one decoder call must hold together (contract v5's blocks: runtime/attention_blocks.py; () for
    a causal decoder)."""

    native: NativeSequence
    selection: Selection
    rows: np.ndarray
    positions: np.ndarray
    state: DecodeState
    identity: np.ndarray | None = None
    timings: dict = field(default_factory=dict)
    whole: tuple = ()

    @property
    def length(self) -> int:
        """L', the pruned sequence length."""
        return len(self.rows)

    @property
    def turn_end(self) -> int | None:
        """The pruned rows before the chat template's generation prompt (the layout's turn_end, contract v5; None
        when the layout does not say): where a decoder with states is snapshotted for a later turn."""
        end = self.native.layout.turn_end
        return None if end is None else int(np.searchsorted(self.rows, end))

    def embeds(self, start: int, stop: int) -> np.ndarray:
        """float [S,d]: the embeddings of pruned rows start..stop-1."""
        return self.native.embeds[self.rows[start:stop]]

    def extras(self, start: int, stop: int) -> dict[str, np.ndarray] | None:
        """The decoder extras of pruned rows start..stop-1: {name: float [S,d]} (and contract v5's
        ATTENTION_BLOCKS: int64 [S], the rows' blocks), None without extras."""
        return self.native.extras_at(self.rows[start:stop])


class InputProcessor:
    """The input stages over one Model and its prefix cache (vision outputs and selections are cached there)."""

    def __init__(self, model: Model, cache: PrefixCache):
        self.model, self.cache = model, cache

    # -- the whole admission ------------------------------------------------------------------
    def prepare(self, request: Request, capacity: int | None = None, check=_no_check) -> Prepared:
        """native_sequence -> select -> pruned_sequence (+ row identities when the prefix cache is on).
        capacity: KV tokens a batch slot holds: PromptError (one line) when the request needs more. check(): raises
        once the request was cancelled; called before each stage."""
        check()
        native = self.native_sequence(request, check)
        check()
        selection = self.select(request, native)
        check()
        t = time.perf_counter()
        rows, positions, state = self.pruned_sequence(request, native, selection)
        if capacity is not None and len(rows) + state.max_tokens > capacity:
            raise PromptError(f"request needs {len(rows)} prompt + {state.max_tokens} new tokens; the batch's KV "
                              f"capacity is {capacity} per request")
        whole = self.whole_ranges(native, rows)
        identity = self.row_identities(native, selection, rows, positions) if self.cache.enabled else None
        timings = dict.fromkeys(TIMING_KEYS, 0.0)
        for stage in (native, selection):
            timings.update(stage.timings)
        timings["prefill"] = time.perf_counter() - t  # planning the rows is the prefill's first part
        return Prepared(native, selection, rows, positions, state, identity, timings, whole)

    # -- native sequence ------------------------------------------------------------------------
    def _prepare_media(self, image, options: dict):
        """The family's steps before the graphs: vision inputs of an image or a video (coverpruner.video.VideoInput);
        ImageError / VideoError / PromptError on bad input (a family without video refuses it in one line)."""
        try:
            if isinstance(image, VideoInput):
                return self.model.family_runtime.prepare_video(image, options)
            return self.model.family_runtime.prepare_image(image, options)
        except CoverPrunerError:
            raise
        except ValueError as exc:
            raise ImageError(str(exc).splitlines()[0]) from None

    def _image_span(self, outputs: dict, vision, options: dict):
        try:
            return self.model.family_runtime.image_span(outputs, vision, options)
        except ValueError as exc:  # the graph's outputs disagree with the manifest
            raise ManifestError(f"{self.model.manifest.root / 'manifest.json'}: {str(exc).splitlines()[0]}") from None

    def native_sequence(self, request: Request, check=_no_check) -> NativeSequence:
        """Images -> family preprocessing -> vision (cached by feed hash) -> image spans -> conversation layout
        (after the images: S_j is per request) -> embeds [L,d] (text ids embedded, each image's rows at its span)
        -> native positions [R,L]. Timings: preprocess (images, chat template, tokenization), vision, embed.
        PromptError / ImageError (one line) on bad input. check(): called between images (and video chunks)."""
        model, cache = self.model, self.cache
        t = time.perf_counter()
        conversation = request.conversation
        visions = [self._prepare_media(image, request.options) for image in conversation.images]
        hashes = [feeds_hash(v.feeds) if cache.enabled else b"" for v in visions]
        times = {"preprocess": time.perf_counter() - t, "vision": 0.0}
        spans = []
        for vision, digest in zip(visions, hashes):
            check()
            t = time.perf_counter()
            outputs = cache.get_vision(digest) if cache.enabled else None
            if outputs is None:
                outputs = model.vision_of(vision, check)
                cache.put_vision(digest, outputs)
            spans.append(self._image_span(outputs, vision, request.options))
            times["vision"] += time.perf_counter() - t

        t = time.perf_counter()
        layout = model.encoder.encode_conversation(conversation.messages, [len(span.rows) for span in spans],
                                                   [v.facts for v in visions], conversation.tools,
                                                   conversation.template_kwargs)
        L = len(layout.input_ids)
        if L >= model.max_positions:
            rows = sum(len(span.rows) for span in spans)
            raise PromptError(f"prompt is {L} tokens including {rows} image tokens; the context allows "
                              f"{model.max_positions - 1} before the first answer token",
                              code="context_length_exceeded")
        positions = np.asarray(model.family_runtime.native_positions(layout, visions), dtype=np.int64)  # [R,L]
        times["preprocess"] += time.perf_counter() - t

        t = time.perf_counter()
        d = int(model.manifest.dims["hidden_size"])
        is_text = np.ones(L, dtype=bool)
        is_text[layout.visual_positions] = False
        embeds = np.empty((L, d), dtype=model.float_dtype)
        embeds[is_text] = model.embed(layout.input_ids[is_text])
        for span, where in zip(spans, layout.image_spans):
            embeds[where] = span.rows
        extras = self._native_extras(spans, layout, L, d)
        if graph_spec(model.manifest, "decoder").attention.blocks:  # contract v5: each row's block, gathered alike
            extras[ATTENTION_BLOCKS] = native_blocks(spans, layout.image_spans, L)
        if extras and cache.enabled:  # a cached KV prefix holds the extras' effect: they are part of its identity
            hashes = [_with_extras(h, span) for h, span in zip(hashes, spans)]
        times["embed"] = time.perf_counter() - t
        return NativeSequence(visions, spans, layout, embeds, positions, times, hashes, extras)

    def _native_extras(self, spans: list, layout, length: int, d: int) -> dict[str, np.ndarray]:
        """The decoder extras (contract v4, graphs.decoder.extras) over the native sequence: {name: float [L, d]},
        each image's ImageSpan.extras[name] at its span's rows, zeros at the text rows; {} without extras.
        ManifestError (one line) when an image span lacks a declared extra or brings an undeclared one."""
        manifest = self.model.manifest
        names = graph_spec(manifest, "decoder").extra_names
        out = {name: np.zeros((length, d), dtype=self.model.float_dtype) for name in names}
        for j, (span, where) in enumerate(zip(spans, layout.image_spans)):
            if set(span.extras) != set(names):
                raise ManifestError(f"{manifest.root / 'manifest.json'}: graphs.decoder.extras names "
                                    f"{list(names)}; the family's image span {j} brings {sorted(span.extras)}")
            for name in names:
                rows = np.asarray(span.extras[name])
                if rows.shape != (len(where), d):
                    raise ManifestError(f"{manifest.root / 'manifest.json'}: decoder extra {name!r} of image "
                                        f"{j} is {list(rows.shape)}; its span has [{len(where)}, {d}] rows")
                out[name][where] = rows
        return out

    # -- selection ------------------------------------------------------------------------------
    def _selection_key(self, request: Request, native: NativeSequence, j: int) -> bytes:
        """The cache key of image j's selection with demand="turn": everything it reads (the native rows up to
        its last instruction token or its own last row, the images among them, the selection options)."""
        layout = native.layout
        end = int(max(layout.image_spans[j].max(initial=-1), layout.instruction_turn[j].max(initial=-1))) + 1
        h = hashlib.sha256()
        h.update(np.ascontiguousarray(layout.input_ids[:end]).data)
        h.update(np.ascontiguousarray(native.positions[:, :end]).data)
        for k, span in enumerate(layout.image_spans):
            if span.size and span[0] < end:
                h.update(native.image_hashes[k])
        h.update(np.ascontiguousarray(layout.instruction_turn[j]).data)
        h.update(repr((j, request.method, request.budget, request.tau, request.seed, sorted(request.options.items()),
                       self.model.selector_for(len(native.spans[j].candidates), request.method))).encode())
        return h.digest()

    def _select_one(self, request: Request, feats: np.ndarray, relevance) -> np.ndarray:
        """One image's selector: V [n,d], relevance float32 [n] or None (uniform) -> keep int64 [m] ascending."""
        n = len(feats)
        reads = uses_relevance(request.method)
        backend = self.model.selector_for(n, request.method)
        if backend == "onnx" and (relevance is not None or not reads):
            return self.model.select_onnx(feats, relevance, request.budget, request.tau, request.method,
                                          _method_kwargs(request))
        self.model.warn_fallback(request.method)
        if relevance is None and reads:
            relevance = np.ones(n, dtype=np.float32)  # no instruction text: constant demand = uniform weights
        # selectors ignore options they do not use (tau: coverpruner, seed: random)
        return np.asarray(get_selector(request.method)(np.asarray(feats, np.float32), relevance=relevance,
                                                       budget=request.budget, tau=request.tau, seed=request.seed,
                                                       **_method_kwargs(request)), dtype=np.int64)

    def _select_windowed(self, request: Request, span, relevance, window: int) -> np.ndarray:
        """A video's selection within temporal windows of ``window`` temporal patches (the request option
        video_window): coverpruner.selection.windowed.select_in_windows over window ids temporal // window ->
        keep int64 [m] ascending."""
        feats = np.asarray(span.features, np.float32)
        if relevance is None and uses_relevance(request.method):
            relevance = np.ones(len(feats), dtype=np.float32)
        windows = (np.asarray(span.temporal, dtype=np.int64) // int(window)).astype(np.int64)
        return np.asarray(select_in_windows(get_selector(request.method), feats, relevance, request.budget, windows,
                                            tau=request.tau, seed=request.seed, **_method_kwargs(request)),
                          dtype=np.int64)

    def select(self, request: Request, native: NativeSequence) -> Selection:
        """Per image: layer-0 demand from the probe (only for methods that read it; instruction tokens of its own
        message or of the last user message, request.demand) + the selector over its own V = rows[candidates]
        -> keep [m] ascending, m = min(budget, n_j). Budget "full" keeps everything and runs neither. Images
        that share instruction tokens share one probe call. Timings: probe, select (the stages that ran)."""
        spans, layout, times = native.spans, native.layout, {}
        if request.budget is None:
            return Selection([ImageSelection(np.arange(len(s.candidates), dtype=np.int64), None,
                                             np.arange(len(s.rows), dtype=np.int64)) for s in spans], times)
        t = time.perf_counter()
        cache = self.cache
        keys = ([self._selection_key(request, native, j) for j in range(len(spans))]
                if cache.enabled and request.demand == "turn" else [None] * len(spans))
        found = [cache.get_selection(k) if k is not None else None for k in keys]
        relevance = {}
        if uses_relevance(request.method):
            groups = {}
            for j in range(len(spans)):
                instr = layout.instruction(j, request.demand)
                if found[j] is None and instr.size:
                    groups.setdefault(instr.tobytes(), (instr, []))[1].append(j)
            for instr, images in groups.values():  # the probe averages per column: one call serves them all
                cols = [native.candidates_of(j) for j in images]
                r = self.model.relevance(native.embeds, native.positions, np.concatenate(cols), instr)
                for j, part in zip(images, np.split(r, np.cumsum([len(c) for c in cols])[:-1])):
                    relevance[j] = part
            if groups:
                times["probe"], t = time.perf_counter() - t, time.perf_counter()
        images = []
        for j, span in enumerate(spans):
            if found[j] is not None:
                keep, rel = found[j]
            else:
                rel = relevance.get(j)
                window = request.options.get("video_window")
                keep = (self._select_windowed(request, span, rel, window) if window and span.temporal is not None
                        else self._select_one(request, span.features, rel))
                if keys[j] is not None:
                    cache.put_selection(keys[j], keep, rel)
            # the kept candidates and the family's always-kept rows (e.g. LLaVA-NeXT's newlines with "keep")
            images.append(ImageSelection(keep, rel, np.union1d(span.candidates[keep], span.always_kept)
                                         .astype(np.int64)))
        times["select"] = time.perf_counter() - t
        return Selection(images, times)

    # -- the pruned sequence ----------------------------------------------------------------------
    def row_identities(self, native: NativeSequence, selection: Selection, rows: np.ndarray,
                       positions: np.ndarray) -> np.ndarray:
        """int64 [L', 2+R]: the pruned rows' identities (runtime.prefix_cache.row_identity); a row of a contract v5
        block names its image, its block and the block's kept rows (whose later rows its KV saw)."""
        image_rows = {}
        blocks = ATTENTION_BLOCKS in native.extras
        for where, digest, sel, span in zip(native.layout.image_spans, native.image_hashes, selection.images,
                                            native.spans):
            h = hash63(digest)
            of_block = (_block_hashes(digest, span.blocks, sel.kept_rows)
                        if blocks and span.blocks is not None else {})
            for r in sel.kept_rows.tolist():
                image_rows[int(where[r])] = (of_block[int(span.blocks[r])] if of_block else h, r)
        return row_identity(native.layout.input_ids, rows, positions, image_rows)

    def whole_ranges(self, native: NativeSequence, rows: np.ndarray) -> tuple[tuple[int, int], ...]:
        """The ranges [a, b) of the pruned rows (int64 [L']) one decoder call holds together (contract v5's blocks of
        two or more kept rows; runtime/attention_blocks.py). PromptError (one line) when the last row is in one: its
        logits come from a call of its own."""
        blocks = native.extras.get(ATTENTION_BLOCKS)
        whole = whole_ranges(None if blocks is None else blocks[rows])
        if whole and whole[-1][1] == len(rows):
            a, b = whole[-1]
            raise PromptError(f"the prompt ends inside an image block (its rows {a}..{b - 1} attend to each other "
                              "both ways); it must end with text, as a chat template's generation prompt does")
        return whole

    def pruned_sequence(self, request: Request, native: NativeSequence,
                        selection: Selection) -> tuple[np.ndarray, np.ndarray, DecodeState]:
        """The rows the decoder sees, int64 [L'] ascending native indices, their positions int64 [R,L'] and the
        DecodeState (how many tokens fit before the context ends)."""
        fam, max_positions = self.model.family_runtime, self.model.max_positions
        kept = [where[sel.kept_rows] for where, sel in zip(native.layout.image_spans, selection.images)]
        rows = np.sort(np.concatenate([np.flatnonzero(native.is_text), *kept])).astype(np.int64)
        positions = np.asarray(fam.pruned_positions(native.positions, rows), dtype=np.int64)  # [R,L']
        first = int(np.max(fam.decode_position(native.positions, positions, 0)))
        steps = min(request.max_new_tokens, max_positions - first)
        state = DecodeState(native.positions, positions, steps,
                            "length" if steps == request.max_new_tokens else "context")
        return rows, positions, state
