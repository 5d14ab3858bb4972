"""coverpruner-serve under load: throughput and p50/p95 latency at concurrency 1/2/4/8, single process
(uvicorn, 2 workers) vs Ray Serve (2 replicas x 1 worker), on the tiny engine and the shape-real
LLaVA-1.5-7B engine (random weights, 2 decoder layers), all in one run; plus the server's RSS after 100
and after 1,000 requests (tiny engine, single process) to show memory stays flat.

Both server modes run 2 pipelines with 1 ORT thread each, so they get the same compute; every request is
the same image and question at a fixed answer length (``ignore_eos``) and is sent with the official
openai client from C threads (C = concurrency) over loopback.

    python benchmarks/bench_serve.py             # ~15 min on 2 cores
    python benchmarks/bench_serve.py --quick     # tiny engine only
    python benchmarks/bench_serve.py --streams 1,2,4,8 --new-tokens 128   # batched decode (serve_streams.py)
    python benchmarks/bench_serve.py --loop --new-tokens 128              # engine loop: 8 at once, turn-2 TTFT
    python benchmarks/bench_serve.py --fork 4 --new-tokens 16             # n=4 vs 4 separate requests (serve_fork.py)
    python benchmarks/bench_serve.py --grammar                            # 8 json_schema streams vs 8 plain
    python benchmarks/bench_serve.py --interleave                         # 3 streams while a 576-token image is
                                                                          # admitted (serve_interleave.py)

The engines are built under --workdir on first use and reused (the 7B one as in bench_pipeline.py).
Writes benchmarks/results/serve_<tag>.json and .png (--streams: serve_streams_<tag>.json and .png; --loop:
serve_loop_<tag>.json and .png; --fork: serve_fork_<tag>.json and .png; --grammar: serve_grammar_<tag>.json and
.png; --interleave: serve_interleave_<tag>.json and .png).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parents[1]
CONCURRENCY = (1, 2, 4, 8)
PROMPT = "What is the color of the house next to the tree, and is there a stop sign in the picture?"
MODES = {"single": ["--workers", "2"], "ray": ["--ray", "--replicas", "2", "--workers", "1",
                                              "--ray-cpus-per-replica", "0.5"]}
#: --streams: one worker that decodes up to 8 requests together, on both cores
BATCHED = ["--workers", "1", "--max-batch", "8", "--batch-context", "512"]


def percentile(xs: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]) of a non-empty list."""
    s = sorted(xs)
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid: int) -> float:
    """Resident set size of pid and its children (Ray replicas are not children; single mode only)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


class Server:
    """coverpruner-serve in a subprocess; ``url``, ``proc``, ``startup_s``."""

    def __init__(self, engine: Path, mode: str, log: Path, threads: int = 1, extra: tuple = ()):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "coverpruner.serving.cli", str(engine), "--port", str(self.port),
               "--threads", str(threads), "--model-name", "bench", "--max-queue", "64", "--log-level", "warning",
               *(BATCHED if mode == "batched" else MODES.get(mode, ["--workers", "1"])), *extra]
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=ROOT)
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}); see {log}")
            try:
                urllib.request.urlopen(f"{self.url}/health", timeout=2)
                break
            except OSError:
                if time.monotonic() - t0 > 600:
                    raise RuntimeError(f"server not healthy after 600 s; see {log}") from None
                time.sleep(0.5)
        self.startup_s = time.monotonic() - t0

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(180)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def make_client(url: str):
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)


def one_request(client, image_url: str, budget, new_tokens: int) -> tuple[float, str]:
    msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_url}},
                                         {"type": "text", "text": PROMPT}]}]
    t0 = time.perf_counter()
    r = client.chat.completions.create(model="bench", messages=msgs, max_tokens=new_tokens,
                                       extra_body={"budget": budget, "ignore_eos": True})
    return time.perf_counter() - t0, r.choices[0].message.content


def load_level(client, image_url, budget, new_tokens, concurrency: int, requests: int) -> dict:
    """`requests` requests from `concurrency` threads -> throughput and latency percentiles."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as ex:
        out = list(ex.map(lambda _: one_request(client, image_url, budget, new_tokens), range(requests)))
    wall = time.perf_counter() - t0
    lat = [x[0] for x in out]
    return {"concurrency": concurrency, "requests": requests, "wall_s": wall, "throughput_rps": requests / wall,
            "tokens_per_s": requests * new_tokens / wall, "p50_s": percentile(lat, 50), "p95_s": percentile(lat, 95),
            "mean_s": statistics.fmean(lat), "distinct_answers": len({x[1] for x in out})}


