"""Pipeline: an exported engine dir answering a conversation (images, videos, text turns) with pruned visual tokens.

One request is a conversation with k images (batch 1; per image j: n_j candidates, S_j image-span rows; hidden
size d, native length L, position rank R); ``generate(image, prompt)`` is the conversation of one user message
[image, prompt]. Everything family-specific is asked of the family runtime (families.contract.FamilyRuntime):

    each image -> family.prepare_image -> vision feeds -> vision -> family.image_span -> rows [S_j,d], candidates [n_j]
    messages -> family.conversation_layout([S_j]) -> ids [L], image spans [S_j], instruction tokens per image
    embed (text ids only) + image rows -> native sequence [L,d]; family.native_positions -> [R,L]
    per image: probe at its candidates' positions -> relevance r [n_j]     (only for methods that use it)
    (V = rows[candidates], r, budget, tau) -> selector -> keep [m_j] ascending
    text + kept rows (+ the family's always-kept rows) in native order [L',d], family.pruned_positions
    -> decoder prefill -> logits -> sample -> decode loop at family.decode_position(t)

The request loop is four named stages, each callable alone (gpt-fast's prefill / decode_one_token in spirit):
``request`` / ``chat_request`` (the options, runtime.options.GenerationOptions, validated once) ->
``native_sequence`` -> ``select`` -> ``prefill`` -> ``decode`` (one token); ``generate`` / ``stream`` / ``chat`` /
``chat_stream`` compose them. runtime/stages.py types what each stage hands to the next.

This module never imports torch or transformers' modeling code.
"""

from __future__ import annotations

import hashlib
import time
import warnings
from pathlib import Path
from typing import Iterator

import numpy as np

from coverpruner.engine_dir import (DEFAULT_MAX_IMAGES, METHOD_GRAPHS, REQUIRED_GRAPHS, IntegrityCheck, Manifest,
                                    graph_spec, load_manifest, position_ids_input, verify_files)
from coverpruner.engines.interfaces import SessionFactory
from coverpruner.engines.ort import PROVIDERS, OrtSessionFactory, ProviderError, device_type, shrink_arena_options
from coverpruner.engines.ort_decoder import OrtDecoderSession
from coverpruner.engines.ort_form_decoder import OrtFormDecoderSession
from coverpruner.families import get_family
from coverpruner.runtime.engine import Engine, feed_decode, feed_prefill, plan_prefill, token_row
from coverpruner.runtime.errors import (CoverPrunerError, ImageError, ManifestError, OptionError, PromptError,
                                        VideoError)
from coverpruner.runtime.messages import normalize, one_turn
from coverpruner.runtime.prefix_cache import PrefixCache, feeds_hash, hash63, row_identity
from coverpruner.runtime.result import GenerationResult, ImageResult
# METHODS and parse_budget are also imported from here by the CLIs
from coverpruner.runtime.options import (METHODS, GenerationOptions, check_method, check_method_options,  # noqa: F401
                                        check_tau, parse_budget, split_method_options)
from coverpruner.runtime.grammar import GrammarCompiler
from coverpruner.runtime.sampling import SamplingConfig
from coverpruner.runtime.stages import DecodeState, ImageSelection, NativeSequence, Prefill, Request, Selection
from coverpruner.runtime.text import PromptEncoder
from coverpruner.selection import get_method, get_selector, uses_relevance  # numpy; torch only for torch tensors
from coverpruner.selection.blocked import FLOAT64_MAX_N  # where auto runs numpy on CPU
from coverpruner.video import DEFAULT_MAX_VIDEO_PIXELS, VideoInput

#: Prefix cache size when Pipeline.load is not told (MiB): off, so a library caller sees every stage run; the
#: server turns it on (coverpruner-serve --prefix-cache-mb, default 256).
DEFAULT_PREFIX_CACHE_MB = 0


def _selector(method: str):
    return get_selector(check_method(method))


def _method_kwargs(request: Request) -> dict:
    """The method options the request's selector takes (its registry declaration), from request.options."""
    return {o.name: request.options.get(o.name, o.default) for o in get_method(request.method).options}


def _with_extras(digest: bytes, span) -> bytes:
    """An image's feeds digest extended by its decoder extras' bytes (ImageSpan.extras, sorted by name)."""
    h = hashlib.sha256(digest)
    for name in sorted(span.extras):
        h.update(name.encode())
        h.update(np.ascontiguousarray(span.extras[name]).data)
    return h.digest()


def _video_facts(facts: dict) -> dict | None:
    """What a result reports of a video (grid_thw, num_frames, second_per_grid_t); None for an image."""
    if facts.get("kind") != "video":
        return None
    return {"grid_thw": [int(v) for v in facts["grid_thw"]], "num_frames": int(facts["num_frames"]),
            "second_per_grid_t": float(facts["second_per_grid_t"])}


class TextStream:
    """Iterator over decoded text pieces; ``result`` holds the GenerationResult once exhausted."""

    def __init__(self, gen: Iterator):
        self._gen = gen
        self.result: GenerationResult | None = None

    def __iter__(self):
        self.result = yield from self._gen


