"""coverpruner-serve: an OpenAI-compatible HTTP server for an engine dir, on uvicorn or Ray Serve.

    coverpruner-serve ENGINE_DIR [--host 127.0.0.1] [--port 8000] [--workers N] [--provider cpu|cuda|tensorrt]
                      [--max-queue Q] [--model-name NAME] [--budget N|full] [--method NAME]
                      [--allow-local-files] [--allow-remote-images] [--max-video-bytes B] [--max-video-frames N]
                      [--ray --replicas K [--ray-address ADDR]]

Exit codes: 0 after a clean stop, 2 bad arguments, engine dir or a port in use (one line on stderr), 1 unexpected
failure.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from coverpruner.engines.ort import PROVIDERS
from coverpruner.integers import cli_int
from coverpruner.runtime.admission import DEFAULT_ADMISSION_SHARE
from coverpruner.runtime.errors import CoverPrunerError
from coverpruner.runtime.pipeline import METHODS, parse_budget

PROG = "coverpruner-serve"


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse's default also prints the usage block)
        print(f"{PROG}: error: {message}", file=sys.stderr)
        sys.exit(2)


class UsageError(Exception):
    """A bad combination of arguments; printed as one line, exit 2."""


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("engine_dir", metavar="ENGINE_DIR", help="engine dir written by coverpruner-export")
    http = p.add_argument_group("http")
    http.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    http.add_argument("--port", type=cli_int, default=8000, help="port (default 8000)")
    http.add_argument("--model-name", default=None, help="model id clients send (default: the engine dir's name)")
    http.add_argument("--allow-local-files", action="store_true",
                      help="accept local image paths / file:// URLs (only for trusted clients)")
    http.add_argument("--allow-remote-images", action="store_true", help="fetch http(s):// image and video URLs")
    http.add_argument("--max-video-bytes", type=cli_int, default=None, metavar="BYTES",
                      help="largest encoded video of a video_url part (Qwen2.5-VL engines; default 64 MiB); the "
                           "request body limit grows to hold it as base64")
    http.add_argument("--max-video-frames", type=cli_int, default=None, metavar="N",
                      help="most frames one video may give after sampling; requests may ask for fewer "
                           "(max_video_frames), never more (default: the engine dir's)")
    http.add_argument("--max-video-pixels", type=cli_int, default=None, metavar="N",
                      help="most decoded pixels (sampled frames x height x width) one video may hold, checked "
                           "from its header before any frame is decoded (default 2**27, ~400 MB of frames)")
    http.add_argument("--remote-timeout", type=float, default=None, metavar="SECONDS",
                      help="limit on a whole remote image fetch, redirects included (default 10)")
    http.add_argument("--request-timeout", type=float, default=None, metavar="SECONDS",
                      help="deadline of one chat completion from arrival, queueing included: past it the answer "
                           "is a 504 (an error event when streaming) and the generation is cancelled; 0 = none "
                           "(default 300)")
    http.add_argument("--body-timeout", type=float, default=None, metavar="SECONDS",
                      help="a request body must arrive whole within this many seconds of its headers, else 408 and "
                           "the connection is closed (slow or never-ending uploads; default 30)")
    prune = p.add_argument_group("pruning defaults (a request's own budget / method fields win)")
    prune.add_argument("--budget", default=None,
                       help="visual tokens to keep, or 'full' (default: the manifest's); for harnesses that cannot "
                            "send extra body fields")
    prune.add_argument("--method", default=None, help=f"selection method, one of {', '.join(METHODS)} "
                                                      "(default: the manifest's)")
    eng = p.add_argument_group("engine")
    eng.add_argument("--workers", type=cli_int, default=1, help="pipelines per process, one request each (default 1)")
    eng.add_argument("--max-batch", type=cli_int, default=None,
                     help="requests each worker decodes together, one batched decoder call per token (continuous "
                          "batching; needs an ORT-form decoder dir). Default: 8 for an ORT-form dir, else 1")
    eng.add_argument("--batch-context", type=cli_int, default=None,
                     help="KV tokens per batched request (prompt after pruning + answer; default min(model max, "
                          "4096)): the batch cache is layers x 2 x max_batch x kv_heads x this x head_dim floats")
    eng.add_argument("--max-step-tokens", type=cli_int, default=None,
                     help="rows one batched engine step may run: every running request's token first, then prefill "
                          "chunks of new requests, so a long prompt is prefilled across steps and running streams "
                          "keep their pace (default 32, at least --max-batch)")
    eng.add_argument("--max-queue", type=cli_int, default=16,
                     help="requests that may wait for a worker; more get 503 at once (default 16)")
    eng.add_argument("--provider", default="cpu", help=f"execution provider: {', '.join(PROVIDERS)} (default cpu)")
    eng.add_argument("--threads", type=cli_int, default=None,
                     help="intra-op threads of each pipeline's decoder (default cores/workers)")
    eng.add_argument("--admission-threads", type=cli_int, default=None,
                     help="intra-op threads of each pipeline's vision, probe and selector graphs, which run beside "
                          "the decode steps (default: --threads)")
    eng.add_argument("--admission-share", type=float, default=DEFAULT_ADMISSION_SHARE, metavar="S",
                     help="provider cpu: while streams decode, a new request's admission (vision, probe, selection, "
                          "prefill) and the decode steps take turns on the cores, the admission getting this share "
                          "of the time at the lowest thread priority: the streams' gaps grow to ~1/(1-S), the "
                          f"admission to ~1/S of their idle times (default {DEFAULT_ADMISSION_SHARE}; 0: side by "
                          "side at equal priority, for a machine shared with other busy processes)")
    eng.add_argument("--max-images", type=cli_int, default=None,
                     help="most images per request (default: the engine dir's, 8); more is a 400 too_many_images")
    eng.add_argument("--prefix-cache-mb", type=float, default=256,
                     help="MiB per pipeline for reusing pruned prefixes across turns (default 256; 0 turns it off)")
    eng.add_argument("--selector", choices=("auto", "onnx", "numpy"), default="auto",
                     help="how the coverpruner method runs (see coverpruner-run --help)")
    ray = p.add_argument_group("ray serve (extra serve-ray)")
    ray.add_argument("--ray", action="store_true", help="serve on Ray Serve instead of a single uvicorn process")
    ray.add_argument("--replicas", type=cli_int, default=None, help="Ray Serve replicas, each with --workers pipelines")
    ray.add_argument("--ray-address", default=None,
                     help="existing Ray cluster (e.g. ray://head:10001 or auto); default: start a local one")
    ray.add_argument("--ray-cpus-per-replica", type=float, default=1.0, help="CPUs Ray reserves per replica")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    return p


def check_args(args) -> None:
    """Raise UsageError for values argparse's types cannot catch."""
    if not 0 < args.port < 65536:
        raise UsageError(f"--port must be in 1..65535, got {args.port}")
    if args.workers < 1:
        raise UsageError(f"--workers must be >= 1, got {args.workers}")
    if args.max_batch is not None and args.max_batch < 1:
        raise UsageError(f"--max-batch must be >= 1, got {args.max_batch}")
    if args.batch_context is not None and args.batch_context < 2:
        raise UsageError(f"--batch-context must be >= 2, got {args.batch_context}")
    if args.max_queue < 0:
        raise UsageError(f"--max-queue must be >= 0, got {args.max_queue}")
    for flag, value in (("--threads", args.threads), ("--admission-threads", args.admission_threads)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    if not 0.0 <= args.admission_share < 1.0:
        raise UsageError(f"--admission-share must be in [0, 1), got {args.admission_share}")
    if args.max_step_tokens is not None and args.max_step_tokens < max(args.max_batch or 1, 1):
        raise UsageError(f"--max-step-tokens must be >= --max-batch ({args.max_batch or 1}), got "
                         f"{args.max_step_tokens}")
    if args.provider not in PROVIDERS:
        raise UsageError(f"unknown provider {args.provider!r}; expected one of {list(PROVIDERS)}")
    if args.budget is not None:
        parse_budget(args.budget)  # OptionError -> one line, exit 2
    if args.method is not None and args.method not in METHODS:
        raise UsageError(f"unknown method {args.method!r}; expected one of {list(METHODS)}")
    if not args.ray and (args.replicas is not None or args.ray_address is not None):
        raise UsageError("--replicas and --ray-address need --ray")
    if args.replicas is not None and args.replicas < 1:
        raise UsageError(f"--replicas must be >= 1, got {args.replicas}")
    if args.max_images is not None and args.max_images < 0:
        raise UsageError(f"--max-images must be >= 0, got {args.max_images}")
    if args.max_video_bytes is not None and args.max_video_bytes < 1:
        raise UsageError(f"--max-video-bytes must be >= 1, got {args.max_video_bytes}")
    if args.max_video_pixels is not None and args.max_video_pixels < 1:
        raise UsageError(f"--max-video-pixels must be >= 1, got {args.max_video_pixels}")
    if args.max_video_frames is not None and args.max_video_frames < 2:
        raise UsageError(f"--max-video-frames must be >= 2 (one temporal patch), got {args.max_video_frames}")
    if args.prefix_cache_mb < 0:
        raise UsageError(f"--prefix-cache-mb must be >= 0, got {args.prefix_cache_mb}")
    if args.remote_timeout is not None and not 0 < args.remote_timeout <= 300:
        raise UsageError(f"--remote-timeout must be in (0, 300] seconds, got {args.remote_timeout}")
    if args.request_timeout is not None and not (args.request_timeout == 0 or
                                                 0 < args.request_timeout <= 86400):
        raise UsageError(f"--request-timeout must be 0 (none) or in (0, 86400] seconds, got {args.request_timeout}")
    if args.body_timeout is not None and not 0 < args.body_timeout <= 3600:
        raise UsageError(f"--body-timeout must be in (0, 3600] seconds, got {args.body_timeout}")
    if args.ray_cpus_per_replica < 0:
        raise UsageError(f"--ray-cpus-per-replica must be >= 0, got {args.ray_cpus_per_replica}")


def _config(args):
    from coverpruner.serving.app import ServerConfig

    return ServerConfig(args.engine_dir, workers=args.workers, provider=args.provider, threads=args.threads,
                        max_queue=args.max_queue, model_name=args.model_name,
                        allow_local_files=args.allow_local_files, allow_remote_images=args.allow_remote_images,
                        selector=args.selector, budget=args.budget, method=args.method, max_batch=args.max_batch,
                        batch_context=args.batch_context, max_images=args.max_images,
                        prefix_cache_mb=args.prefix_cache_mb, admission_threads=args.admission_threads,
                        admission_share=args.admission_share,
                        max_step_tokens=args.max_step_tokens,
                        **({} if args.remote_timeout is None else {"remote_timeout_s": args.remote_timeout}),
                        **({} if args.max_video_bytes is None else {"max_video_bytes": args.max_video_bytes}),
                        max_video_frames=args.max_video_frames,
                        **({} if args.max_video_pixels is None else {"max_video_pixels": args.max_video_pixels}),
                        **({} if args.request_timeout is None else
                           {"request_timeout_s": args.request_timeout or None}),
                        **({} if args.body_timeout is None else {"body_timeout_s": args.body_timeout}))


def _require(module: str, extra: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise UsageError(f"{module} is not installed; pip install 'coverpruner[{extra}]'")


def _interrupt(signum, frame):
    raise KeyboardInterrupt()


def run(args) -> int:
    check_args(args)
    for module in ("fastapi", "uvicorn", "prometheus_client"):
        _require(module, "serve")
    if not (Path(args.engine_dir) / "manifest.json").is_file():  # fail before Ray starts; Pipeline.load checks the rest
        raise UsageError(f"{args.engine_dir}: not an engine dir (no manifest.json)")
    config = _config(args)
    # SIGTERM (docker stop, kill) stops as cleanly as Ctrl-C, and Ctrl-C works also when the shell started us
    # with SIGINT ignored; uvicorn re-raises the signal it caught after its graceful shutdown, which lands here
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    if args.ray:
        _require("ray", "serve-ray")
        from coverpruner.serving import ray_app

        ray_app.run(config, args.replicas or 1, args.host, args.port, args.ray_address, args.ray_cpus_per_replica)
        return 0
    import uvicorn

    from coverpruner.serving.app import create_app
    from coverpruner.serving.memory import freeze_startup_heap, leave_full_collections_to_the_engines

    sock = _listen(args.host, args.port)  # before the pipelines load: a busy port fails at once
    app = create_app(config)
    freeze_startup_heap()  # the garbage collector's full passes then skip what the server keeps for its life
    leave_full_collections_to_the_engines()  # and run where no stream waits for them
    print(f"{PROG}: serving {config.served_name!r} on http://{args.host}:{args.port}/v1 "
          f"({args.workers} worker(s) x batch {app.state.server.max_batch}, queue {args.max_queue})", file=sys.stderr,
          flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level=args.log_level)).run(sockets=[sock])
    return 0


def _listen(host: str, port: int):
    """A bound socket for uvicorn; UsageError (one line, exit 2) when the address is taken or not ours."""
    import errno
    import socket

    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        why = "already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
        raise UsageError(f"cannot listen on {host}:{port}: address {why}") from None
    sock.set_inheritable(True)
    return sock


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except (CoverPrunerError, UsageError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