def bench_engine(name: str, engine: Path, spec: dict, image_url: str, logs: Path, rss: bool) -> dict:
    res = {"engine": str(engine), **spec, "modes": {}}
    for mode in MODES:
        print(f"[{name}] starting {mode} server", flush=True)
        server = Server(engine, mode, logs / f"{name}_{mode}.log")
        try:
            client = make_client(server.url)
            for _ in range(2):  # warm-up: ORT arenas, first-run kernel choice, both workers/replicas
                one_request(client, image_url, spec["budget"], spec["new_tokens"])
            levels = []
            for c in CONCURRENCY:
                n = max(spec["requests"], 2 * c)
                lvl = load_level(client, image_url, spec["budget"], spec["new_tokens"], c, n)
                print(f"[{name}] {mode:6s} c={c}: {lvl['throughput_rps']:7.2f} req/s  p50 {lvl['p50_s'] * 1e3:8.1f} ms"
                      f"  p95 {lvl['p95_s'] * 1e3:8.1f} ms  ({n} requests)", flush=True)
                levels.append(lvl)
            entry = {"startup_s": server.startup_s, "levels": levels}
            if rss and mode == "single":
                entry["rss"] = rss_curve(server, client, image_url, spec)
            res["modes"][mode] = entry
        finally:
            server.stop()
    return res


def rss_curve(server: Server, client, image_url: str, spec: dict, marks=(100, 1000)) -> dict:
    """Server RSS (MiB) after 100 and 1,000 requests counted from a fresh start of this phase."""
    out, done = {}, 0
    for mark in marks:
        with ThreadPoolExecutor(4) as ex:
            list(ex.map(lambda _: one_request(client, image_url, spec["budget"], spec["new_tokens"]),
                        range(mark - done)))
        done = mark
        out[str(mark)] = rss_mib(server.proc.pid)
        print(f"RSS after {mark} requests: {out[str(mark)]:.1f} MiB", flush=True)
    out["growth_ratio"] = out[str(marks[-1])] / out[str(marks[0])]
    return out


