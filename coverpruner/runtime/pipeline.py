"""Pipeline: an exported engine dir answering a conversation (images, videos, text turns) with pruned visual tokens.

One request is a conversation with k images (per image j: n_j candidates, S_j image-span rows; hidden size d,
native length L, position rank R); ``generate(image, prompt)`` is the conversation of one user message
[image, prompt]. Everything family-specific is asked of the family runtime (families.contract.FamilyRuntime):

    each image -> family.prepare_image -> vision feeds -> vision -> family.image_span -> rows [S_j,d], candidates [n_j]
    messages -> family.conversation_layout([S_j]) -> ids [L], image spans [S_j], instruction tokens per image
    embed (text ids only) + image rows -> native sequence [L,d]; family.native_positions -> [R,L]
    per image: probe at its candidates' positions -> relevance r [n_j]     (only for methods that use it)
    (V = rows[candidates], r, budget, tau) -> selector -> keep [m_j] ascending
    text + kept rows (+ the family's always-kept rows) in native order [L',d], family.pruned_positions
    -> decoder prefill -> logits -> sample -> decode loop at family.decode_position(t)

``Pipeline`` is the thin public facade over the parts, each passed to the next with its type:

    runtime/model.py     Model: the engine dir loaded (manifest, sessions, family runtime, tokenizer, decoder loop)
    runtime/requests.py  RequestBuilder: arguments -> one validated Request (options validated once)
    runtime/inputs.py    InputProcessor: native_sequence -> select -> pruned rows (Prepared)
    runtime/engine.py    Engine: the one loop (scheduler, admission beside decoding, stop rules, prefix blocks)

``request`` / ``chat_request`` build a Request; ``generate`` / ``stream`` / ``chat`` / ``chat_stream`` run it
through the pipeline's own engine (one slot, built once); ``batch_generate`` through a batch of slots; ``engine``
gives a driver (the server's workers) an engine of its own. The stages stay callable one by one
(``native_sequence`` -> ``select`` -> ``prefill`` -> ``decode``, gpt-fast's prefill / decode_one_token in
spirit; runtime/stages.py types what each hands on).

This module never imports torch or transformers' modeling code.
"""

from __future__ import annotations

import time
from typing import Iterator

import numpy as np

from coverpruner.engines.interfaces import SessionFactory
from coverpruner.runtime.engine import Engine
from coverpruner.runtime.errors import CoverPrunerError, OptionError
from coverpruner.runtime.inputs import InputProcessor
from coverpruner.runtime.model import SELECTOR_BACKENDS, Model, ort_form_problem  # noqa: F401 (re-exported)
# METHODS and parse_budget are also imported from here by the CLIs
from coverpruner.runtime.options import METHODS, GenerationOptions, parse_budget  # noqa: F401
from coverpruner.runtime.prefix_cache import BlockChain, PrefixCache
from coverpruner.runtime.requests import RequestBuilder
from coverpruner.runtime.result import GenerationResult
from coverpruner.runtime.slots import LoopSlots, Rows
from coverpruner.runtime.stages import DecodeState, NativeSequence, Prefill, Request, Selection

#: Prefix cache size when Pipeline.load is not told (MiB): off, so a library caller sees every stage run; the
#: server turns it on (coverpruner-serve --prefix-cache-mb, default 256).
DEFAULT_PREFIX_CACHE_MB = 0


class TextStream:
    """Iterator over decoded text pieces; ``result`` holds the GenerationResult once exhausted."""

    def __init__(self, gen: Iterator):
        self._gen = gen
        self.result: GenerationResult | None = None

    def __iter__(self):
        self.result = yield from self._gen


def _check_cache_mb(value) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
        raise OptionError(f"prefix_cache_mb must be a number >= 0, got {value!r}", param="prefix_cache_mb")
    return float(value)


