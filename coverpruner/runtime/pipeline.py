"""Pipeline: an exported engine dir answering image + question with pruned visual tokens.

One request (batch 1; n candidates, S image-span rows, hidden size d, native length L, position rank R).
Everything family-specific is asked of the family runtime (coverpruner.families.contract.FamilyRuntime):

    image -> family.prepare_image -> vision feeds -> vision -> family.image_span -> rows [S,d], candidates [n]
    prompt -> family.layout(S) -> ids [L], visual positions [S], instruction positions [T]
    embed (text ids only) + image rows -> native sequence [L,d]; family.native_positions -> [R,L]
    probe at the candidates' positions -> relevance r [n]           (only for methods that use it)
    (V = rows[candidates], r, budget, tau) -> selector -> keep [m] ascending
    text + kept rows (+ the family's always-kept rows) in native order [L',d], family.pruned_positions
    -> decoder prefill -> logits -> sample -> decode loop at family.decode_position(t)

The request loop is four named stages, each callable alone (gpt-fast's prefill / decode_one_token in spirit):
``request`` (validated options) -> ``native_sequence`` -> ``select`` -> ``prefill`` -> ``decode`` (one token);
``generate`` / ``stream`` compose them. runtime/stages.py types what each stage hands to the next.

This module never imports torch or transformers' modeling code.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import numpy as np

from coverpruner.engine_dir import REQUIRED_GRAPHS, Manifest, graph_spec, load_manifest, position_ids_input
from coverpruner.engines.interfaces import SessionFactory
from coverpruner.engines.ort import PROVIDERS, OrtSessionFactory, ProviderError, device_type
from coverpruner.engines.ort_decoder import OrtDecoderSession
from coverpruner.families import get_family
from coverpruner.runtime.errors import CoverPrunerError, ImageError, ManifestError, OptionError, PromptError
from coverpruner.runtime.result import TIMING_KEYS, GenerationResult
from coverpruner.runtime.sampling import Sampler, SamplingConfig
from coverpruner.runtime.stages import DecodeState, NativeSequence, Prefill, Request, Selection
from coverpruner.runtime.text import PromptEncoder, StreamDecoder
from coverpruner.selection import SELECTORS, get_selector  # numpy path; torch only for torch tensors

#: Selection methods the runtime offers: the names coverpruner.selection registers.
METHODS = tuple(SELECTORS)
#: Methods that read the layer-0 demand; the probe graph runs only for these.
_USES_RELEVANCE = {"coverpruner", "attention"}


def parse_budget(budget) -> int | None:
    """None / "full" -> None (no pruning); a positive int (or its string) -> int; else OptionError."""
    if budget is None or (isinstance(budget, str) and budget.strip().lower() == "full"):
        return None
    try:
        value = int(budget)
    except (TypeError, ValueError):
        raise OptionError(f"budget must be a positive integer or 'full', got {budget!r}") from None
    if value < 1 or (isinstance(budget, float) and budget != value):
        raise OptionError(f"budget must be a positive integer or 'full', got {budget!r}")
    return value


def _selector(method: str):
    if method not in METHODS:
        raise OptionError(f"unknown method {method!r}; expected one of {list(METHODS)}")
    return get_selector(method)


class TextStream:
    """Iterator over decoded text pieces; ``result`` holds the GenerationResult once exhausted."""

    def __init__(self, gen: Iterator):
        self._gen = gen
        self.result: GenerationResult | None = None

    def __iter__(self):
        self.result = yield from self._gen


#: selector="auto" runs the dir's loop-form selector.onnx at every n: its lazy greedy step re-sums only the
#: highest gain bounds (export/selector_graph.py), so it keeps up with the numpy greedy at video sizes
#: (benchmarks/results/selector_cpu_*.json); before, it re-summed every gain every step and auto fell back to numpy
#: above 1,536 candidates.
SELECTOR_BACKENDS = ("auto", "onnx", "numpy")


class Pipeline:
    """Loaded engine dir: sessions for vision, embed, probe and decoder, tokenizer and settings.

    One request at a time: the decoder's KV-cache buffers belong to the instance (use one Pipeline
    per thread). Timings are wall-clock seconds; when streaming, ``decode`` also contains the time
    the consumer spends between pieces.
    """

    def __init__(self, manifest: Manifest, sessions: dict, provider: str = "cpu", selector: str = "auto"):
        self.manifest = manifest
        self.provider = provider
        #: how the coverpruner method selects: "auto" (the loop-form selector.onnx), "onnx" or "numpy"; "numpy"
        #: whenever no selector.onnx session was opened
        self.selector_backend = selector if "selector" in sessions else "numpy"
        d, t = manifest.dims, manifest.token_ids
        #: upper bound on the candidates of one image (n itself is per request: GenerationResult.num_visual_tokens)
        self.max_visual_tokens = manifest.max_visual_tokens
        self.max_positions = int(d["max_position_embeddings"])
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
        self.sessions = sessions
        self.vision_outputs = [o.name for o in graph_spec(manifest, "vision").outputs]
        dims = (int(d["num_layers"]), int(d["num_kv_heads"]), int(d["head_dim"]), int(d["vocab_size"]))
        # a session that brings its own KV-cache loop (native TensorRT engines keep the cache on the GPU)
        # provides decoder_loop(); ORT sessions use the IO-binding loop
        own_loop = getattr(sessions["decoder"], "decoder_loop", None)
        self.decoder = (own_loop(*dims, self.float_dtype) if own_loop is not None
                        else OrtDecoderSession(sessions["decoder"], *dims, self.float_dtype, device_type(provider)))

    @property
    def num_visual_tokens(self) -> int:
        """Upper bound on the candidates of one image (kept for callers written before n became per request;
        equal to n for LLaVA-1.5). A request's own n is GenerationResult.num_visual_tokens."""
        return self.max_visual_tokens

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def load(cls, path, provider: str = "cpu", threads: int | None = None,
             session_factory: SessionFactory | None = None, verify: bool = True,
             selector: str = "auto") -> "Pipeline":
        """Open ``path`` (an engine dir). provider: 'cpu', 'cuda' or 'tensorrt'. 'tensorrt' runs the native
        engines that `coverpruner-build` recorded in the manifest when there are any (refused with a clear
        message when they were built for another TensorRT version or GPU), else ORT's TensorRT EP.

        selector: how the coverpruner method runs. 'onnx': the dir's selector.onnx on the provider (same
        indices as coverpruner.selection up to float near-ties); 'numpy': coverpruner.selection; 'auto'
        (default): 'onnx' when the dir has a standard-op (loop) selector.onnx, else 'numpy'
        (`selector_for(n)` says which). On CPU the ONNX path keeps the prefill fast: numpy's OpenBLAS threads keep spinning for tens of milliseconds
        after the similarity GEMM and take the cores from the decoder prefill that follows (measured ~10% of
        a pruned prefill on 2 cores); ORT runs the selector on its own non-spinning pool. Baselines stay numpy.

        session_factory(name, path) -> session replaces the ORT factory (engines.interfaces.SessionFactory, e.g.
        engines.trt_session.TrtSessionFactory); a session with decoder_loop() brings its own DecoderLoop.
        Raises ManifestError / ProviderError with one-line messages on bad input.
        """
        if provider not in PROVIDERS:
            raise OptionError(f"unknown provider {provider!r}; expected one of {list(PROVIDERS)}")
        if selector not in SELECTOR_BACKENDS:
            raise OptionError(f"unknown selector backend {selector!r}; expected one of {list(SELECTOR_BACKENDS)}")
        manifest = load_manifest(Path(path), verify=verify)
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
                raise ManifestError(str(exc).splitlines()[0]) from None
        return cls(manifest, sessions, provider, selector)

    def selector_for(self, n: int) -> str:
        """The selector that runs the coverpruner method for an image of n candidates: "onnx" or "numpy"
        (auto: the loop-form selector.onnx at every n)."""
        return "onnx" if self.selector_backend == "auto" else self.selector_backend

    # -- stages -----------------------------------------------------------------------------
    def vision(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The vision graph on the family's feeds -> its outputs by name (batch axis included)."""
        return dict(zip(self.vision_outputs, self.sessions["vision"].run(self.vision_outputs, feeds)))

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

    def select_onnx(self, feats: np.ndarray, relevance: np.ndarray, budget: int, tau: float) -> np.ndarray:
        """selector.onnx: V [n,d], relevance float32 [n] -> keep int64 [m] ascending."""
        feeds = {"image_features": feats, "relevance": relevance.astype(np.float32),
                 "budget": np.array(budget, dtype=np.int64), "tau": np.array(tau, dtype=np.float32)}
        return self.sessions["selector"].run(["keep"], feeds)[0].astype(np.int64)

    # -- generation -------------------------------------------------------------------------
    def generate(self, image, prompt: str, budget=64, method: str = "coverpruner", tau: float | None = None,
                 max_new_tokens: int = 128, temperature: float = 0.0, top_p: float = 1.0,
                 seed: int | None = None, ignore_eos: bool = False, **options) -> GenerationResult:
        """Answer ``prompt`` about ``image`` (path, PIL image or uint8 array). budget: int, "full" or None.

        ignore_eos: keep decoding past EOS up to max_new_tokens (fixed-length runs for benchmarks).
        options: the family's request options (``family_options()``, e.g. newline_policy="keep" for
        LLaVA-NeXT); unset ones take the engine dir's defaults.
        """
        stream = self.stream(image, prompt, budget, method, tau, max_new_tokens, temperature, top_p, seed,
                             ignore_eos, **options)
        for _ in stream:
            pass
        return stream.result

    def stream(self, image, prompt: str, budget=64, method: str = "coverpruner", tau: float | None = None,
               max_new_tokens: int = 128, temperature: float = 0.0, top_p: float = 1.0,
               seed: int | None = None, ignore_eos: bool = False, **options) -> TextStream:
        """Like generate, but iterating yields text pieces as they decode; ``.result`` at the end.

        Options are validated here, before any work, so bad options fail at the call.
        """
        request = self.request(image, prompt, budget, method, tau, max_new_tokens, temperature, top_p, seed,
                               ignore_eos, **options)
        return TextStream(self._generate(request))

    def request(self, image, prompt: str, budget=64, method: str = "coverpruner", tau: float | None = None,
                max_new_tokens: int = 128, temperature: float = 0.0, top_p: float = 1.0,
                seed: int | None = None, ignore_eos: bool = False, **options) -> Request:
        """generate's arguments -> a validated Request (the input of the stages below). OptionError (one
        line) for a bad option; the image and the prompt are checked by native_sequence."""
        budget_n = parse_budget(budget)
        if budget_n is not None:
            _selector(method)  # an unknown method fails here, not halfway through the request
        tau = float(self.manifest.defaults.get("tau", 0.3) if tau is None else tau)
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise OptionError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        sampling = SamplingConfig(temperature, top_p, seed)
        stop_ids = frozenset() if ignore_eos else frozenset(self.eos_ids)
        return Request(image, prompt, budget_n, method, tau, max_new_tokens, sampling, stop_ids,
                       self.resolve_options(options))

    def family_options(self) -> dict:
        """The family's request options and their values when a request names none: {name: default}."""
        return self.resolve_options({})

    def resolve_options(self, given: dict) -> dict:
        """Family request options: given values (validated) over the manifest's defaults over the family's.
        OptionError (one line) for an option the family does not have or a value it does not allow."""
        unknown = sorted(set(given) - set(self._options))
        if unknown:
            raise OptionError(f"unknown option(s) {unknown} for model family {self.manifest.family!r}; it takes "
                              f"{sorted(self._options) or 'none'}")
        resolved = {}
        for name, opt in self._options.items():
            value = given.get(name)
            if value is None:
                value = self.manifest.options.get(name, opt.default)
            try:
                resolved[name] = opt.validate(value)
            except ValueError as exc:
                raise OptionError(str(exc).splitlines()[0]) from None
        return resolved

    def _prepare(self, image, options: dict):
        """The family's steps before the graphs: vision inputs; ImageError / PromptError on bad input."""
        try:
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
        """Image -> family preprocessing -> vision -> image span -> layout (after the image: S is per request)
        -> embeds [L,d] (text ids embedded, image rows in place) -> native positions [R,L].
        Timings: preprocess (image, chat template, tokenization), vision, embed. PromptError / ImageError
        (one line) on bad input."""
        t = time.perf_counter()
        if not isinstance(request.prompt, str) or not request.prompt.strip():
            raise PromptError("prompt is empty")
        vision = self._prepare(request.image, request.options)
        times = {"preprocess": time.perf_counter() - t}
        t = time.perf_counter()
        span = self._image_span(self.vision(vision.feeds), vision, request.options)
        times["vision"] = time.perf_counter() - t

        t = time.perf_counter()
        num_rows = len(span.rows)
        layout = self.encoder.encode(request.prompt, num_rows)
        L = len(layout.input_ids)
        if L >= self.max_positions:
            raise PromptError(f"prompt is {L} tokens including {num_rows} image tokens; the context allows "
                              f"{self.max_positions - 1} before the first answer token")
        positions = np.asarray(self.family_runtime.native_positions(layout, vision), dtype=np.int64)  # [R,L]
        times["preprocess"] += time.perf_counter() - t

        t = time.perf_counter()
        is_text = np.ones(L, dtype=bool)
        is_text[layout.visual_positions] = False
        embeds = np.empty((L, span.rows.shape[1]), dtype=self.float_dtype)
        embeds[is_text] = self.embed(layout.input_ids[is_text])
        embeds[layout.visual_positions] = span.rows
        times["embed"] = time.perf_counter() - t
        return NativeSequence(vision, span, layout, embeds, positions, times)

    def select(self, request: Request, native: NativeSequence) -> Selection:
        """Layer-0 demand from the probe (only for methods that read it) + the selector over V = rows[candidates]
        -> keep [m] ascending, m = min(budget, n). Budget "full" keeps everything and runs neither.
        Timings: probe, select (the stages that ran)."""
        span, n, times = native.span, native.num_candidates, {}
        if request.budget is None:
            return Selection(np.arange(n, dtype=np.int64), None, np.arange(len(span.rows), dtype=np.int64), times)
        t = time.perf_counter()
        relevance = None
        if request.method in _USES_RELEVANCE:
            relevance = self.relevance(native.embeds, native.positions, native.candidate_positions,
                                       native.layout.instruction_positions)
            times["probe"], t = time.perf_counter() - t, time.perf_counter()
        feats = span.features  # V [n,d]
        if request.method == "coverpruner" and self.selector_for(n) == "onnx":
            keep = self.select_onnx(feats, relevance, request.budget, request.tau)
        else:
            # selectors ignore options they do not use (tau: coverpruner, seed: random)
            # float32 V as the selectors expect it, without a copy when it already is (vision outputs are)
            keep = np.asarray(_selector(request.method)(np.asarray(feats, np.float32), relevance=relevance,
                                                        budget=request.budget, tau=request.tau, seed=request.seed),
                              dtype=np.int64)
        # the kept candidates and the family's always-kept rows (e.g. LLaVA-NeXT's newlines with "keep")
        kept_rows = np.union1d(span.candidates[keep], span.always_kept).astype(np.int64)
        times["select"] = time.perf_counter() - t
        return Selection(keep, relevance, kept_rows, times)

    def prefill(self, request: Request, native: NativeSequence, selection: Selection) -> Prefill:
        """Pruned sequence (all text tokens + the kept image rows, native order) [L',d] at the family's pruned
        positions [R,L'] -> decoder (cache reset to L' + the tokens the request may generate) -> first logits.
        Timing: prefill (the caller adds choosing the first token)."""
        t = time.perf_counter()
        fam = self.family_runtime
        rows = np.sort(np.concatenate([np.flatnonzero(native.is_text),
                                       native.layout.visual_positions[selection.kept_rows]]))
        positions = np.asarray(fam.pruned_positions(native.positions, rows), dtype=np.int64)  # [R,L']
        first = int(np.max(fam.decode_position(native.positions, positions, 0)))
        steps = min(request.max_new_tokens, self.max_positions - first)
        self.decoder.reset(len(rows) + steps)
        logits = self.decoder.forward(native.embeds[rows][None], position_ids_input(positions, fam.position_rank))
        state = DecodeState(native.positions, positions, steps,
                            "length" if steps == request.max_new_tokens else "context")
        return Prefill(rows, np.array(logits), state, {"prefill": time.perf_counter() - t})

    def decode(self, state: DecodeState, token: int) -> np.ndarray:
        """One decode step: feed ``token`` (generated token number state.step) at the family's decode position,
        advance state.step -> logits float [V] of the next token (valid until the next decoder call)."""
        fam = self.family_runtime
        emb = self.embed(np.array([token], dtype=np.int64))
        pos = np.asarray(fam.decode_position(state.native, state.pruned, state.step), dtype=np.int64)[:, None]
        logits = self.decoder.forward(emb[None], position_ids_input(pos, fam.position_rank))
        state.step += 1
        return logits

    def _generate(self, request: Request):
        """native_sequence -> select -> prefill -> decode until a stop id or the limit; yields text pieces and
        returns the GenerationResult."""
        t_start = time.perf_counter()
        native = self.native_sequence(request)
        selection = self.select(request, native)
        prefill = self.prefill(request, native, selection)
        t = time.perf_counter()
        sampler = Sampler(request.sampling)
        token = sampler(prefill.logits)
        times = dict.fromkeys(TIMING_KEYS, 0.0)
        for stage in (native, selection, prefill):
            times.update(stage.timings)
        times["prefill"] += time.perf_counter() - t  # the first token comes with the prefill
        t = time.perf_counter()

        state, stream, tokens = prefill.state, StreamDecoder(self.encoder), [token]
        finish = state.limit
        while True:
            if token in request.stop_ids:
                finish = "eos"
                break
            piece = stream.push(token)
            if piece:
                yield piece
            if len(tokens) >= state.max_tokens:
                break
            token = sampler(self.decode(state, token))
            tokens.append(token)
        piece = stream.flush()
        if piece:
            yield piece
        times["decode"] = time.perf_counter() - t
        times["total"] = time.perf_counter() - t_start
        return GenerationResult(
            text=stream.emitted, token_ids=tokens, kept_indices=selection.keep, relevance=selection.relevance,
            timings=times, num_visual_tokens=native.num_candidates, prompt_tokens=native.length,
            prefill_tokens=prefill.length, budget=request.budget, method=request.method, finish_reason=finish,
            panels=native.vision.panels, options=request.options)