def plot(path: Path, results: dict, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    engines = list(results)
    fig, axes = plt.subplots(2, len(engines), figsize=(6 * len(engines), 8), squeeze=False)
    for j, name in enumerate(engines):
        for k, (mode, entry) in enumerate(results[name]["modes"].items()):
            cs = [lv["concurrency"] for lv in entry["levels"]]
            color = f"C{k}"  # one colour per server mode; p95 dashed
            axes[0][j].plot(cs, [lv["throughput_rps"] for lv in entry["levels"]], "o-", color=color, label=mode)
            axes[1][j].plot(cs, [lv["p50_s"] * 1e3 for lv in entry["levels"]], "o-", color=color, label=f"{mode} p50")
            axes[1][j].plot(cs, [lv["p95_s"] * 1e3 for lv in entry["levels"]], "s--", color=color,
                            label=f"{mode} p95")
        axes[0][j].set_title(f"{name}: throughput")
        axes[0][j].set_ylabel("requests / s")
        axes[1][j].set_title(f"{name}: latency")
        axes[1][j].set_ylabel("ms")
        for ax in axes[:, j]:
            ax.set_xscale("log", base=2)
            ax.set_xticks(CONCURRENCY, [str(c) for c in CONCURRENCY])
            ax.set_xlabel("concurrent clients")
            ax.grid(alpha=0.3)
            ax.legend()
        rss = results[name]["modes"].get("single", {}).get("rss")
        if rss:
            axes[0][j].text(0.02, 0.02, f"RSS after 100 / 1000 requests: {rss['100']:.0f} / {rss['1000']:.0f} MiB",
                            transform=axes[0][j].transAxes, fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_title() -> str:
    return (f"coverpruner-serve, single process (2 workers) vs Ray Serve (2 replicas), {os.cpu_count()} CPUs, "
            "fixed answer length")



def _demo_image_url() -> str:
    """coverpruner/assets/demo.png as a data URL (what every mode sends)."""
    return "data:image/png;base64," + base64.b64encode((ROOT / "coverpruner/assets/demo.png").read_bytes()).decode()


def _logs(workdir: Path) -> Path:
    """workdir/logs (the servers' logs), made if missing."""
    logs = workdir / "logs"
    logs.mkdir(exist_ok=True)
    return logs


def _write_json(out: Path, data: dict) -> None:
    """The results JSON, through a temporary and a rename (never half-written)."""
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", type=Path, default=Path("/tmp/coverpruner-bench-serve"),
                   help="where the checkpoints and engine dirs are built and reused")
    p.add_argument("--quick", action="store_true", help="tiny engine only, fewer requests, no RSS run")
    p.add_argument("--tiny-requests", type=int, default=40, help="requests per concurrency level, tiny engine")
    p.add_argument("--real-requests", type=int, default=8, help="requests per concurrency level, 7B engine")
    p.add_argument("--tag", default=None)
    streams = p.add_argument_group("batched decoding (--streams): aggregate decode tokens/s, benchmarks/serve_streams.py")
    streams.add_argument("--streams", default=None, metavar="LIST",
                         help="comma-separated concurrent stream counts, e.g. 1,2,4,8 (runs only this measurement)")
    streams.add_argument("--new-tokens", type=int, default=128, help="tokens per stream (ignore_eos)")
    streams.add_argument("--rounds", type=int, default=2, help="round-robin rounds over the stream counts")
    streams.add_argument("--threads", type=int, default=2, help="ORT intra-op threads of the one worker")
    streams.add_argument("--only", choices=("server", "engine"), default=None, help="run one of the two sides")
    loop = p.add_argument_group("the engine loop (--loop): 8 requests at once vs one, and turn-2 TTFT with the prefix "
                                "cache vs without, through one batched server (benchmarks/serve_loop.py)")
    loop.add_argument("--loop", action="store_true", help="run only this measurement")
    fork = p.add_argument_group("n answers (--fork N): one request with n=N vs N separate requests, time to complete "
                                "(benchmarks/serve_fork.py)")
    fork.add_argument("--fork", type=int, default=None, metavar="N", help="run only this measurement, with n=N")
    fork.add_argument("--fork-engine", choices=("7b", "tiny"), default="7b",
                      help="LLaVA-1.5-7B-width fp32 engine (2 layers) or the tiny demo engine")
    grammar = p.add_argument_group("constrained output (--grammar): 8 streams with a json_schema vs 8 without, "
                                   "round-robin, through one batched server (benchmarks/serve_grammar.py)")
    grammar.add_argument("--grammar", action="store_true", help="run only this measurement")
    inter = p.add_argument_group("admission beside decoding (--interleave): streams decoding while an image request "
                                 "of a new picture at budget full is admitted (benchmarks/serve_interleave.py)")
    inter.add_argument("--interleave", action="store_true", help="run only this measurement")
    inter.add_argument("--interleave-rounds", type=int, default=2, help="loaded / idle rounds, alternating")
    inter.add_argument("--server-args", default="", help="extra coverpruner-serve flags (e.g. '--max-step-tokens 16'; "
                                                        "--interleave and --loop)")
    args = p.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.interleave:
        return main_interleave(args, argv)
    if args.fork is not None:
        return main_fork(args, argv)
    if args.grammar:
        return main_grammar(args, argv)
    if args.loop:
        return main_loop(args, argv)
    if args.streams:
        return main_streams(args, argv)
    from coverpruner.demo import prepare as prepare_tiny

    image_url = _demo_image_url()
    engines = {"tiny": (prepare_tiny(args.workdir), dict(budget=16, new_tokens=16, visual_tokens=144,
                                                         requests=8 if args.quick else args.tiny_requests))}
    if not args.quick:
        from bench_pipeline import prepare as prepare_real

        engines["llava-1.5-7b-2l"] = (prepare_real(args.workdir, 2, "fp32"),
                                      dict(budget=64, new_tokens=8, visual_tokens=576, requests=args.real_requests))
    logs = _logs(args.workdir)
    results = {name: bench_engine(name, eng, spec, image_url, logs, rss=not args.quick and name == "tiny")
               for name, (eng, spec) in engines.items()}
    for name, r in results.items():
        s, ray = r["modes"]["single"]["levels"], r["modes"]["ray"]["levels"]
        r["ray_over_single_throughput"] = {str(a["concurrency"]): b["throughput_rps"] / a["throughput_rps"]
                                           for a, b in zip(s, ray)}
    import onnxruntime

    tag = args.tag or ("quick" if args.quick else "cpu")
    out = ROOT / "benchmarks" / "results" / f"serve_{tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "benchmark": "serve", "command": "python benchmarks/bench_serve.py "
                                         + " ".join(argv if argv is not None else sys.argv[1:]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "onnxruntime": onnxruntime.__version__,
                    "python": platform.python_version()},
        "setup": {"single": "uvicorn, 1 process, 2 workers x 1 ORT thread",
                  "ray": "Ray Serve, 2 replicas x 1 worker x 1 ORT thread, local Ray"},
        "latency_unit": "seconds", "results": results}, indent=2))
    plot(out.with_suffix(".png"), results, plot_title())
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


