"""The OpenAI-compatible FastAPI app: POST /v1/chat/completions (and, through the same path, serving.endpoints'
/v1/completions and /v1/responses), GET /v1/models, /health, /metrics.

``create_app(config)`` loads ``config.workers`` pipelines and returns the app; the same app runs under
uvicorn (``coverpruner-serve``) and inside each Ray Serve replica (``serving.ray_app``). Answers equal
``Pipeline.chat`` with the same messages and options: each HTTP request becomes one GenerationOptions and one
runtime Request (built once, ``Pipeline.chat_request``), which a worker's engine loop answers; its text pieces are
passed on unchanged (stop strings are matched inside the loop).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.background import BackgroundTask, BackgroundTasks
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from coverpruner.engine_dir import Manifest, load_manifest
from coverpruner.integers import ascii_int
from coverpruner.runtime import Pipeline, grammar, tool_calls
from coverpruner.runtime.options import MAX_LOGIT_BIAS_ENTRIES, MAX_STOP_STRINGS
from coverpruner.runtime.errors import CoverPrunerError, OptionError
from coverpruner.serving.choices import Delta as ChoiceDelta
from coverpruner.serving.choices import End, TokenText, chat_logprobs, chat_logprobs_json, items
from coverpruner.runtime.messages import MAX_PARTS, check_part_count
from coverpruner.serving import json_body
from coverpruner.serving.errors import APIError, bad_request, from_pipeline_error
from coverpruner.serving.images import REMOTE_TIMEOUT_S
from coverpruner.serving.memory import map_large_blocks, release_freed_memory
from coverpruner.serving.metrics import ServerMetrics
from coverpruner.serving.request import GenerationRequest, build_request, pipeline_options
from coverpruner.serving.endpoints import MAX_PROMPTS
from coverpruner.serving.schema import BODY_NAMES
from coverpruner.serving.schema import (AssistantMessage, ChatCompletion, ChatCompletionChunk, ChatCompletionRequest,
                                        Choice, ChunkChoice, Delta, Usage)
from coverpruner.serving import tools
from coverpruner.serving.videos import MAX_VIDEO_BYTES, has_video_reader
from coverpruner.video import DEFAULT_MAX_VIDEO_PIXELS
from coverpruner.serving.workers import Job, QueueFull, WorkerPool

log = logging.getLogger("coverpruner.serving")

#: Pipeline finish reasons -> OpenAI's
_FINISH = {"eos": "stop", "stop": "stop", "grammar": "stop", "length": "length", "context": "length"}
#: How often a waiting request checks whether its client is still connected (seconds).
_DISCONNECT_POLL_S = 0.25
#: Largest request body (bytes): a 32 MiB image as base64 (42.7 MiB) plus room for the text. Checked from
#: Content-Length before reading, and while reading a body without one. A server whose model takes video raises it
#: to hold --max-video-bytes as base64 plus the same room for text (ServerState.max_body_bytes).
MAX_BODY_BYTES = 48 * 2 ** 20
_TEXT_ROOM_BYTES = 6 * 2 ** 20
#: A body declared (or found) above the limit is read and thrown away up to this many bytes before the 413 is
#: sent: a client that sends its whole body before reading the answer (Python's urllib, httpx) otherwise saw a
#: connection reset instead of the 413. Larger bodies are refused at once (the connection is then closed).
_DRAIN_LIMIT_BYTES = 256 * 2 ** 20
#: Default deadline of one request (seconds): far above a 7B answer of max_tokens on an Orin, far below "stuck".
REQUEST_TIMEOUT_S = 300.0
#: Default deadline for a request body to arrive whole (seconds): a body that never ends (chunked) or a
#: Content-Length above the bytes sent held a connection open for as long as the client liked.
BODY_TIMEOUT_S = 30.0
#: Images above this many pixels leave large freed blocks in the allocator; the worker returns them afterwards.
_LARGE_IMAGE_PIXELS = 4_000_000


@dataclass
class ServerConfig:
    """Everything a server process (or Ray replica) needs to build its pipelines and app."""

    engine_dir: str
    workers: int = 1
    provider: str = "cpu"
    threads: int | None = None  # ORT intra-op threads of each pipeline's decoder (None: cores // workers)
    #: ORT intra-op threads of each pipeline's vision, probe and selector graphs (None: threads)
    admission_threads: int | None = None
    #: provider cpu, max_batch > 1: the share of the cores a new request's admission gets while streams decode, the
    #: two taking turns (runtime/admission.py; coverpruner-serve's default is DEFAULT_ADMISSION_SHARE); 0: side by
    #: side, the default of an app embedded in a process that may run other busy threads (the turns run the
    #: admission's threads at SCHED_IDLE, which wait for every other busy thread)
    admission_share: float = 0.0
    max_queue: int = 16
    model_name: str | None = None  # default: the engine dir's name
    allow_local_files: bool = False
    allow_remote_images: bool = False
    selector: str = "auto"
    budget: int | str | None = None  # default budget when a request has none (None: the manifest's)
    method: str | None = None  # default method when a request has none (None: the manifest's)
    #: requests one worker decodes together (continuous batching, ORT-form decoder); None: DEFAULT_MAX_BATCH for
    #: an ORT-form dir on the CPU provider, else 1 (one request per worker, any decoder form)
    max_batch: int | None = None
    #: KV tokens per request in a batch (None: min(the model's max positions, 4096)); the batch's cache is
    #: num_layers x 2 x [max_batch, H_kv, batch_context, head_dim] float32 per worker
    batch_context: int | None = None
    max_images: int | None = None  # most images per request (None: the manifest's defaults.max_images, else 8)
    prefix_cache_mb: float = 256  # per pipeline: pruned-prefix KV, vision outputs, selections (0: off)
    remote_timeout_s: float = REMOTE_TIMEOUT_S  # a whole remote image fetch (with --allow-remote-images)
    #: deadline of one chat completion from its arrival (queueing included); None: none. Past it: 504 (an error
    #: event when streaming) and the generation is cancelled after its current token
    request_timeout_s: float | None = REQUEST_TIMEOUT_S
    max_video_bytes: int = MAX_VIDEO_BYTES  # largest encoded video of a video_url part (video families only)
    #: most frames one video may give after sampling (the family option max_video_frames); None: the engine's
    #: default. A request may ask for fewer, never more (as max_images, the server's bound)
    max_video_frames: int | None = None
    #: most decoded pixels (sampled frames x height x width) of one video, from its header before decoding
    max_video_pixels: int = DEFAULT_MAX_VIDEO_PIXELS
    #: a request body must arrive whole within this many seconds of its headers (else 408, connection closed)
    body_timeout_s: float = BODY_TIMEOUT_S
    #: tokens one engine step may run (decodes + prefill chunks; runtime/scheduler.py); None: the engine's default
    max_step_tokens: int | None = None

    @property
    def served_name(self) -> str:
        return self.model_name or Path(self.engine_dir).resolve().name


#: --max-batch when none is given and the dir can batch (ORT-form decoder: provider cpu, or cuda for an fp16 export):
#: decode is memory-bound, so up to
#: 8 requests share each read of the weights (benchmarks/bench_serve.py)
DEFAULT_MAX_BATCH = 8


def resolve_max_batch(config: ServerConfig, manifest: Manifest) -> int:
    """The batch each worker decodes: config.max_batch, or the default above for a dir that can batch. A batch
    above 1 on a dir that cannot (standard-form decoder: TensorRT / CUDA) raises OptionError in one line (never a
    silent batch 1)."""
    if config.max_batch is None:
        return DEFAULT_MAX_BATCH if manifest.decoder_form == "ort" else 1
    if config.max_batch > 1 and manifest.decoder_form != "ort":
        raise OptionError(f"--max-batch {config.max_batch}: batched decoding needs the ORT-form decoder (provider "
                          f"cpu, or cuda with --dtype fp16 --decoder-form ort); {config.engine_dir} has the "
                          f"{manifest.decoder_form!r} form (its TensorRT / CUDA engines decode one request per "
                          "worker: use --max-batch 1 and --workers N)")
    return config.max_batch


class ServerState:
    """The pipelines, their worker pool and metrics of one server process."""

    def __init__(self, config: ServerConfig):
        self.config = config
        map_large_blocks()  # large images' memory goes back to the OS when freed (serving/memory.py)
        threads = config.threads or max(1, (os.cpu_count() or 1) // config.workers)
        # the batch first (the dir's decoder form says it): only a batch of slots takes turns with its admission
        # (runtime/engine.py), and a load with admission_share starts the admission's threads at the lowest priority
        self.max_batch = resolve_max_batch(config, load_manifest(Path(config.engine_dir), verify=False))
        share = config.admission_share if self.max_batch > 1 else 0.0
        self.pipelines = [Pipeline.load(config.engine_dir, provider=config.provider, threads=threads,
                                        selector=config.selector, prefix_cache_mb=config.prefix_cache_mb,
                                        admission_threads=config.admission_threads, admission_share=share)
                          for _ in range(config.workers)]
        for pipeline in self.pipelines:
            pipeline.max_video_pixels = config.max_video_pixels
        # llguidance's import, tokenizer bridge and threads now, not in the first structured request (the bridge is
        # per process and tokenizer: one call serves every worker)
        self.pipelines[0].grammars.warm()
        self.defaults = dict(self.pipelines[0].manifest.defaults)
        self.defaults.update({k: v for k, v in (("budget", config.budget), ("method", config.method)) if v is not None})
        self.model_name = config.served_name
        self.family = self.pipelines[0].manifest.family
        self.options = pipeline_options(self.pipelines[0])  # extra body fields: pipeline + family options
        self.takes_video = "max_video_frames" in self.options  # the family offers video options
        self.max_body_bytes = (max(MAX_BODY_BYTES, 4 * -(-config.max_video_bytes // 3) + _TEXT_ROOM_BYTES)
                               if self.takes_video else MAX_BODY_BYTES)
        self.created = int(time.time())
        # built here, in the caller's thread, so a dir that cannot batch fails at start-up in one line
        context = (config.batch_context or min(self.pipelines[0].max_positions, 4096)) if self.max_batch > 1 else None
        engines = [p.engine(self.max_batch, context, config.max_step_tokens, threaded=True) for p in self.pipelines]
        self.pool = WorkerPool(engines, config.max_queue, on_finish=self._finished)
        #: requests admitted at once (running + queued) before a 503
        self.capacity = config.workers * self.max_batch + config.max_queue
        self.metrics = ServerMetrics(self.pool)
        self.token_text = TokenText(self.pipelines[0].encoder.tokenizer)  # logprob entries' token strings

    def _finished(self, job: Job, outcome: str) -> None:
        if outcome == "cancelled" and not job.timed_out:  # a timeout was counted when it was answered
            self.metrics.requests.labels("cancelled").inc()

    def error(self, exc: APIError) -> JSONResponse:
        self.count_error(exc)
        return JSONResponse(exc.body(), status_code=exc.status)

    def count_error(self, exc: APIError) -> None:
        outcome = ("rejected" if exc.status == 503 else "timeout" if exc.status == 504 else
                   "client_error" if exc.status < 500 else "server_error")
        self.metrics.requests.labels(outcome).inc()
        self.metrics.errors.labels(exc.code or exc.type).inc()


def create_app(config: ServerConfig) -> FastAPI:
    """Load the pipelines of ``config`` and return the FastAPI app serving them."""
    state = ServerState(config)
    app = FastAPI(title="CoverPruner", description="OpenAI-compatible VLM server with visual-token pruning")
    app.state.server = state

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError):
        return state.error(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException):
        return state.error(APIError(exc.status_code, str(exc.detail), None,
                                    "not_found" if exc.status_code == 404 else None))

    @app.exception_handler(Exception)
    async def _internal_error(_: Request, exc: Exception):  # the server's own fault: still OpenAI's JSON, counted
        log.exception("internal error")
        msg = str(exc).splitlines()[0] if str(exc) else ""
        return state.error(APIError(500, f"internal error: {type(exc).__name__}: {msg}", None, "internal_error"))

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": state.model_name, "pid": os.getpid(), "workers": state.pool.workers,
                "running": state.pool.running, "queued": state.pool.queued, "inputs": _input_kinds(state)}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [_model_card(state)]}

    @app.get("/v1/models/{model}")
    async def model(model: str):
        if model != state.model_name:
            raise _unknown_model(model, state, param=None)
        return _model_card(state)

    @app.get("/metrics")
    async def metrics():
        body, content_type = state.metrics.render()
        return Response(body, media_type=content_type)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        arrived = time.monotonic()
        req = await _parse(request, state.max_body_bytes, config.body_timeout_s)
        return await serve(request, req, arrived)

    async def serve(request: Request, req: ChatCompletionRequest, arrived: float, render=None):
        """A validated chat request (also what /v1/completions and /v1/responses translate to) -> its answer;
        render: (complete, stream) formatters of another endpoint (default: chat completions')."""
        if req.model != state.model_name:
            raise _unknown_model(req.model, state)
        _check_n(req.n, state)

        def bound(options: dict) -> None:  # the server's own settings, before the options are built
            if config.max_images is not None:
                options["max_images"] = config.max_images
            _bound_video_frames(options, state)

        def check(messages: list, options) -> None:
            # the pipeline's checks of every option, message and the text's size, before any image is fetched
            try:
                state.pipelines[0].check_chat(messages, options=options)
            except CoverPrunerError as exc:
                raise _api_error_from(exc) from None

        def build(gen: GenerationRequest) -> None:  # the one runtime Request of this HTTP request
            try:
                gen.request = state.pipelines[0].chat_request(gen.messages, options=gen.options)
            except CoverPrunerError as exc:
                raise _api_error_from(exc) from None

        if req.response_format is not None and not req.tools:  # compiled (once per distinct schema) before the
            await _compile_grammar(state, req.response_format, "response_format")  # request is queued
        # the options and messages are checked (Pipeline.check_chat: tools, tool_choice and their grammar
        # included) before any image is fetched, and the one runtime Request is built after
        gen = await run_in_threadpool(build_request, req, state.defaults, config.allow_local_files,
                                      config.allow_remote_images, state.options, check, config.remote_timeout_s,
                                      state.family, config.max_video_bytes, state.takes_video, bound)
        await run_in_threadpool(build, gen)
        parts = [p for m in gen.messages if isinstance(m.get("content"), list) for p in m["content"]]
        pixels = sum(p["image"].width * p["image"].height for p in parts if p["type"] == "image")
        if pixels <= _LARGE_IMAGE_PIXELS and not any(p["type"] == "video" for p in parts):  # frames: large too
            return await _answer(state, request, gen, arrived, render)

        def release() -> None:  # in a worker thread: malloc_trim walks every arena
            gen.messages = gen.request = None
            release_freed_memory()

        try:
            response = await _answer(state, request, gen, arrived, render)
        except BaseException:
            await run_in_threadpool(release)
            raise
        if isinstance(response, StreamingResponse):  # after the stream's last event, not at its first
            tasks = BackgroundTasks()
            bg = response.background
            if bg is not None:
                tasks.add_task(bg.func, *bg.args, **bg.kwargs)
            tasks.add_task(release)
            response.background = tasks
        else:
            await run_in_threadpool(release)
        return response

    from coverpruner.serving.endpoints import add_endpoints  # /v1/completions, /v1/responses

    add_endpoints(app, state, serve, lambda request: _read_json(request, state.max_body_bytes, config.body_timeout_s),
                  SimpleNamespace(collect=collect, answers=answers, usage=_usage, finish_reason=finish_reason,
                                  coverpruner=_coverpruner, validate_chat=validate_chat,
                                  capacity=lambda: (state.capacity, state.capacity - state.pool.admitted),
                                  json_answer=json_answer))
    return app


async def _compile_grammar(state: ServerState, response_format: dict, param: str) -> None:
    """Compile the request's grammar in a worker thread (runtime.grammar: size limits first, then llguidance, which
    releases the GIL), 400 naming ``param`` if refused. The handler does not wait for a compile whose client has
    gone (abandon_on_cancel): the thread finishes its bounded work and the process-wide cache keeps the result."""
    try:
        await anyio.to_thread.run_sync(state.pipelines[0].grammars.compile, response_format, param,
                                       abandon_on_cancel=True)
    except CoverPrunerError as exc:
        raise from_pipeline_error(exc, BODY_NAMES) from None


def _check_n(n: int | None, state: ServerState) -> None:
    """n answers decode side by side in one worker's batch: at most --max-batch (1 for a standard-form dir)."""
    if n is not None and n > state.max_batch:
        raise bad_request(f"n is {n}; this server answers at most {state.max_batch} per request (its --max-batch: "
                          "the n answers share one prefill and decode side by side in one batch)", "n")


def _bound_video_frames(options: dict, state: ServerState) -> None:
    """Fill the request's max_video_frames with the server's bound (--max-video-frames, else the engine's default);
    a larger value in the body is a 400: decoded frames are the memory a client could otherwise ask for."""
    if not state.takes_video:
        return
    bound = state.config.max_video_frames or state.options["max_video_frames"]
    asked = options.get("max_video_frames")
    if isinstance(asked, str) and ascii_int(asked) is not None:  # the family's parser takes "64" as 64
        asked = ascii_int(asked)
    if asked is None:
        options["max_video_frames"] = bound
    elif isinstance(asked, int) and not isinstance(asked, bool) and asked > bound:  # malformed: the family says
        raise bad_request(f"max_video_frames {asked} is above this server's bound of {bound} frames per video "
                          "(--max-video-frames)", "max_video_frames", "too_many_frames")


def _timeout_error(state: ServerState) -> APIError:
    return APIError(504, f"request not answered within the server's deadline of "
                         f"{state.config.request_timeout_s:g} s (--request-timeout); generation cancelled", None,
                    "request_timeout", "timeout_error")


async def _answer(state: ServerState, request: Request, gen: GenerationRequest, arrived: float, render=None):
    """Queue the validated request on a worker and answer it (JSON or server-sent events); past the deadline
    (``arrived`` + request_timeout_s) the job expires: 504, or an error event once streaming. render: (complete,
    stream), the endpoint's formatters (default chat completions': _complete, _sse)."""
    complete, stream = render or (_complete, _sse)
    timeout = state.config.request_timeout_s
    left = None if timeout is None else arrived + timeout - time.monotonic()
    if left is not None and left <= 0:
        raise _timeout_error(state)
    loop = asyncio.get_running_loop()
    job = Job(gen.request, loop)
    try:
        state.pool.submit(job)
    except QueueFull as exc:
        raise APIError(503, f"server busy: {exc}; retry later", None, "queue_full") from None
    timer = None if left is None else loop.call_later(left, job.expire)
    watcher = asyncio.create_task(_watch_disconnect(job, request))
    streaming = False
    try:
        first = await job.events.get()
        if first[0] == "timeout":
            raise _timeout_error(state)
        if first[0] == "error":
            raise _api_error_from(first[1])
        if first[0] == "cancelled":
            return Response(status_code=499)  # nobody is listening
        meta = _Meta(f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), state.model_name)
        if gen.stream:  # from here StreamingResponse watches the connection and cancels _sse
            streaming = True
            # background: also runs when the client left before the body started (then _sse never ran)
            return StreamingResponse(stream(state, job, gen, first, meta, timer), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"}, background=BackgroundTask(job.cancel))
        return await complete(state, job, gen, first, meta)
    finally:
        watcher.cancel()
        if timer is not None and not streaming:  # a stream's timer runs until its last event (_sse)
            timer.cancel()
        if not streaming:  # no-op when finished; stops the worker if this handler was cancelled (Ray, shutdown)
            job.cancel()


# -- request parsing ------------------------------------------------------------------------------

async def _read_body(request: Request, limit: int = MAX_BODY_BYTES, timeout_s: float = BODY_TIMEOUT_S) -> bytearray:
    """The body, whole within ``timeout_s`` (else 408). Past ``limit`` bytes (declared by Content-Length or counted
    while reading) it is 413: read to its end and thrown away up to _DRAIN_LIMIT_BYTES first, so that a client still
    sending gets the 413 rather than a reset; above that at once."""
    too_large = APIError(413, f"request body exceeds {limit} bytes", None, "request_too_large")
    length = request.headers.get("content-length")
    if length is not None:
        length = ascii_int(length)
        if length is None or length > _DRAIN_LIMIT_BYTES:
            raise too_large
    over = length is not None and length > limit
    deadline = asyncio.get_running_loop().time() + timeout_s
    body, size = bytearray(), 0  # grown in place: a join of 40 MB of chunks was one long copy on the loop
    stream = request.stream().__aiter__()
    while True:
        try:
            chunk = await asyncio.wait_for(stream.__anext__(), max(0.0, deadline - asyncio.get_running_loop().time()))
        except StopAsyncIteration:
            break
        except asyncio.TimeoutError:
            raise APIError(408, f"request body not complete after {timeout_s:g} s ({size} bytes received)", None,
                           "request_body_timeout") from None
        size += len(chunk)
        if size > _DRAIN_LIMIT_BYTES:
            raise too_large
        over = over or size > limit
        if not over:
            body += chunk
    if over:
        raise too_large
    return body


async def _read_json(request: Request, limit: int = MAX_BODY_BYTES, timeout_s: float = BODY_TIMEOUT_S) -> dict:
    """The body as a JSON object; 400 invalid_json otherwise. Parsed in a worker thread, in short C calls
    (serving/json_body.py): the event loop keeps answering while a huge body is parsed."""
    return await run_in_threadpool(_json_object, await _read_body(request, limit, timeout_s))


#: most JSON values of a body's messages (chat) or input (/v1/responses), counted while the body is read (body_caps):
#: MAX_PARTS content parts of a few values each (a text part is 3: the part, its type, its text; an image part 4),
#: with room for the messages' own fields and tool calls; 100,000 /v1/responses input items were parsed (one
#: json.loads) and translated before their count was checked, holding /health 0.15 s
MAX_MESSAGE_VALUES = 16 * MAX_PARTS


def body_caps() -> dict:
    """The top-level fields whose size a limit caps -> (most JSON values, error code), for json_body.loads: a body
    over one is refused while it is read (a 10^6-entry logit_bias, 50,000 tools, a 36 MB schema, 100,000
    prompts, 100,000 content parts or input items); each limit is checked again, by name, on a body small enough to
    be read whole."""
    schema = grammar.MAX_SCHEMA_NODES + 16  # + response_format's own fields (type, json_schema: name, strict, ...)
    return {"response_format": (schema, grammar.TOO_COMPLEX),
            "tools": (tool_calls.MAX_TOOLS_VALUES, grammar.TOO_COMPLEX),
            "logit_bias": (MAX_LOGIT_BIAS_ENTRIES, "invalid_value"), "stop": (MAX_STOP_STRINGS, "invalid_value"),
            "prompt": (MAX_PROMPTS, "invalid_value"), "messages": (MAX_MESSAGE_VALUES, "too_many_parts"),
            "input": (MAX_MESSAGE_VALUES, "too_many_parts")}


def _json_object(raw: bytes) -> dict:
    try:
        body = json_body.loads(raw, body_caps())
    except json_body.TooManyValues as exc:
        raise bad_request(str(exc), exc.field, exc.code) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"request body is not valid JSON: {exc}", None, "invalid_json") from None
    except RecursionError:
        raise bad_request("request body is nested too deeply", None, "invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object", None, "invalid_json")
    return body