class Pipeline:
    """A loaded engine dir answering requests (the facade: see the module docstring).

    One request at a time through generate / stream / chat (its own engine of one slot; use one Pipeline per
    thread). Timings are wall-clock seconds; when streaming, ``decode`` also contains the time the consumer spends
    between pieces.
    """

    def __init__(self, model: Model, prefix_cache_mb: float = DEFAULT_PREFIX_CACHE_MB):
        self.model = model
        self.requests = RequestBuilder(model)
        self.prefix_cache = PrefixCache(int(_check_cache_mb(prefix_cache_mb) * 2 ** 20))
        self._slots = LoopSlots(model.decoder, model.family_runtime.position_rank)  # the stages prefill / decode

    @classmethod
    def load(cls, path, provider: str = "cpu", threads: int | None = None,
             session_factory: SessionFactory | None = None, verify: bool = True,
             selector: str = "auto", prefix_cache_mb: float = DEFAULT_PREFIX_CACHE_MB,
             admission_threads: int | None = None, admission_share: float | None = None) -> "Pipeline":
        """Open ``path`` (an engine dir). provider: 'cpu', 'cuda' or 'tensorrt'. 'tensorrt' runs the native
        engines that `coverpruner-build` recorded in the manifest when there are any (refused with a clear
        message when they were built for another TensorRT version or GPU), else ORT's TensorRT EP.

        selector: how the coverpruner method runs. 'onnx': the dir's selector.onnx on the provider (same
        indices as coverpruner.selection up to float near-ties); 'numpy': coverpruner.selection; 'auto'
        (default): 'onnx' when the dir has a standard-op (loop) selector.onnx, except on provider 'cpu' above
        selection.blocked.FLOAT64_MAX_N (2,048) candidates, where numpy's float32 syrk makes 'numpy' faster; else
        'numpy' (`selector_for(n)` says which). Below that size on CPU the ONNX path also keeps the prefill fast:
        numpy's OpenBLAS threads keep spinning for ~0.1 s after its last call and take cores from the decoder
        prefill that follows; ORT runs the selector on its own non-spinning pool. Baselines stay numpy.

        threads: intra-op threads of the decoder and embedding (None: ORT's choice); admission_threads: of the
        vision, probe and selector graphs, which a server runs beside the decode steps (None: ``threads``);
        admission_share: on provider 'cpu', the share of the cores the admission of a threaded engine (a server's)
        gets while streams decode, the two taking turns (runtime/admission.py, "Sharing the cores in turns"; the
        admission graphs' threads then run at the lowest priority; None or 0: side by side, as the library's own
        calls run).

        prefix_cache_mb: MiB of the prefix cache (KV blocks of earlier pruned prefixes, vision outputs and
        selections, index included; runtime/prefix_cache.py); 0 turns it off.

        session_factory(name, path) -> session replaces the ORT factory (engines.interfaces.SessionFactory, e.g.
        engines.trt_session.TrtSessionFactory); a session with decoder_loop() brings its own DecoderLoop.
        Raises ManifestError / ProviderError with one-line messages on bad input.
        """
        _check_cache_mb(prefix_cache_mb)
        return cls(Model.load(path, provider, threads, session_factory, verify, selector, admission_threads,
                              admission_share), prefix_cache_mb)

    @property
    def prefix_cache(self) -> PrefixCache:
        """Pruned-prefix KV blocks, vision outputs and selections of earlier requests (runtime/prefix_cache.py)."""
        return self._cache

    @prefix_cache.setter
    def prefix_cache(self, cache: PrefixCache) -> None:
        """Another cache for the stages and the engines built from here on (e.g. a benchmark's on / off runs)."""
        self._cache = cache
        self.inputs = InputProcessor(self.model, cache)
        self._engine: Engine | None = None  # generate / stream / chat: one slot, built on first use

    # -- what the parts know, under the facade's names ----------------------------------------------
    @property
    def manifest(self):
        return self.model.manifest

    @property
    def provider(self) -> str:
        return self.model.provider

    @property
    def sessions(self) -> dict:
        return self.model.sessions

    @property
    def family(self):
        return self.model.family

    @property
    def family_runtime(self):
        return self.model.family_runtime

    @property
    def encoder(self):
        return self.model.encoder

    @property
    def grammars(self):
        return self.model.grammars

    @property
    def decoder(self):
        return self.model.decoder

    @property
    def decoder_form(self) -> str:
        return self.model.decoder_form

    @property
    def max_positions(self) -> int:
        return self.model.max_positions

    @property
    def max_visual_tokens(self) -> int:
        return self.model.max_visual_tokens

    @property
    def float_dtype(self) -> np.dtype:
        return self.model.float_dtype

    @property
    def eos_ids(self) -> set:
        return self.model.eos_ids

    @property
    def selector_backend(self) -> str:
        return self.model.selector_backend

    @property
    def selector_fallbacks(self) -> dict:
        return self.model.selector_fallbacks

    @property
    def max_video_pixels(self) -> int | None:
        """Most decoded pixels one video may hold (checked from its header before decoding); None: no bound."""
        return self.requests.max_video_pixels

    @max_video_pixels.setter
    def max_video_pixels(self, value: int | None) -> None:
        self.requests.max_video_pixels = value

    def selector_for(self, n: int, method: str = "coverpruner") -> str:
        """Model.selector_for: "onnx" or "numpy", the selector that runs ``method`` for n candidates."""
        return self.model.selector_for(n, method)

    def vision(self, feeds: dict, shrink: bool = False) -> dict:
        return self.model.vision(feeds, shrink)

    def vision_of(self, vision) -> dict:
        return self.model.vision_of(vision)

    def embed(self, ids: np.ndarray) -> np.ndarray:
        return self.model.embed(ids)

    def relevance(self, embeds, positions, visual_pos, instr_pos) -> np.ndarray:
        return self.model.relevance(embeds, positions, visual_pos, instr_pos)

    def select_onnx(self, feats, relevance, budget: int, tau: float, method: str = "coverpruner",
                    options: dict | None = None) -> np.ndarray:
        return self.model.select_onnx(feats, relevance, budget, tau, method, options)

    def check_files(self) -> None:
        self.model.check_files()

    def family_options(self) -> dict:
        """The family's request options and their values when a request names none: {name: default}."""
        return self.requests.resolve_options({})

    def resolve_options(self, given: dict) -> dict:
        return self.requests.resolve_options(given)

    def clear_prefix_cache(self) -> None:
        """Forget every cached prefix, vision output and selection."""
        self.prefix_cache.clear()

    # -- requests ---------------------------------------------------------------------------------
    # Every public call takes its generation options by name: GenerationOptions' fields (budget, method, tau,
    # demand, max_new_tokens, temperature, top_p, seed, stop, n, logprobs, ignore_eos, max_images, ...) and the
    # family's request options as keyword arguments, or a GenerationOptions as ``options=`` (keywords given beside
    # it replace its fields).
    def request(self, image, prompt: str, *, options: GenerationOptions | None = None, **kwargs) -> Request:
        """generate's arguments -> a validated Request (RequestBuilder.request)."""
        return self.requests.request(image, prompt, GenerationOptions.of(options, **kwargs))

    def chat_request(self, messages, *, options: GenerationOptions | None = None, **kwargs) -> Request:
        """chat's arguments -> a validated Request. OptionError / PromptError (one line) for a bad option or a
        malformed message (naming messages[i].content[j]); more than max_images images is a PromptError."""
        return self.requests.chat_request(messages, GenerationOptions.of(options, **kwargs))

    def check_chat(self, messages, *, options: GenerationOptions | None = None, **kwargs) -> None:
        """chat_request's checks that need no image or video bytes (options, messages, the number of images, the
        text's size), for a caller that has not fetched them yet (the server: stand-ins in their place)."""
        self.requests.chat_request(messages, GenerationOptions.of(options, **kwargs), videos=False)

    # -- answering --------------------------------------------------------------------------------
    def chat(self, messages, *, options: GenerationOptions | None = None, **kwargs) -> GenerationResult:
        """Answer a conversation: OpenAI-format ``messages`` (system / user / assistant; content a string or parts
        {"type": "text"}, {"type": "image_url", "image_url": {"url": data: URL or local path}}, {"type": "image",
        "image": path | PIL image | uint8 array}, and for families with video (Qwen2.5-VL) {"type": "video",
        "video": [frames] | video file path | file bytes, "fps": float, "max_frames": int}). Each image and each
        video is pruned to ``budget`` of its own candidates with the demand of its own message (demand="turn") or
        of the last user message ("latest"); family options such as ``video_window`` / ``max_video_frames``
        (docs/qwen2_5_vl.md, "Video") come as keyword arguments. The result's ``images`` hold each image's or
        video's kind, kept_indices / relevance / num_visual_tokens (and a video's grid_thw, num_frames,
        second_per_grid_t); ``cached_tokens`` the prefix rows reused from earlier requests. max_images: the most
        images and videos the request may hold (default: the manifest's defaults.max_images, else 8). Options:
        runtime.options.GenerationOptions (by keyword or ``options=``)."""
        stream = self.chat_stream(messages, options=options, **kwargs)
        for _ in stream:
            pass
        return stream.result

    def chat_stream(self, messages, *, options: GenerationOptions | None = None, **kwargs) -> TextStream:
        """Like chat, but iterating yields text pieces as they decode; ``.result`` at the end."""
        return TextStream(self._run(self.chat_request(messages, options=options, **kwargs)))

    def generate(self, image, prompt: str, *, options: GenerationOptions | None = None,
                 **kwargs) -> GenerationResult:
        """Answer ``prompt`` about ``image`` (path, PIL image or uint8 array). Options: GenerationOptions by
        keyword or ``options=`` (budget: int, "full" or None; ignore_eos: keep decoding past EOS up to
        max_new_tokens, for fixed-length benchmark runs; stop: strings that end the answer; the family's request
        options (``family_options()``, e.g. newline_policy="keep" for LLaVA-NeXT) by their names, unset ones
        taking the engine dir's defaults)."""
        stream = self.stream(image, prompt, options=options, **kwargs)
        for _ in stream:
            pass
        return stream.result

    def stream(self, image, prompt: str, *, options: GenerationOptions | None = None, **kwargs) -> TextStream:
        """Like generate, but iterating yields text pieces as they decode; ``.result`` at the end.

        Options are validated here, before any work, so bad options fail at the call.
        """
        return TextStream(self._run(self.request(image, prompt, options=options, **kwargs)))

    def _run(self, request: Request):
        """The pipeline's own engine (one slot) with this request; when a graph fails unexpectedly, a changed file
        (if any) is the error reported."""
        if self._engine is None:
            self._engine = self.engine()
        try:
            return (yield from self._engine.run(request))
        except CoverPrunerError:
            raise
        except Exception:
            self.model.check_files()
            raise

    def engine(self, max_batch: int = 1, capacity: int | None = None, max_step_tokens: int | None = None,
               threaded: bool = False) -> Engine:
        """An engine loop (runtime/engine.py) over this pipeline for a driver that submits requests and steps it
        (the server's workers: threaded, its admission on a worker thread beside the decode steps): max_batch 1
        runs on the model's own DecoderLoop (any decoder form), more on a BatchDecoder of ``max_batch`` slots of
        ``capacity`` KV tokens (ORT-form decoder), max_step_tokens tokens a step (runtime/scheduler.py)."""
        return Engine.build(self.model, self.inputs, self._cache, max_batch, capacity, max_step_tokens, threaded,
                            self.model.admission_share)

    def batch_generate(self, requests: list[dict], max_batch: int = 8, capacity: int | None = None
                       ) -> list[GenerationResult]:
        """Answer several requests together in the engine loop (runtime/engine.py): up to ``max_batch`` decode in
        one decoder call per token (continuous batching; max_batch > 1 needs the ORT-form decoder).

        requests: one dict of ``generate``'s keyword arguments each (image, prompt, budget, ...). capacity: KV
        tokens per request (default the model's max positions). Returns the results in request order; the first
        request that fails raises its one-line error.
        """
        engine = self.engine(max_batch, capacity or (None if max_batch == 1 else self.max_positions))
        ids = [engine.submit(self.request(**kw)) for kw in requests]
        results = {}
        while engine.pending:
            for event in engine.step():
                if event.error is not None:
                    raise event.error
                if event.result is not None:
                    results[event.request_id] = event.result
        return [results[i] for i in ids]

    # -- one request, stage by stage (runtime/stages.py holds what they pass on) --------------------
    def native_sequence(self, request: Request) -> NativeSequence:
        """InputProcessor.native_sequence: images -> vision -> image spans -> layout -> embeds [L,d], positions."""
        return self.inputs.native_sequence(request)

    def select(self, request: Request, native: NativeSequence) -> Selection:
        """InputProcessor.select: per image the probe's demand and the selector's kept candidates."""
        return self.inputs.select(request, native)

    def pruned_sequence(self, request: Request, native: NativeSequence, selection: Selection):
        """InputProcessor.pruned_sequence: rows int64 [L'], positions int64 [R,L'], DecodeState."""
        return self.inputs.pruned_sequence(request, native, selection)

    def row_identities(self, native: NativeSequence, selection: Selection, rows, positions) -> np.ndarray:
        return self.inputs.row_identities(native, selection, rows, positions)

    def prefill(self, request: Request, native: NativeSequence, selection: Selection) -> Prefill:
        """Pruned sequence (all text tokens + every image's kept rows, native order) [L',d] at the family's pruned
        positions [R,L'] -> the model's decoder (cache reset to L' + the tokens the request may generate; the
        longest prefix the prefix cache holds restored, at most L' - 1 rows) -> first logits. Timing: prefill."""
        t = time.perf_counter()
        rows, positions, state = self.pruned_sequence(request, native, selection)
        identity, blocks = None, []
        if self.prefix_cache.enabled:
            identity = self.row_identities(native, selection, rows, positions)
            whole = self.inputs.whole_ranges(native, rows)  # contract v5: no block split by the restore
            blocks = self.prefix_cache.match(BlockChain(identity), len(rows) - 1, whole)
        try:
            self._slots.open(blocks, len(rows) + state.max_tokens)
        finally:
            self.prefix_cache.release(blocks)
        cached = self._slots.length(0)
        (logits,) = self._slots.prefill([Rows(0, native.embeds[rows[cached:]], positions[:, cached:],
                                              native.extras_at(rows[cached:]))]).values()
        self.model.check_files()
        return Prefill(rows, logits, state, {"prefill": time.perf_counter() - t}, cached, identity)

    def decode(self, state: DecodeState, token: int) -> np.ndarray:
        """One decode step: feed ``token`` (generated token number state.step) at the family's decode position,
        advance state.step -> logits float [V] of the next token (valid until the next decoder call)."""
        pos = np.asarray(self.family_runtime.decode_position(state.native, state.pruned, state.step), dtype=np.int64)
        state.step += 1
        return self._slots.decode({0: (self.embed(np.array([token], dtype=np.int64))[0], pos)})[0]