#: selector="auto" runs the dir's loop-form selector.onnx, except on the CPU provider above
#: selection.blocked.FLOAT64_MAX_N candidates: there numpy's similarity is a float32 syrk (a symmetric rank-k
#: product, half the flops of the full GEMM ONNX Runtime runs), and the numpy backend is the faster one
#: (n = 2,880, d = 4,096, m = 320: docs/performance.md, benchmarks/bench_select_stage.py). The peers' graphs
#: (selector_dart / selector_cdpruner) run at every n: faster than their numpy selectors at every measured shape
#: (docs/performance.md, "The peers' selectors").
SELECTOR_BACKENDS = ("auto", "onnx", "numpy")


def ort_form_problem(manifest: Manifest, provider: str, session_factory) -> None:
    """OptionError (one line) when an ORT-form decoder cannot run on `provider`: it runs on ONNX Runtime's CPU
    provider, and on its CUDA provider in fp16 only (GroupQueryAttention has fp16/bf16 CUDA kernels only; an fp32
    node would run on the CPU with the whole KV cache copied over PCIe each step)."""
    if manifest.decoder_form != "ort":
        return
    if session_factory is not None or provider not in ("cpu", "cuda"):
        raise OptionError(f"{manifest.root}: the decoder is in ORT form (graphs.decoder.form 'ort'), which runs on "
                          f"ONNX Runtime's providers 'cpu' and 'cuda' only; got provider {provider!r}"
                          f"{' and a session factory' if session_factory is not None else ''} (re-export with "
                          "--decoder-form standard for TensorRT)", param="provider")
    if provider == "cuda" and manifest.precision != "fp16":
        raise OptionError(f"{manifest.root}: provider 'cuda' runs the ORT-form decoder in fp16 only (ONNX Runtime's "
                          f"CUDA GroupQueryAttention has no {manifest.precision} kernel); re-export with --dtype fp16 "
                          "--decoder-form ort", param="provider")


def _missing_peer_graphs(manifest: Manifest) -> dict[str, str]:
    """{peer method: why it selects in numpy} for the peers' selector graphs the dir lacks (exported before them),
    with the command that adds them."""
    root = manifest.root
    return {method: (f"{root}: no {graph}.onnx (the dir was exported before it); method {method!r} selects with its "
                     f"numpy selector: re-export it with `coverpruner-export --model MODEL --output {root} --dtype "
                     f"{manifest.precision} --graphs {graph}` (no weights are loaded)")
            for method, graph in METHOD_GRAPHS.items() if graph != "selector" and graph not in manifest.graphs}