async def _parse(request: Request, limit: int = MAX_BODY_BYTES, timeout_s: float = BODY_TIMEOUT_S
                 ) -> ChatCompletionRequest:
    # validated in a worker thread too: pydantic over 100,000 parts would hold the loop
    return await run_in_threadpool(validate_chat, await _read_json(request, limit, timeout_s))


def validate_chat(body: dict) -> ChatCompletionRequest:
    """A JSON object -> ChatCompletionRequest; 400 naming the first offending field."""
    if isinstance(body.get("messages"), list):  # before pydantic walks every part
        try:
            check_part_count(body["messages"])
        except CoverPrunerError as exc:
            raise from_pipeline_error(exc, BODY_NAMES) from None
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        err = max(exc.errors(), key=lambda e: len(_clean_loc(e["loc"])))
        param = _format_loc(_clean_loc(err["loc"]))
        raise bad_request(f"{param}: {err['msg']}", param) from None


def _clean_loc(loc) -> list:
    """pydantic error location without the union-member labels ('str', 'list[...]', ...)."""
    return [x for x in loc if isinstance(x, int) or not (("[" in x) or x in ("str", "int", "float", "bool", "none"))]


def _format_loc(loc) -> str:
    out = ""
    for x in loc:
        out += f"[{x}]" if isinstance(x, int) else (f".{x}" if out else x)
    return out