def main_streams(args, argv) -> int:
    """--streams: the LLaVA-1.5-7B-width fp32 engine through a batched server and through BatchGenerator."""
    import onnxruntime

    import serve_streams
    from bench_pipeline import prepare as prepare_real

    streams = [int(c) for c in args.streams.split(",")]
    if not streams or min(streams) < 1 or max(streams) > 8:
        raise SystemExit(f"--streams: counts between 1 and 8 (the worker's batch), got {args.streams!r}")
    engine = prepare_real(args.workdir, 2, "fp32")
    png = ROOT / "coverpruner/assets/demo.png"
    image_url = "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()
    logs = _logs(args.workdir)
    load0 = os.getloadavg()[0]
    data = {"benchmark": "serve_streams",
            "command": "python benchmarks/bench_serve.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "engine": str(engine),
            "streams": streams, "new_tokens": args.new_tokens, "rounds": args.rounds, "budget": serve_streams.BUDGET,
            "setup": f"coverpruner-serve {' '.join(BATCHED)} --threads {args.threads}; BatchGenerator(max_batch=8, "
                     f"capacity=512) with {args.threads} ORT threads",
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "onnxruntime": onnxruntime.__version__}}
    if args.only != "engine":
        data["server"] = serve_streams.run_server(
            lambda: Server(engine, "batched", logs / "streams_server.log", threads=args.threads), make_client,
            image_url, streams, args.rounds, args.new_tokens)
    if args.only != "server":
        data["engine"] = serve_streams.run_engine(engine, str(png), streams, args.rounds, args.new_tokens, args.threads)
    # other jobs on a shared machine skew absolutes (ratios less: every count runs in every round)
    data["load_average_1min"] = [load0, os.getloadavg()[0]]
    tag = args.tag or "cpu"
    out = ROOT / "benchmarks" / "results" / f"serve_streams_{tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    _write_json(out, data)
    serve_streams.plot(out.with_suffix(".png"), data)
    for side in ("server", "engine"):
        if side in data:
            print(side, {c: round(v["x_one_stream"], 2) for c, v in data[side]["decode"].items()})
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