class Pipeline:
    """Loaded engine dir: sessions for vision, embed, probe and decoder, tokenizer and settings.

    One request at a time: the decoder's KV-cache buffers belong to the instance (use one Pipeline
    per thread). Timings are wall-clock seconds; when streaming, ``decode`` also contains the time
    the consumer spends between pieces.
    """

    def __init__(self, manifest: Manifest, sessions: dict, provider: str = "cpu", selector: str = "auto",
                 prefix_cache_mb: float = DEFAULT_PREFIX_CACHE_MB):
        self.manifest = manifest
        #: pruned-prefix KV snapshots, vision outputs and selections of earlier requests (runtime/prefix_cache.py)
        self.prefix_cache = PrefixCache(int(float(prefix_cache_mb) * 2 ** 20))
        self.provider = provider
        #: the background re-check of the dir's files (engine_dir.IntegrityCheck) until it has passed
        self._integrity: IntegrityCheck | None = None
        #: how the coverpruner method selects: "auto" (see selector_for), "onnx" or "numpy"; "numpy" whenever no
        #: selector.onnx session was opened
        self.selector_backend = selector if "selector" in sessions else "numpy"
        #: {method: why it selects in numpy}: a peer method whose selector graph the dir lacks or that would not
        #: open; warned once, on the method's first selection (Pipeline.load fills it)
        self.selector_fallbacks: dict[str, str] = {}
        #: opens the peers' selector graphs on first use (Pipeline.load sets it; None: they select in numpy), so a
        #: load that never runs dart / cdpruner pays nothing for them
        self._peer_factory: SessionFactory | None = None
        self._failed_peers: set[str] = set()
        d, t = manifest.dims, manifest.token_ids
        #: upper bound on the candidates of one image (n itself is per request: GenerationResult.num_visual_tokens)
        self.max_visual_tokens = manifest.max_visual_tokens
        self.max_positions = int(d["max_position_embeddings"])
        #: most decoded pixels (sampled frames x height x width, 3 bytes each) one video may hold, checked from its
        #: header before decoding (_admit_videos); None: no bound. The server sets it from --max-video-pixels.
        self.max_video_pixels: int | None = DEFAULT_MAX_VIDEO_PIXELS
        self.float_dtype = np.dtype(manifest.float_dtype)
        self.eos_ids = set(np.atleast_1d(t["eos_token_id"]).astype(int).tolist())
        tok_file = next((f for f in manifest.raw.get("tokenizer_files", ["tokenizer.json"])
                         if f.endswith("tokenizer.json")), "tokenizer.json")
        try:
            self.family = get_family(manifest.family)
            #: the family's run-time rules bound to this dir (contract.FamilyRuntime)
            self.family_runtime = self.family.runtime(manifest)
        except (KeyError, ValueError) as exc:
            raise ManifestError(f"{manifest.root / 'manifest.json'}: {exc.args[0]}") from None
        self._options = {o.name: o for o in self.family.request_options}
        self.encoder = PromptEncoder(manifest.root / tok_file, t["image_token_id"], self.family_runtime)
        #: response_format -> its checked grammar (runtime/grammar.py; llguidance loaded on the first one)
        self.grammars = GrammarCompiler(self.encoder.tokenizer, int(d["vocab_size"]), self.eos_ids)
        self.sessions = sessions
        self.vision_outputs = [o.name for o in graph_spec(manifest, "vision").outputs]
        dims = (int(d["num_layers"]), int(d["num_kv_heads"]), int(d["head_dim"]), int(d["vocab_size"]))
        self.vocab_size = dims[3]
        # a session that brings its own KV-cache loop (native TensorRT engines keep the cache on the GPU)
        # provides decoder_loop(); ORT sessions use the IO-binding loop
        own_loop = getattr(sessions["decoder"], "decoder_loop", None)
        #: "standard" or "ort" (graphs.decoder.form): the ORT form has its own in-place KV loop
        self.decoder_form = manifest.decoder_form
        #: the decoder carries state that is not KV (contract v5, graphs.decoder.states): its prefix snapshots are
        #: taken at turn boundaries and restored whole (runtime/state_boundaries.py)
        self.decoder_states = bool(graph_spec(manifest, "decoder").states)
        if self.decoder_states and own_loop is not None and self.decoder_form != "ort":
            raise OptionError(f"{manifest.root}: the decoder carries state that is not KV (graphs.decoder.states); "
                              "the native TensorRT decoder loop does not carry it yet: use provider 'cpu' or 'cuda'")
        try:
            if self.decoder_form == "ort":
                self.decoder = OrtFormDecoderSession(sessions["decoder"], *dims,
                                                     graph_spec(manifest, "decoder").rotary, device_type(provider))
            elif own_loop is not None:
                self.decoder = own_loop(*dims, self.float_dtype)
            else:
                self.decoder = OrtDecoderSession(sessions["decoder"], *dims, self.float_dtype, device_type(provider))
        except ValueError as exc:  # dims.num_layers / num_kv_heads / head_dim disagree with the decoder graph
            raise ManifestError(f"{manifest.root / 'manifest.json'}: dims (num_layers {dims[0]}, num_kv_heads "
                                f"{dims[1]}, head_dim {dims[2]}) disagree with the decoder graph: "
                                f"{str(exc).splitlines()[0]}") from None

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def load(cls, path, provider: str = "cpu", threads: int | None = None,
             session_factory: SessionFactory | None = None, verify: bool = True,
             selector: str = "auto", prefix_cache_mb: float = DEFAULT_PREFIX_CACHE_MB) -> "Pipeline":
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

        prefix_cache_mb: MiB of the prefix cache (KV of earlier pruned prefixes, vision outputs and selections;
        runtime/prefix_cache.py); 0 turns it off.

        session_factory(name, path) -> session replaces the ORT factory (engines.interfaces.SessionFactory, e.g.
        engines.trt_session.TrtSessionFactory); a session with decoder_loop() brings its own DecoderLoop.
        Raises ManifestError / ProviderError with one-line messages on bad input.
        """
        if provider not in PROVIDERS:
            raise OptionError(f"unknown provider {provider!r}; expected one of {list(PROVIDERS)}", param="provider")
        if not isinstance(prefix_cache_mb, (int, float)) or isinstance(prefix_cache_mb, bool) or prefix_cache_mb < 0:
            raise OptionError(f"prefix_cache_mb must be a number >= 0, got {prefix_cache_mb!r}",
                              param="prefix_cache_mb")
        if selector not in SELECTOR_BACKENDS:
            raise OptionError(f"unknown selector backend {selector!r}; expected one of {list(SELECTOR_BACKENDS)}",
                              param="selector")
        manifest = load_manifest(Path(path), verify=False)
        # files unchanged since their last sha256 check are re-hashed (xxh3, full contents) in the background
        # while the sessions load and the first request runs; answers wait for it (see _verified)
        integrity = verify_files(manifest, background=True) if verify else None
        ort_form_problem(manifest, provider, session_factory)
        requested = selector  # "auto" without a loop-form selector.onnx still runs the peers' graphs
        if selector == "auto":
            has_loop = "selector" in manifest.graphs and manifest.raw.get("selector_form", "loop") == "loop"
            selector = "auto" if has_loop else "numpy"
        try:
            if session_factory is None and provider == "tensorrt" and manifest.raw.get("tensorrt"):
                # native engines; the decoder engine's session brings its own GPU KV-cache loop
                from coverpruner.engines.trt_session import TrtSessionFactory  # torch-free; TensorRT lazily

                session_factory = TrtSessionFactory(manifest.root)
            factory = session_factory or OrtSessionFactory(provider, threads, manifest=manifest.raw)
        except (ProviderError, RuntimeError, ValueError) as exc:  # no provider / no TensorRT / engine mismatch
            raise OptionError(str(exc).splitlines()[0]) from None
        names = REQUIRED_GRAPHS + (("selector",) if selector in ("onnx", "auto") else ())
        sessions = {}
        for name in names:
            try:
                sessions[name] = factory(name, graph_spec(manifest, name).path)
            except (RuntimeError, OSError, ValueError) as exc:  # a session could not be built from a verified file
                if integrity is not None:
                    integrity.result()  # a changed file explains the failure better
                raise ManifestError(str(exc).splitlines()[0]) from None
        pipe = cls(manifest, sessions, provider, selector, prefix_cache_mb)
        if requested != "numpy":
            pipe._peer_factory = factory
            pipe.selector_fallbacks = _missing_peer_graphs(manifest)
        pipe._integrity = integrity
        return pipe

    def clear_prefix_cache(self) -> None:
        """Forget every cached prefix, vision output and selection."""
        self.prefix_cache.clear()

    def batch_generate(self, requests: list[dict], max_batch: int = 8, capacity: int | None = None
                       ) -> list[GenerationResult]:
        """Answer several requests together in the engine loop (runtime/engine.py): up to ``max_batch`` decode in
        one decoder call per token (continuous batching; max_batch > 1 needs the ORT-form decoder).

        requests: one dict of ``generate``'s keyword arguments each (image, prompt, budget, ...). capacity: KV
        tokens per request (default the model's max positions). Returns the results in request order; the first
        request that fails raises its one-line error.
        """
        engine = Engine.for_pipeline(self, max_batch, capacity or (None if max_batch == 1 else self.max_positions))
        ids = [engine.submit(self.request(**kw)) for kw in requests]
        results = {}
        while engine.pending:
            for event in engine.step():
                if event.error is not None:
                    raise event.error
                if event.result is not None:
                    results[event.request_id] = event.result
        return [results[i] for i in ids]

    def selector_for(self, n: int, method: str = "coverpruner") -> str:
        """The selector that runs `method` for an image of n candidates: "onnx" (its graph, METHOD_GRAPHS, on the
        provider) or "numpy". coverpruner (auto): the loop-form selector.onnx, but numpy on the CPU provider above
        FLOAT64_MAX_N candidates; dart / cdpruner: their graph whenever its session is open (not with
        selector="numpy", nor for a dir without it: selector_fallbacks); the other methods: numpy."""
        graph = METHOD_GRAPHS.get(method)
        if graph != "selector":
            return "onnx" if graph is not None and self._peer_session(method, graph) else "numpy"
        if self.selector_backend != "auto":
            return self.selector_backend
        return "numpy" if self.provider == "cpu" and n > FLOAT64_MAX_N else "onnx"

    # -- stages -----------------------------------------------------------------------------
    def vision(self, feeds: dict[str, np.ndarray], shrink: bool = False) -> dict[str, np.ndarray]:
        """The vision graph on the family's feeds -> its outputs by name (batch axis included). shrink: ONNX
        Runtime's arena gives its unused memory back after the run (ORT sessions only)."""
        session = self.sessions["vision"]
        options = shrink_arena_options(session, self.provider) if shrink else None
        if options is None:
            return dict(zip(self.vision_outputs, session.run(self.vision_outputs, feeds)))
        return dict(zip(self.vision_outputs, session.run(self.vision_outputs, feeds, options)))

    def vision_of(self, vision) -> dict[str, np.ndarray]:
        """The vision outputs of one prepared input (families.contract.VisionInputs): its ``chunks`` one run after
        the other, outputs concatenated along their first axis (a video: peak memory of one chunk; the arena
        shrunk after the last), else one run over its ``feeds``."""
        if not vision.chunks:
            return self.vision(vision.feeds)
        last = len(vision.chunks) - 1
        parts = [self.vision(feeds, shrink=i == last) for i, feeds in enumerate(vision.chunks)]
        return {name: np.concatenate([p[name] for p in parts]) for name in self.vision_outputs}

    def embed(self, ids: np.ndarray) -> np.ndarray:
        """int64 [S] -> inputs_embeds [S,d]."""
        return self.sessions["embed"].run(["inputs_embeds"], {"input_ids": ids[None].astype(np.int64)})[0][0]

    def relevance(self, embeds: np.ndarray, positions: np.ndarray, visual_pos: np.ndarray,
                  instr_pos: np.ndarray) -> np.ndarray:
        """Layer-0 demand. embeds [L,d] native sequence, positions int64 [R,L] native, visual_pos int64 [n]
        (the candidates' sequence indices), instr_pos int64 [T] -> relevance float32 [n]."""
        feeds = {"inputs_embeds": embeds[None], "position_ids": position_ids_input(positions, len(positions)),
                 "visual_positions": visual_pos, "instruction_positions": instr_pos}
        return self.sessions["probe"].run(["relevance"], feeds)[0].astype(np.float32)

    def select_onnx(self, feats: np.ndarray, relevance: np.ndarray | None, budget: int, tau: float,
                    method: str = "coverpruner", options: dict | None = None) -> np.ndarray:
        """The selector graph of `method` (METHOD_GRAPHS: selector.onnx, selector_dart.onnx, ...): V [n,d],
        relevance float32 [n] (None for a method that does not read it), the budget, tau and the method's options
        (dart's pivots, cdpruner's relevance_weight) fed by the graph's input names and dtypes -> keep int64 [m]
        ascending."""
        graph = METHOD_GRAPHS[method]
        given = {"image_features": feats, "relevance": relevance, "budget": budget, "tau": tau, **(options or {})}
        inputs = graph_spec(self.manifest, graph).inputs
        missing = [t.name for t in inputs if given.get(t.name) is None]
        if missing:
            raise ManifestError(f"{self.manifest.root / 'manifest.json'}: graphs.{graph}.inputs name {missing}, "
                                f"which method {method!r} does not give")
        feeds = {t.name: np.asarray(given[t.name], dtype=t.dtype) for t in inputs}
        return self.sessions[graph].run(["keep"], feeds)[0].astype(np.int64)

    # -- generation -------------------------------------------------------------------------
    # Every public call takes its generation options by name: GenerationOptions' fields (budget, method, tau,
    # demand, max_new_tokens, temperature, top_p, seed, ignore_eos, max_images) and the family's request options
    # as keyword arguments, or a GenerationOptions as ``options=`` (keywords given beside it replace its fields).
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
        request = self.chat_request(messages, options=options, **kwargs)
        return TextStream(self._checked(self._generate(request)))

    def chat_request(self, messages, *, options: GenerationOptions | None = None, **kwargs) -> Request:
        """chat's arguments -> a validated Request. OptionError / PromptError (one line) for a bad option or a
        malformed message (naming messages[i].content[j]); more than max_images images is a PromptError."""
        opts = GenerationOptions.of(options, **kwargs)
        limit = self.manifest.defaults.get("max_images", DEFAULT_MAX_IMAGES) if opts.max_images is None \
            else opts.max_images
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:  # a manifest's own default
            raise OptionError(f"max_images must be an integer >= 0, got {limit!r}", param="max_images")
        resolved = self._check_options(opts)
        conversation = normalize(messages, limit)
        text = "".join(p["text"] for m in conversation.messages for p in m["content"] if p["type"] == "text")
        if not self.encoder.fits(text, self.max_positions):  # known from its length, before tokenizing
            raise PromptError(f"messages hold {len(text)} characters of text, more than fit the context of "
                              f"{self.max_positions} tokens", code="context_length_exceeded")
        self._admit_videos(conversation.images, resolved)
        return self._request(conversation, opts)

    def _admit_videos(self, inputs, options: dict) -> None:
        """Refuse, from each video file's header alone (FamilyRuntime.video_cost: no frame decoded), a video whose
        decoded frames exceed max_video_pixels (VideoError video_too_large) or whose visual tokens alone exceed
        the context (PromptError context_length_exceeded): both known before the decode and vision work."""
        tokens = 0
        for video in (v for v in inputs if isinstance(v, VideoInput)):
            try:
                cost = self.family_runtime.video_cost(video, options)
            except CoverPrunerError:
                raise
            except ValueError as exc:
                raise ImageError(str(exc).splitlines()[0]) from None
            if cost is None:
                continue
            if self.max_video_pixels is not None and cost.decoded_pixels > self.max_video_pixels:
                raise VideoError(f"{video.where}: {cost.frames} sampled frames of {cost.width}x{cost.height} are "
                                 f"{cost.decoded_pixels} pixels; at most {self.max_video_pixels} per video "
                                 "(max_video_pixels; lower fps or max_frames)", code="video_too_large",
                                 param=video.where)
            tokens += cost.visual_tokens
            if tokens > self.max_positions:
                raise PromptError(f"{video.where}: {cost.frames} frames of {cost.width}x{cost.height} give "
                                  f"{cost.visual_tokens} visual tokens; the videos hold {tokens}, more than fit the "
                                  f"context of {self.max_positions} tokens", code="context_length_exceeded",
                                  param=video.where)

    def generate(self, image, prompt: str, *, options: GenerationOptions | None = None,
                 **kwargs) -> GenerationResult:
        """Answer ``prompt`` about ``image`` (path, PIL image or uint8 array). Options: GenerationOptions by
        keyword or ``options=`` (budget: int, "full" or None; ignore_eos: keep decoding past EOS up to
        max_new_tokens, for fixed-length benchmark runs; the family's request options (``family_options()``,
        e.g. newline_policy="keep" for LLaVA-NeXT) by their names, unset ones taking the engine dir's defaults).
        """
        stream = self.stream(image, prompt, options=options, **kwargs)
        for _ in stream:
            pass
        return stream.result

    def stream(self, image, prompt: str, *, options: GenerationOptions | None = None, **kwargs) -> TextStream:
        """Like generate, but iterating yields text pieces as they decode; ``.result`` at the end.

        Options are validated here, before any work, so bad options fail at the call.
        """
        request = self.request(image, prompt, options=options, **kwargs)
        return TextStream(self._checked(self._generate(request)))

    def request(self, image, prompt: str, *, options: GenerationOptions | None = None, **kwargs) -> Request:
        """generate's arguments -> a validated Request (the input of the stages below): the conversation of one
        user message [image, prompt]. OptionError / PromptError (one line) for a bad option, an empty prompt or
        a prompt that cannot fit the context (known from its length, before tokenizing); the image and the
        tokenized prompt are checked by native_sequence."""
        opts = GenerationOptions.of(options, **kwargs)
        self._check_options(opts)
        if not isinstance(prompt, str):
            raise PromptError(f"prompt must be a string, got {type(prompt).__name__}", param="prompt")
        if not prompt.strip():
            raise PromptError("prompt is empty", param="prompt")
        if not self.encoder.fits(prompt, self.max_positions):
            raise PromptError(f"prompt is {len(prompt)} characters, more than fit the context of "
                              f"{self.max_positions} tokens", code="context_length_exceeded", param="prompt")
        return self._request(normalize(one_turn(image, prompt)), opts)

    def _check_options(self, opts: GenerationOptions) -> dict:
        """What of the options the engine dir and the method decide, before any other work: the family's request
        options resolved, and the selection method's own options (its registry declaration: dart's pivots,
        cdpruner's relevance_weight), which ride among the keyword options -> {name: value} of both."""
        family, given = split_method_options(opts.family)
        return {**self.resolve_options(family), **check_method_options(opts.method, given)}

    def _request(self, conversation, opts: GenerationOptions) -> Request:
        """The Request of a normalised conversation under checked options (the manifest's tau default, the
        family's options resolved, EOS ids unless ignore_eos)."""
        tau = check_tau(self.manifest.defaults.get("tau", 0.3)) if opts.tau is None else opts.tau
        return Request(conversation, opts.budget, opts.method, tau, opts.max_new_tokens,
                       self._sampling(opts),
                       frozenset() if opts.ignore_eos else frozenset(self.eos_ids),
                       self._check_options(opts), opts.demand, self.grammars.compile(opts.response_format))

    def _sampling(self, opts: GenerationOptions) -> SamplingConfig:
        """The request's SamplingConfig; OptionError (param logit_bias) for a token id past the vocabulary."""
        past = [t for t in opts.logit_bias if t >= self.vocab_size]
        if past:
            raise OptionError(f"logit_bias token id {past[0]} is past the vocabulary (ids 0..{self.vocab_size - 1})",
                              param="logit_bias")
        return SamplingConfig(opts.temperature, opts.top_p, opts.seed, opts.frequency_penalty, opts.presence_penalty,
                              opts.logit_bias)

    def _verified(self) -> None:
        """Wait for the background file check (first request only); ManifestError if a file changed."""
        if self._integrity is not None:
            self._integrity.result()
            self._integrity = None

    def check_files(self) -> None:
        """Wait for the background file check (first request only); ManifestError if a file changed. The engine
        loop calls it after each prefill, so no answer leaves before the check has passed."""
        self._verified()

    def _checked(self, gen):
        """Run ``gen``; when a graph fails unexpectedly, a changed file (if any) is the error reported."""
        try:
            return (yield from gen)
        except CoverPrunerError:
            raise
        except Exception:
            self._verified()
            raise

    def family_options(self) -> dict:
        """The family's request options and their values when a request names none: {name: default}."""
        return self.resolve_options({})

    def resolve_options(self, given: dict) -> dict:
        """Family request options: given values (validated) over the manifest's defaults over the family's.
        OptionError (one line) for an option the family does not have or a value it does not allow."""
        unknown = sorted(set(given) - set(self._options))
        if unknown:
            raise OptionError(f"unknown option(s) {unknown} for model family {self.manifest.family!r}; it takes "
                              f"{sorted(self._options) or 'none'}", param=unknown[0])
        resolved = {}
        for name, opt in self._options.items():
            value = given.get(name)
            if value is None:
                value = self.manifest.options.get(name, opt.default)
            try:
                resolved[name] = opt.validate(value)
            except ValueError as exc:
                raise OptionError(str(exc).splitlines()[0], param=name) from None
        return resolved

    def _prepare(self, image, options: dict):
        """The family's steps before the graphs: vision inputs of an image or a video (coverpruner.video.VideoInput);
        ImageError / VideoError / PromptError on bad input (a family without video refuses it in one line)."""
        try:
            if isinstance(image, VideoInput):
                return self.family_runtime.prepare_video(image, options)
            return self.family_runtime.prepare_image(image, options)
        except CoverPrunerError:
            raise
        except ValueError as exc:
            raise ImageError(str(exc).splitlines()[0]) from None

    def _image_span(self, outputs: dict, vision, options: dict):
        try:
            return self.family_runtime.image_span(outputs, vision, options)
        except ValueError as exc:  # the graph's outputs disagree with the manifest
            raise ManifestError(f"{self.manifest.root / 'manifest.json'}: {str(exc).splitlines()[0]}") from None

    # -- one request, stage by stage (runtime/stages.py holds what they pass on) --------------
    def native_sequence(self, request: Request) -> NativeSequence:
        """Images -> family preprocessing -> vision (cached by feed hash) -> image spans -> conversation layout
        (after the images: S_j is per request) -> embeds [L,d] (text ids embedded, each image's rows at its span)
        -> native positions [R,L]. Timings: preprocess (images, chat template, tokenization), vision, embed.
        PromptError / ImageError (one line) on bad input."""
        t = time.perf_counter()
        conversation = request.conversation
        cache = self.prefix_cache
        visions = [self._prepare(image, request.options) for image in conversation.images]
        hashes = [feeds_hash(v.feeds) if cache.enabled else b"" for v in visions]
        times = {"preprocess": time.perf_counter() - t, "vision": 0.0}
        spans = []
        for vision, digest in zip(visions, hashes):
            t = time.perf_counter()
            outputs = cache.get_vision(digest) if cache.enabled else None
            if outputs is None:
                outputs = self.vision_of(vision)
                cache.put_vision(digest, outputs)
            spans.append(self._image_span(outputs, vision, request.options))
            times["vision"] += time.perf_counter() - t

        t = time.perf_counter()
        layout = self.encoder.encode_conversation(conversation.messages, [len(span.rows) for span in spans],
                                                  [v.facts for v in visions])
        L = len(layout.input_ids)
        if L >= self.max_positions:
            rows = sum(len(span.rows) for span in spans)
            raise PromptError(f"prompt is {L} tokens including {rows} image tokens; the context allows "
                              f"{self.max_positions - 1} before the first answer token",
                              code="context_length_exceeded")
        positions = np.asarray(self.family_runtime.native_positions(layout, visions), dtype=np.int64)  # [R,L]
        times["preprocess"] += time.perf_counter() - t

        t = time.perf_counter()
        d = int(self.manifest.dims["hidden_size"])
        is_text = np.ones(L, dtype=bool)
        is_text[layout.visual_positions] = False
        embeds = np.empty((L, d), dtype=self.float_dtype)
        embeds[is_text] = self.embed(layout.input_ids[is_text])
        for span, where in zip(spans, layout.image_spans):
            embeds[where] = span.rows
        extras = self._native_extras(spans, layout, L, d)
        if extras and cache.enabled:  # a cached KV prefix holds the extras' effect: they are part of its identity
            hashes = [_with_extras(h, span) for h, span in zip(hashes, spans)]
        times["embed"] = time.perf_counter() - t
        return NativeSequence(visions, spans, layout, embeds, positions, times, hashes, extras)

    def _native_extras(self, spans: list, layout, length: int, d: int) -> dict[str, np.ndarray]:
        """The decoder extras (contract v4, graphs.decoder.extras) over the native sequence: {name: float [L, d]},
        each image's ImageSpan.extras[name] at its span's rows, zeros at the text rows; {} without extras.
        ManifestError (one line) when an image span lacks a declared extra or brings an undeclared one."""
        names = graph_spec(self.manifest, "decoder").extra_names
        out = {name: np.zeros((length, d), dtype=self.float_dtype) for name in names}
        for j, (span, where) in enumerate(zip(spans, layout.image_spans)):
            if set(span.extras) != set(names):
                raise ManifestError(f"{self.manifest.root / 'manifest.json'}: graphs.decoder.extras names "
                                    f"{list(names)}; the family's image span {j} brings {sorted(span.extras)}")
            for name in names:
                rows = np.asarray(span.extras[name])
                if rows.shape != (len(where), d):
                    raise ManifestError(f"{self.manifest.root / 'manifest.json'}: decoder extra {name!r} of image "
                                        f"{j} is {list(rows.shape)}; its span has [{len(where)}, {d}] rows")
                out[name][where] = rows
        return out

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
                       self.selector_for(len(native.spans[j].candidates), request.method))).encode())
        return h.digest()

    def _select_one(self, request: Request, feats: np.ndarray, relevance) -> np.ndarray:
        """One image's selector: V [n,d], relevance float32 [n] or None (uniform) -> keep int64 [m] ascending."""
        n = len(feats)
        reads = uses_relevance(request.method)
        backend = self.selector_for(n, request.method)
        if backend == "onnx" and (relevance is not None or not reads):
            return self.select_onnx(feats, relevance, request.budget, request.tau, request.method,
                                    _method_kwargs(request))
        self._warn_fallback(request.method)
        if relevance is None and reads:
            relevance = np.ones(n, dtype=np.float32)  # no instruction text: constant demand = uniform weights
        # selectors ignore options they do not use (tau: coverpruner, seed: random)
        return np.asarray(_selector(request.method)(np.asarray(feats, np.float32), relevance=relevance,
                                                    budget=request.budget, tau=request.tau, seed=request.seed,
                                                    **_method_kwargs(request)), dtype=np.int64)

    def _peer_session(self, method: str, graph: str) -> bool:
        """Whether peer `method`'s selector graph has a session, opening it on first use. A graph the dir lacks or
        that will not open (e.g. no TensorRT engine built for it) does not fail the request: the method selects in
        numpy (same tokens up to float near-ties) and selector_fallbacks says why."""
        if graph in self.sessions:
            return True
        if self._peer_factory is None or graph not in self.manifest.graphs or method in self._failed_peers:
            return False
        try:
            self.sessions[graph] = self._peer_factory(graph, graph_spec(self.manifest, graph).path)
        except (RuntimeError, OSError, ValueError) as exc:
            self._failed_peers.add(method)
            self.selector_fallbacks[method] = (f"{self.manifest.root}: cannot open {graph} ("
                                               f"{str(exc).splitlines()[0]}); method {method!r} selects with its "
                                               "numpy selector")
            return False
        return True

    def _warn_fallback(self, method: str) -> None:
        """Say once per pipeline why `method`, which has a selector graph, selects in numpy here."""
        why = self.selector_fallbacks.pop(method, None)
        if why is not None:
            warnings.warn(why, RuntimeWarning, stacklevel=3)

    def _select_windowed(self, request: Request, span, relevance, window: int) -> np.ndarray:
        """A video's selection within temporal windows of ``window`` temporal patches (the request option
        video_window): coverpruner.selection.windowed.select_in_windows over window ids temporal // window ->
        keep int64 [m] ascending."""
        from coverpruner.selection.windowed import select_in_windows  # the windowed selection (selection layer)

        feats = np.asarray(span.features, np.float32)
        if relevance is None and uses_relevance(request.method):
            relevance = np.ones(len(feats), dtype=np.float32)
        windows = (np.asarray(span.temporal, dtype=np.int64) // int(window)).astype(np.int64)
        return np.asarray(select_in_windows(_selector(request.method), feats, relevance, request.budget, windows,
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
        cache = self.prefix_cache
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
                r = self.relevance(native.embeds, native.positions, np.concatenate(cols), instr)
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

    def row_identities(self, native: NativeSequence, selection: Selection, rows: np.ndarray,
                       positions: np.ndarray) -> np.ndarray:
        """int64 [L', 2+R]: the pruned rows' identities (runtime.prefix_cache.row_identity)."""
        image_rows = {}
        for span, digest, sel in zip(native.layout.image_spans, native.image_hashes, selection.images):
            h = hash63(digest)
            for r in sel.kept_rows.tolist():
                image_rows[int(span[r])] = (h, r)
        return row_identity(native.layout.input_ids, rows, positions, image_rows)

    def prefill(self, request: Request, native: NativeSequence, selection: Selection) -> Prefill:
        """Pruned sequence (all text tokens + every image's kept rows, native order) [L',d] at the family's pruned
        positions [R,L'] -> decoder (cache reset to L' + the tokens the request may generate; the longest prefix
        an earlier request left in the prefix cache restored, at most L' - 1 rows) -> first logits.
        The engine loop's plan_prefill + feed_prefill for this one request on the pipeline's own decoder.
        Timing: prefill (the caller adds choosing the first token)."""
        t = time.perf_counter()
        plan = plan_prefill(self, request, native, selection)
        slots = Engine.for_pipeline(self).slots
        (_, logits), = feed_prefill(self, slots, [plan], [native])  # LoopSlots: the last row's logits
        return Prefill(plan.rows, logits, plan.state, {"prefill": time.perf_counter() - t}, plan.cached,
                       plan.identity)

    def pruned_sequence(self, request: Request, native: NativeSequence,
                        selection: Selection) -> tuple[np.ndarray, np.ndarray, DecodeState]:
        """The rows the decoder sees, int64 [L'] ascending native indices, their positions int64 [R,L'] and the
        DecodeState (how many tokens fit before the context ends). Shared by prefill and batched decoding."""
        fam = self.family_runtime
        kept = [where[sel.kept_rows] for where, sel in zip(native.layout.image_spans, selection.images)]
        rows = np.sort(np.concatenate([np.flatnonzero(native.is_text), *kept])).astype(np.int64)
        positions = np.asarray(fam.pruned_positions(native.positions, rows), dtype=np.int64)  # [R,L']
        first = int(np.max(fam.decode_position(native.positions, positions, 0)))
        steps = min(request.max_new_tokens, self.max_positions - first)
        state = DecodeState(native.positions, positions, steps,
                            "length" if steps == request.max_new_tokens else "context")
        return rows, positions, state

    def decode(self, state: DecodeState, token: int) -> np.ndarray:
        """One decode step: feed ``token`` (generated token number state.step) at the family's decode position,
        advance state.step -> logits float [V] of the next token (valid until the next decoder call).
        The engine loop's feed_decode for one request on the pipeline's own decoder."""
        item = token_row(self, 0, state, self.embed(np.array([token], dtype=np.int64))[0])
        return feed_decode(self, Engine.for_pipeline(self).slots, [item])[0]

    def _generate(self, request: Request):
        """The engine loop (runtime/engine.py) with this one request on the pipeline's own decoder: native_sequence
        -> select -> prefill -> decode until a stop rule; yields text pieces and returns the GenerationResult."""
        return (yield from Engine.for_pipeline(self).run(request))

    @staticmethod
    def result(request: Request, native: NativeSequence, selection: Selection, text: str, tokens: list[int],
               times: dict, prefill_tokens: int, finish: str, cached: int = 0) -> GenerationResult:
        """The GenerationResult of a finished request (shared by generate/stream and batched decoding)."""
        images = [ImageResult(len(span.candidates), sel.keep, sel.relevance, vision.panels,
                              vision.facts.get("kind", "image"), _video_facts(vision.facts))
                  for span, sel, vision in zip(native.spans, selection.images, native.visions)]
        return GenerationResult(
            text=text, token_ids=tokens, timings=times, prompt_tokens=native.length, prefill_tokens=prefill_tokens,
            budget=request.budget, method=request.method, finish_reason=finish, options=request.options,
            images=images, cached_tokens=cached, demand=request.demand)