def _unknown_model(name: str, state: ServerState, param: str | None = "model") -> APIError:
    return APIError(404, f"model {name!r} does not exist; this server serves {state.model_name!r}", param,
                    "model_not_found")


def _input_kinds(state: ServerState) -> list[str]:
    """The content part kinds this server answers: video only when the model takes video and PyAV is here."""
    return ["text", "image_url"] + (["video_url"] if state.takes_video and has_video_reader() else [])


def _model_card(state: ServerState) -> dict:
    return {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "coverpruner"}


def _api_error_from(exc: Exception) -> APIError:
    """A pipeline exception -> APIError: its code and param as raised (serving.errors.ERROR_STATUS gives the status
    and type), 500 internal_error for anything that is not a CoverPrunerError."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, CoverPrunerError):
        return from_pipeline_error(exc, BODY_NAMES)
    msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return APIError(500, f"internal error: {type(exc).__name__}: {msg}", None, "internal_error")


# -- responses ------------------------------------------------------------------------------------

@dataclass
class _Meta:
    id: str
    created: int
    model: str


async def _watch_disconnect(job: Job, request: Request) -> None:
    """Cancel ``job`` once the client has gone (checked every _DISCONNECT_POLL_S); run as a task."""
    while True:
        try:
            gone = await request.is_disconnected()
        except Exception:  # an ASGI server that cannot tell: the job then runs to its end
            return
        if gone:
            job.cancel()
            return
        await asyncio.sleep(_DISCONNECT_POLL_S)


def _usage(results: list) -> Usage:
    """One request's usage over its n answers: the prompt once, the answers' tokens summed."""
    done = sum(len(r.token_ids) for r in results)
    first = results[0]
    return Usage(prompt_tokens=first.prompt_tokens, completion_tokens=done,
                 total_tokens=first.prompt_tokens + done, prefill_tokens=first.prefill_tokens,
                 prompt_tokens_details={"cached_tokens": int(first.cached_tokens)})


def _coverpruner(result) -> dict:
    return {"kept_indices": [int(i) for i in result.kept_indices], "n": int(result.num_visual_tokens),
            "kept_tokens": int(len(result.kept_indices)), "budget": result.budget, "method": result.method,
            "finish_reason": result.finish_reason, "cached_tokens": int(result.cached_tokens),
            "images": [{"kept_indices": [int(i) for i in img.kept_indices],
                        "num_visual_tokens": int(img.num_visual_tokens)} for img in result.images],
            "timings_ms": {k: round(float(v), 3) for k, v in result.timings_ms.items()}}


def finish_reason(end: End) -> str:
    """OpenAI's finish_reason of an answer: "stop" for a stop string, a stop id or EOS, "length" at max_tokens or
    the context's end."""
    return _FINISH.get(end.result.finish_reason, end.result.finish_reason)


