"""An engine dir loaded: its manifest, graph sessions, family run-time rules, tokenizer and decoder loop, and the
graph runs every stage shares (vision, embed, probe, the selector graphs). What turns requests into answers lives
elsewhere (runtime/inputs.py: the input stages; runtime/engine.py: the loop); ``Pipeline`` (runtime/pipeline.py)
is the facade over all of them.

Two thread pools share the cores: the decoder (and the embedding it reads back each step) on ``threads`` intra-op
threads, spinning between the back-to-back decode steps, and the admission graphs (vision, probe, selectors) on
``admission_threads``, not spinning: they run beside the decode steps (runtime/admission.py) and must not keep
cores busy between their own runs.

numpy + onnxruntime only (no torch, no transformers).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from coverpruner.engine_dir import (METHOD_GRAPHS, REQUIRED_GRAPHS, IntegrityCheck, Manifest, graph_spec,
                                    load_manifest, position_ids_input, verify_files)
from coverpruner.engines.interfaces import SessionFactory
from coverpruner.engines.ort import PROVIDERS, OrtSessionFactory, ProviderError, device_type, shrink_arena_options
from coverpruner.engines.ort_decoder import OrtDecoderSession
from coverpruner.engines.ort_form_decoder import OrtFormDecoderSession
from coverpruner.engines.state_buffers import dims_problem
from coverpruner.families import get_family
from coverpruner.runtime.errors import ManifestError, OptionError
from coverpruner.runtime.grammar import GrammarCompiler
from coverpruner.runtime.text import PromptEncoder
from coverpruner.selection.blocked import FLOAT64_MAX_N  # where auto runs numpy on CPU

#: selector="auto" runs the dir's loop-form selector.onnx, except on the CPU provider above
#: selection.blocked.FLOAT64_MAX_N candidates: there numpy's similarity is a float32 syrk (a symmetric rank-k
#: product, half the flops of the full GEMM ONNX Runtime runs), and the numpy backend is the faster one
#: (n = 2,880, d = 4,096, m = 320: docs/performance.md, benchmarks/bench_select_stage.py). The peers' graphs
#: (selector_dart / selector_cdpruner) run at every n: faster than their numpy selectors at every measured shape
#: (docs/performance.md, "The peers' selectors").
SELECTOR_BACKENDS = ("auto", "onnx", "numpy")
#: graphs the decode loop runs back to back (their ORT threads spin between runs); the others are admission graphs
DECODE_GRAPHS = ("embed", "decoder")


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


class _SplitFactory:
    """Sessions of the decode graphs from one factory, the admission graphs from another (their own thread pool)."""

    def __init__(self, decode: SessionFactory, admission: SessionFactory):
        self.decode, self.admission = decode, admission

    def __call__(self, graph: str, path: Path):
        return (self.decode if graph in DECODE_GRAPHS else self.admission)(graph, path)


def available_memory() -> int | None:
    """Bytes the kernel can hand out without swapping (Linux's MemAvailable); None where it does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def staging_memory_problem(manifest: Manifest) -> str | None:
    """One line when taking turns (admission_share) would not fit in memory: it opens a second session of the
    decoder graph (a second copy of its weights) beside the first, so the machine needs room for both copies
    (2.2x the decoder's files, before anything is loaded); None when it fits or the OS does not say."""
    spec = graph_spec(manifest, "decoder")
    need = sum(p.stat().st_size for p in (spec.path, *spec.data_files) if p.is_file())
    have = available_memory()
    if have is None or have >= 2.2 * need:
        return None
    return (f"{manifest.root}: admission_share needs a second copy of the decoder's weights ({need / 2**30:.1f} GiB, "
            f"room for both: {2.2 * need / 2**30:.1f} GiB) and {have / 2**30:.1f} GiB is available: admissions run "
            "side by side with the decode steps (admission_share 0)")


def _check_threads(name: str, value) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise OptionError(f"{name} must be a positive integer or None, got {value!r}", param=name)


class Model:
    """Loaded engine dir: sessions for vision, embed, probe and decoder (+ selectors), the family's run-time rules,
    the tokenizer and the decoder loop (engines.interfaces.DecoderLoop: one request's KV cache).

    Attributes the stages read: manifest, provider, sessions, family, family_runtime, encoder (PromptEncoder),
    grammars (GrammarCompiler), decoder, decoder_form ("standard" / "ort"), max_positions, max_visual_tokens,
    vocab_size, float_dtype, eos_ids, selector_backend, selector_fallbacks.
    """

    def __init__(self, manifest: Manifest, sessions: dict, provider: str = "cpu", selector: str = "auto"):
        self.manifest = manifest
        self.provider = provider
        #: the background re-check of the dir's files (engine_dir.IntegrityCheck) until it has passed
        self._integrity: IntegrityCheck | None = None
        #: how the coverpruner method selects: "auto" (see selector_for), "onnx" or "numpy"; "numpy" whenever no
        #: selector.onnx session was opened
        self.selector_backend = selector if "selector" in sessions else "numpy"
        #: {method: why it selects in numpy}: a peer method whose selector graph the dir lacks or that would not
        #: open; warned once, on the method's first selection (Model.load fills it)
        self.selector_fallbacks: dict[str, str] = {}
        #: opens the peers' selector graphs on first use (Model.load sets it; None: they select in numpy), so a
        #: load that never runs dart / cdpruner pays nothing for them
        self._peer_factory: SessionFactory | None = None
        self._failed_peers: set[str] = set()
        #: the share of the cores a threaded engine's admission gets while streams decode (Model.load; None: the
        #: two run side by side)
        self.admission_share: float | None = None
        self._staging_factory: SessionFactory | None = None  # the admission graphs' factory (admission_share)
        self._staging = None
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
        #: the decoder carries state that is not KV (contract v5, graphs.decoder.states): its prefix cache keeps
        #: whole snapshots at turn boundaries instead of KV blocks (runtime/prefix_cache.py, runtime/engine.py)
        self.decoder_states = bool(graph_spec(manifest, "decoder").states)
        if self.decoder_states and own_loop is not None and self.decoder_form != "ort":
            raise OptionError(f"{manifest.root}: the decoder carries state that is not KV (graphs.decoder.states); "
                              "the native TensorRT decoder loop does not carry it yet: use provider 'cpu' or 'cuda'")
        problem = dims_problem(sessions["decoder"].get_inputs(), *dims[:3])
        if problem is not None:
            raise ManifestError(f"{manifest.root / 'manifest.json'}: {problem}")
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

    @classmethod
    def load(cls, path, provider: str = "cpu", threads: int | None = None,
             session_factory: SessionFactory | None = None, verify: bool = True, selector: str = "auto",
             admission_threads: int | None = None, admission_share: float | None = None) -> "Model":
        """Open ``path`` (an engine dir); see Pipeline.load for the arguments. threads: intra-op threads of the
        decode graphs (embed, decoder); admission_threads: of the admission graphs (vision, probe, selectors;
        None: ``threads``); admission_share: on provider 'cpu', the share of the cores a threaded engine's admission
        gets while streams decode (runtime/admission.py, "Sharing the cores in turns"; its graphs' threads then
        start at the lowest priority; None or 0: side by side; turned off with a RuntimeWarning when the machine
        lacks the memory for a second copy of the decoder's weights: staging_memory_problem). ManifestError / ProviderError / OptionError with
        one-line messages on bad input."""
        if provider not in PROVIDERS:
            raise OptionError(f"unknown provider {provider!r}; expected one of {list(PROVIDERS)}", param="provider")
        if selector not in SELECTOR_BACKENDS:
            raise OptionError(f"unknown selector backend {selector!r}; expected one of {list(SELECTOR_BACKENDS)}",
                              param="selector")
        _check_threads("admission_threads", admission_threads)
        if admission_share is not None and (isinstance(admission_share, bool)
                                            or not isinstance(admission_share, (int, float))
                                            or not 0.0 <= admission_share < 1.0):
            raise OptionError(f"admission_share must be a number in [0, 1), got {admission_share!r}",
                              param="admission_share")
        share = float(admission_share or 0.0) if provider == "cpu" and session_factory is None else 0.0
        manifest = load_manifest(Path(path), verify=False)
        if share and (why := staging_memory_problem(manifest)) is not None:
            warnings.warn(why, RuntimeWarning, stacklevel=3)
            share = 0.0
        # files unchanged since their last sha256 check are re-hashed (xxh3, full contents) in the background
        # while the sessions load and the first request runs; answers wait for it (see check_files)
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
            factory = session_factory or _SplitFactory(
                OrtSessionFactory(provider, threads, manifest=manifest.raw, spin_stop=bool(share)),
                OrtSessionFactory(provider, admission_threads or threads, manifest=manifest.raw,
                                  low_priority=bool(share)))
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
        model = cls(manifest, sessions, provider, selector)
        if share:
            model.admission_share, model._staging_factory = share, factory.admission
        if requested != "numpy":
            model._peer_factory = factory
            model.selector_fallbacks = _missing_peer_graphs(manifest)
        model._integrity = integrity
        return model

    def staging_session(self):
        """A second session of the decoder graph, on the admission's threads at their priority, for a threaded
        engine's staging prefill (runtime/admission.py, "Sharing the cores in turns"); opened on first use, it holds
        a second copy of the decoder's weights. None without admission_share."""
        if self._staging is None and self._staging_factory is not None:
            self._staging = self._staging_factory("decoder_staging", graph_spec(self.manifest, "decoder").path)
        return self._staging

    def check_files(self) -> None:
        """Wait for the background file check (first request only); ManifestError if a file changed. The engine
        loop calls it after each prefill, so no answer leaves before the check has passed."""
        if self._integrity is not None:
            self._integrity.result()
            self._integrity = None

    # -- graph runs ---------------------------------------------------------------------------
    def vision(self, feeds: dict[str, np.ndarray], shrink: bool = False) -> dict[str, np.ndarray]:
        """The vision graph on the family's feeds -> its outputs by name (batch axis included). shrink: ONNX
        Runtime's arena gives its unused memory back after the run (ORT sessions only)."""
        session = self.sessions["vision"]
        options = shrink_arena_options(session, self.provider) if shrink else None
        if options is None:
            return dict(zip(self.vision_outputs, session.run(self.vision_outputs, feeds)))
        return dict(zip(self.vision_outputs, session.run(self.vision_outputs, feeds, options)))

    def vision_of(self, vision, check=None) -> dict[str, np.ndarray]:
        """The vision outputs of one prepared input (families.contract.VisionInputs): its ``chunks`` one run after
        the other, outputs concatenated along their first axis (a video: peak memory of one chunk; the arena
        shrunk after the last), else one run over its ``feeds``. check(): called between chunks (raises when the
        request was cancelled)."""
        if not vision.chunks:
            return self.vision(vision.feeds)
        last = len(vision.chunks) - 1
        parts = []
        for i, feeds in enumerate(vision.chunks):
            if check is not None and i:
                check()
            parts.append(self.vision(feeds, shrink=i == last))
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

    def warn_fallback(self, method: str) -> None:
        """Say once per model why `method`, which has a selector graph, selects in numpy here."""
        why = self.selector_fallbacks.pop(method, None)
        if why is not None:
            warnings.warn(why, RuntimeWarning, stacklevel=4)