def main_loop(args, argv) -> int:
    """--loop: benchmarks/serve_loop.py on the LLaVA-1.5-7B-width fp32 (ORT-form) engine."""
    import onnxruntime

    import serve_loop
    from bench_pipeline import prepare as prepare_real

    engine = prepare_real(args.workdir, 2, "fp32")
    image_url, logs = _demo_image_url(), _logs(args.workdir)
    load0 = os.getloadavg()[0]
    data = {"benchmark": "serve_loop",
            "command": "python benchmarks/bench_serve.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "engine": str(engine),
            "new_tokens": args.new_tokens, "rounds": args.rounds, "budget": serve_loop.BUDGET,
            "setup": f"coverpruner-serve {' '.join(BATCHED)} --threads {args.threads} --request-timeout 0 "
                     f"[--prefix-cache-mb 256 | 0] {args.server_args}".strip(),
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "onnxruntime": onnxruntime.__version__},
            "ttft": {}}
    for name, mb in (("cache_on", "256"), ("cache_off", "0")):
        # no request deadline: on a busy shared machine 8 x 128 tokens can outlast the default 300 s
        server = Server(engine, "batched", logs / f"loop_{name}.log", threads=args.threads,
                        extra=("--prefix-cache-mb", mb, "--request-timeout", "0", *args.server_args.split()))
        try:
            client = make_client(server.url)
            serve_loop._throughput_level(client, image_url, 1, 4)  # warm-up
            if name == "cache_on":
                data["throughput"] = serve_loop.throughput(client, image_url, args.rounds, args.new_tokens)
            data["ttft"][name] = serve_loop.ttft(client, image_url)
        finally:
            server.stop()
    on, off = data["ttft"]["cache_on"], data["ttft"]["cache_off"]
    data["ttft"]["x_cache"] = off["median_ttft_s"] / on["median_ttft_s"]
    data["ttft"]["answers_equal"] = [(c["turn1"], c["turn2"]) for c in on["conversations"]] == \
        [(c["turn1"], c["turn2"]) for c in off["conversations"]]
    data["load_average_1min"] = [load0, os.getloadavg()[0]]
    tag = args.tag or "cpu"
    out = ROOT / "benchmarks" / "results" / f"serve_loop_{tag}.json"
    _write_json(out, data)
    serve_loop.plot(out.with_suffix(".png"), data)
    print(f"8 at once: {data['throughput']['x_one_request']:.2f}x one request; turn-2 TTFT cache on "
          f"{on['median_ttft_s']:.2f} s vs off {off['median_ttft_s']:.2f} s = {data['ttft']['x_cache']:.2f}x; "
          f"answers equal: {data['ttft']['answers_equal']}; load {data['load_average_1min']}")
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


def main_interleave(args, argv) -> int:
    """--interleave: benchmarks/serve_interleave.py on the LLaVA-1.5-7B-width fp32 (ORT-form) engine, 2 layers."""
    import onnxruntime

    import serve_interleave
    from bench_pipeline import prepare as prepare_real

    engine = prepare_real(args.workdir, 2, "fp32")
    extra = ("--max-batch", "8", "--batch-context", "1024", "--request-timeout", "0", *args.server_args.split())
    setup = f"coverpruner-serve ENGINE --workers 1 --threads {args.threads} {' '.join(extra)}"
    load0 = os.getloadavg()[0]
    server = Server(engine, "interleave", _logs(args.workdir) / "interleave.log", threads=args.threads, extra=extra)
    try:
        serve_interleave.newcomer(server.url, 1)  # warm-up: ORT arenas, first-run kernel choice
        measured = serve_interleave.measure(server.url, _demo_image_url(), args.interleave_rounds)
    finally:
        server.stop()
    data = {"benchmark": "serve_interleave",
            "command": "python benchmarks/bench_serve.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "engine": str(engine), "setup": setup,
            "streams": serve_interleave.STREAMS, "stream_budget": serve_interleave.STREAM_BUDGET,
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "onnxruntime": onnxruntime.__version__},
            "measure": measured, "load_average_1min": [load0, os.getloadavg()[0]]}
    out = ROOT / "benchmarks" / "results" / f"serve_interleave_{args.tag or 'cpu'}.json"
    _write_json(out, data)
    serve_interleave.plot(out.with_suffix(".png"), data)
    print(f"worst gap during an admission / median gap: {measured['worst_gap_over_median']:.2f}x; newcomer TTFT "
          f"{measured['median_loaded_ttft_s']:.2f} s vs idle {measured['median_idle_ttft_s']:.2f} s = "
          f"{measured['ttft_loaded_over_idle']:.2f}x; load {data['load_average_1min']}")
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