async def answers(state: ServerState, job: Job, gen: GenerationRequest, event):
    """A job's events from ``event`` on -> serving.choices Delta / End items of its n answers; then, where it did
    not finish, one APIError item (an error or the deadline) or None (cancelled)."""
    for count in itertools.count(1):
        kind, value = event
        if kind in ("piece", "finish", "done"):
            for item in items(kind, value):
                if isinstance(item, End):
                    state.metrics.observe_result(item.result)
                yield item
            if kind == "done":
                state.metrics.requests.labels("ok").inc()
                return
        else:
            yield (_timeout_error(state) if kind == "timeout" else _api_error_from(value)
                   if kind == "error" else None)
            return
        if count % _EVENTS_PER_TURN == 0:  # a queue of thousands of ready events would not yield otherwise
            await asyncio.sleep(0)
        event = await job.events.get()


@dataclass
class Collected:
    """One finished answer of a non-streamed request: its text, TokenLogprobs and End."""

    index: int
    text: str
    logprobs: list
    end: End


async def collect(state: ServerState, job: Job, gen: GenerationRequest, event) -> list[Collected] | None:
    """Every answer of a non-streamed request, in index order; None when the client went away; APIError raised."""
    texts, logprobs, ends = [[] for _ in range(gen.n)], [[] for _ in range(gen.n)], {}
    async for item in answers(state, job, gen, event):
        if item is None:
            return None
        if isinstance(item, APIError):
            raise item
        if isinstance(item, End):
            ends[item.index] = item
        else:
            texts[item.index].append(item.text)
            logprobs[item.index] += item.logprobs
    return [Collected(i, "".join(texts[i]), logprobs[i], ends[i]) for i in range(gen.n)]


#: events an answer's handler takes in a row before it lets the event loop run others: Queue.get of a ready item
#: does not yield, and 8 answers of 2,000 tokens with 20 logprobs each (16,000 events) held /health 0.2 s
_EVENTS_PER_TURN = 64
#: an answer of more token entries than this (tokens x (1 + top_logprobs alternatives), over its n choices) is
#: built and encoded in a worker thread in short steps (json_answer); below, at once on the loop as before
_LARGE_ANSWER_ENTRIES = 4096


async def json_answer(got: list, gen: GenerationRequest, build) -> Response:
    """The JSON response of ``build()`` (-> dict, which may hold json_body.RawJSON values: chat's logprobs), encoded
    by json_body.dumps; for a large answer (logprobs of many tokens, n choices) built and encoded in a worker
    thread, one logprob entry per C call, so the event loop keeps answering (/health) while a 20 MB body is
    written."""
    entries = sum(len(c.end.result.token_ids) for c in got) * (1 + (gen.top_logprobs or 0))
    if entries <= _LARGE_ANSWER_ENTRIES:
        return Response(json_body.dumps(build()), media_type="application/json")
    body = await run_in_threadpool(lambda: json_body.dumps(build()))
    return Response(body, media_type="application/json")


async def _complete(state: ServerState, job: Job, gen: GenerationRequest, event, meta: _Meta):
    got = await collect(state, job, gen, event)
    if got is None:
        return Response(status_code=499)

    def build() -> dict:
        lp = gen.top_logprobs is not None
        choices, logprobs = [], []
        for c in got:
            fields, finish = {"content": c.text}, finish_reason(c.end)
            if _parsed(gen):  # tool calls and reasoning split from the text (serving/tools.py)
                fields, finish = tools.message(gen.request, c.text, finish)
            choices.append(Choice(index=c.index, message=AssistantMessage(**fields), finish_reason=finish))
            logprobs.append(chat_logprobs_json(c.logprobs, state.token_text) if lp else None)
        body = ChatCompletion(id=meta.id, created=meta.created, model=meta.model, choices=choices,
                              usage=_usage([c.end.result for c in got]),
                              coverpruner=_coverpruner(got[0].end.result)).model_dump()
        for choice, entries in zip(body["choices"], logprobs):  # added after: pydantic would walk every entry
            choice["logprobs"] = entries
        return body

    return await json_answer(got, gen, build)