def main_fork(args, argv) -> int:
    """--fork N: benchmarks/serve_fork.py through a batched server, prefix cache off and on."""
    import onnxruntime

    import serve_fork

    if not 2 <= args.fork <= 8:
        raise SystemExit(f"--fork: n between 2 and 8 (the worker's batch), got {args.fork}")
    if args.fork_engine == "tiny":
        from coverpruner.demo import prepare as prepare_tiny

        engine, name = prepare_tiny(args.workdir), "tiny demo engine"
    else:
        from bench_pipeline import prepare as prepare_real

        engine, name = prepare_real(args.workdir, 2, "fp32"), "LLaVA-1.5-7B width, 2 layers, fp32"
    image_url, logs = _demo_image_url(), _logs(args.workdir)
    load0 = os.getloadavg()[0]
    data = {"benchmark": "serve_fork",
            "command": "python benchmarks/bench_serve.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "engine": str(engine), "engine_name": name,
            "n": args.fork, "new_tokens": args.new_tokens, "rounds": args.rounds, "budget": serve_fork.BUDGET,
            "setup": f"coverpruner-serve {' '.join(BATCHED)} --threads {args.threads} --prefix-cache-mb 0 | 256",
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "onnxruntime": onnxruntime.__version__},
            "servers": {}}
    out = ROOT / "benchmarks" / "results" / f"serve_fork_{args.tag or 'cpu'}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    for label, mb in (("prefix cache off", "0"), ("prefix cache on", "256")):
        # no deadline: on a loaded 2-core machine four separate 7B-width admissions outlast the default 300 s
        server = Server(engine, "batched", logs / f"fork_{mb}.log", threads=args.threads,
                        extra=("--prefix-cache-mb", mb, "--request-timeout", "0", *args.server_args.split()))
        try:
            data["servers"][label] = serve_fork.measure(make_client(server.url), image_url, args.fork, args.rounds,
                                                        args.new_tokens, label)
        finally:
            server.stop()
        data["load_average_1min"] = [load0, os.getloadavg()[0]]
        _write_json(out, data)  # written after each server: a cut-short run keeps what it measured
        serve_fork.plot(out.with_suffix(".png"), data)
    for label, r in data["servers"].items():
        print(f"{label}: n={args.fork} {r['median_wall_s']['fork']:.2f} s vs {args.fork} separate "
              f"{r['median_wall_s']['separate']:.2f} s = {r['x_fork_over_separate']:.2f}x; answers equal: "
              f"{r['answers_equal']}")
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


def main_grammar(args, argv) -> int:
    """--grammar: benchmarks/serve_grammar.py on the LLaVA-1.5-7B-width fp32 (ORT-form) engine."""
    import onnxruntime

    import serve_grammar
    from bench_pipeline import prepare as prepare_real

    engine = prepare_real(args.workdir, 2, "fp32")
    image_url, logs = _demo_image_url(), _logs(args.workdir)
    load0 = os.getloadavg()[0]
    data = {"benchmark": "serve_grammar",
            "command": "python benchmarks/bench_serve.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "engine": str(engine),
            "rounds": args.rounds, "budget": serve_grammar.BUDGET, "schema": serve_grammar.SCHEMA,
            "setup": f"coverpruner-serve {' '.join(BATCHED)} --threads {args.threads}",
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "onnxruntime": onnxruntime.__version__}}
    data["server"] = serve_grammar.run_server(
        lambda: Server(engine, "batched", logs / "grammar_server.log", threads=args.threads,
                       extra=("--request-timeout", "0")), make_client,
        image_url, args.rounds)
    data["load_average_1min"] = [load0, os.getloadavg()[0]]
    out = ROOT / "benchmarks" / "results" / f"serve_grammar_{args.tag or 'cpu'}.json"
    _write_json(out, data)
    serve_grammar.plot(out.with_suffix(".png"), data)
    med = data["server"]["median_decode_tokens_per_s"]
    print(f"decode tokens/s: json_schema {med['json_schema']:.1f} vs plain {med['plain']:.1f} = "
          f"{data['server']['json_over_plain']:.2f}x; load {data['load_average_1min']}")
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