def _parsed(gen: GenerationRequest) -> bool:
    """Whether the request's answers are split into reasoning, content and tool calls (serving/tools.py)."""
    return gen.request.tool_plan is not None or gen.request.reasoning is not None


def sse_data(obj) -> str:
    payload = obj.model_dump_json(exclude_none=False) if hasattr(obj, "model_dump_json") else json.dumps(obj)
    return f"data: {payload}\n\n"


async def _sse(state: ServerState, job: Job, gen: GenerationRequest, event, meta: _Meta, timer=None):
    """OpenAI chunk stream: per answer (``index``) a role chunk, content chunks (with their tokens' logprobs when
    asked), a finish chunk (with the coverpruner object); then a usage chunk when stream_options.include_usage,
    then [DONE]. An error mid-stream (the deadline passing included) is an error event."""

    def chunk(index: int, delta: Delta, finish=None, logprobs=None, **extra) -> str:
        return sse_data(ChatCompletionChunk(id=meta.id, created=meta.created, model=meta.model,
                                            choices=[ChunkChoice(index=index, delta=delta, finish_reason=finish,
                                                                 logprobs=logprobs)], **extra))

    # an answer that may hold tool calls or reasoning streams them as their own deltas (serving/tools.py)
    calls = [tools.ChatStream(gen.request) if _parsed(gen) else None for _ in range(gen.n)]
    results = []
    try:
        for index in range(gen.n):
            yield chunk(index, Delta(role="assistant", content=""))
        async for item in answers(state, job, gen, event):
            if item is None:  # cancelled
                break
            if isinstance(item, APIError):
                state.count_error(item)
                yield f"data: {json.dumps(item.body())}\n\n"
                break
            call = calls[item.index]
            if isinstance(item, ChoiceDelta):
                logprobs = chat_logprobs(item.logprobs, state.token_text) if item.logprobs else None
                if call is None:
                    yield chunk(item.index, Delta(content=item.text), logprobs=logprobs)
                else:
                    deltas = call.push(item.text) or ([{}] if logprobs else [])
                    for k, delta in enumerate(deltas):  # the token's logprobs ride its first delta
                        yield chunk(item.index, Delta(**delta), logprobs=None if k else logprobs)
            else:
                results.append(item.result)
                finish = finish_reason(item)
                if call is not None:
                    for delta in call.end():
                        yield chunk(item.index, Delta(**delta))
                    finish = tools.finish_reason(call.splitter, finish)
                yield chunk(item.index, Delta(), finish, coverpruner=_coverpruner(item.result))
        if len(results) == gen.n and gen.include_usage:
            yield sse_data(ChatCompletionChunk(id=meta.id, created=meta.created, model=meta.model, choices=[],
                                               usage=_usage(results)))
        yield "data: [DONE]\n\n"
    finally:
        if timer is not None:
            timer.cancel()
        job.cancel()  # no-op once finished; stops the worker when the client went away mid-stream
