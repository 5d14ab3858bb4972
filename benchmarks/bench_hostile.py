"""Hostile-client measurement (issue 40): every case of tests/serving/hostile_cases.py against ONE coverpruner-serve
process per family, as a hostile client would (127.0.0.1, tiny ORT-form engines, default settings: 1 worker,
--max-batch 8, --max-queue 16).

Per case: the answer's status, body and seconds; the slowest /health while it ran (polled every 20 ms); the server's
RSS before, at its peak and 1 s after; the next normal request; and, for the cases marked ``neighbour``, a long
greedy request decoding in the same batch (its answer must equal its answer alone, its time within 2x of it).
A case is handled when: its expected outcome came (4xx with OpenAI's error body, naming the case's param, in under
1 s; or 200, equal to the greedy answer where the case says so; "any": either), /health stayed under 100 ms,
RSS came back within 200 MB of its level before, the next request was answered and the neighbour was unaffected.
Each time bound is also reported scaled by the machine's load (``stretch``: wall / CPU time of a 50 ms spin, as
tests/serving/test_event_loop.py): a figure taken on a shared machine is noisy; the lead reruns it on a quiet one.

    python benchmarks/bench_hostile.py                       # both families, every case (~5-10 min)
    python benchmarks/bench_hostile.py --family llava --only schema
Writes benchmarks/results/hostile_<family>_<tag>.json and hostile_<tag>.png.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_soak import rss_mb, start_server, tiny_engine  # noqa: E402
from tests.serving.hostile_cases import (ERROR_S, HEALTH_S, RSS_MB, answer_texts, cases, outcome,  # noqa: E402
                                         parse, stream_error)
RESULTS = ROOT / "benchmarks" / "results"
PRESETS = {"llava": "tiny", "qwen3_vl": "qwen3-vl-tiny"}
NEIGHBOUR_X = 2.0
NEIGHBOUR = {"model": "tiny", "max_tokens": 800, "ignore_eos": True, "temperature": 0,
             "messages": [{"role": "user", "content": "Tell me a long story about the sea."}]}
NORMAL = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "Say hi."}]}


def engine(family: str) -> Path:
    return tiny_engine(PRESETS[family], f"hostile_{PRESETS[family]}_ort", "ort")


def stretch() -> float:
    t0, c0 = time.perf_counter(), time.thread_time()
    while time.thread_time() - c0 < 0.05:
        pass
    return max(1.0, (time.perf_counter() - t0) / (time.thread_time() - c0))


def run_case(case, url: str, pid: int, reference: dict) -> dict:
    from tests.serving.http_raw import get, post

    body = case.body()
    load = stretch()
    rss0, peak = rss_mb(pid), [rss_mb(pid)]
    out, neighbour = {}, {}
    if case.neighbour:
        nt = threading.Thread(target=lambda: neighbour.update(r=post(url, json.dumps(NEIGHBOUR), timeout=300)))
        nt.start()
        time.sleep(min(0.3, reference["neighbour_s"] / 4))  # it is decoding when the hostile request comes
    # the answer is parsed after the polling: a 20 MB JSON parsed here would hold this process's GIL and slow the
    # /health polls measured from it
    worker = threading.Thread(target=lambda: out.update(r=post(url, body, timeout=300, path=case.path, parse=False)))
    worker.start()
    slowest, polls = 0.0, 0
    while worker.is_alive() or polls < 3:
        t = time.monotonic()
        try:
            status, _ = get(url, "/health", timeout=30)
        except OSError:
            status = -1
        slowest = max(slowest, time.monotonic() - t)
        polls += 1
        peak.append(rss_mb(pid))
        time.sleep(0.02)
    worker.join()
    status, raw, seconds = out["r"]
    data = parse(raw)
    row = {"name": case.name, "path": case.path, "expect": case.expect, "status": status, "seconds": round(seconds, 3),
           "slowest_health_s": round(slowest, 4), "stretch": round(load, 2), "body_mb": round(len(body) / 2 ** 20, 2)}
    if case.neighbour:
        nt.join()
        nstatus, ndata, nseconds = neighbour["r"]
        row["neighbour"] = {"status": nstatus, "seconds": round(nseconds, 3), "alone_s": reference["neighbour_s"],
                            "equal": nstatus == 200 and answer_texts(ndata) == reference["neighbour"]}
    time.sleep(1.0)
    row["rss_mb"] = {"before": round(rss0, 1), "peak": round(max(peak), 1), "after": round(rss_mb(pid), 1)}
    next_status = post(url, json.dumps(NORMAL), timeout=120)[0]
    row["next_status"] = next_status
    checks = outcome(case, status, data, seconds)
    row["error"] = data.get("error") if isinstance(data, dict) else stream_error(data)
    if "expected_status" in checks:
        row["body"] = str(data)[:300]
    if case.greedy and status == 200:
        greedy = reference.setdefault(case.name, greedy_texts(url, body, case.path))
        checks["equals_greedy"] = answer_texts(data) == greedy
    checks["health_under_100ms"] = slowest < HEALTH_S
    checks["rss_back_within_200mb"] = row["rss_mb"]["after"] - rss0 < RSS_MB
    checks["next_request_answered"] = next_status == 200
    if case.neighbour:
        n = row["neighbour"]
        checks["neighbour_equal"] = n["equal"]
        checks["neighbour_within_2x"] = n["seconds"] <= NEIGHBOUR_X * n["alone_s"]
    row["checks"] = checks
    row["handled"] = all(checks.values())
    # the time bounds once more, scaled by the load measured before the case (noisy machine)
    scaled = dict(checks)
    if "under_1s" in scaled:
        scaled["under_1s"] = seconds < ERROR_S * load
    scaled["health_under_100ms"] = slowest < HEALTH_S * load
    if "neighbour_within_2x" in scaled:
        scaled["neighbour_within_2x"] = row["neighbour"]["seconds"] <= NEIGHBOUR_X * load * row["neighbour"]["alone_s"]
    row["handled_load_scaled"] = all(scaled.values())
    return row


def greedy_texts(url: str, body: bytes, path: str) -> list[str] | None:
    from tests.serving.http_raw import post

    greedy = {**json.loads(body), "temperature": 0}
    greedy.pop("top_p", None)
    status, data, _ = post(url, json.dumps(greedy), timeout=120, path=path)
    return answer_texts(data) if status == 200 else None


def run(family: str, only: str | None, tag: str) -> dict:
    from tests.serving.http_raw import post

    chosen = [c for c in cases(family) if only is None or only in c.name]
    log = RESULTS / f"hostile_{family}_{tag}.log"
    proc, url = start_server(engine(family), log, args=())  # default settings
    try:
        for _ in range(3):
            post(url, json.dumps(NORMAL), timeout=120)
        runs = [post(url, json.dumps(NEIGHBOUR), timeout=300) for _ in range(2)]
        reference = {"neighbour": answer_texts(runs[0][1]), "neighbour_s": round(min(r[2] for r in runs), 3)}
        rows = []
        for case in chosen:
            row = run_case(case, url, proc.pid, reference)
            rows.append(row)
            bad = [k for k, v in row["checks"].items() if not v]
            print(f"{'ok  ' if row['handled'] else 'FAIL'} {row['status']:>4} {row['seconds']:7.3f}s health "
                  f"{row['slowest_health_s'] * 1e3:6.0f}ms rss +{row['rss_mb']['after'] - row['rss_mb']['before']:6.1f}"
                  f"MB  {case.name}" + (f"   <- {bad}" if bad else ""), flush=True)
    finally:
        proc.terminate()
        proc.wait(60)
    handled = sum(r["handled"] for r in rows)
    return {"command": "python " + " ".join(sys.argv), "family": family, "engine": str(engine(family)),
            "cases": len(rows), "handled": handled, "handled_load_scaled": sum(r["handled_load_scaled"] for r in rows),
            "not_handled": [r["name"] for r in rows if not r["handled"]], "reference": reference, "rows": rows}


def plot(reports: list[dict], path: Path) -> None:
    """Per case: its answer's seconds and the slowest /health while it ran (log scale), the bounds dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(reports), 1, figsize=(14, 3.6 * len(reports)), squeeze=False)
    for ax, report in zip(axes[:, 0], reports):
        rows = report["rows"]
        x = range(len(rows))
        ax.scatter(x, [max(r["seconds"], 1e-3) for r in rows], s=10, label="answer (s)",
                   c=["tab:blue" if r["handled"] else "tab:red" for r in rows])
        ax.scatter(x, [max(r["slowest_health_s"], 1e-3) for r in rows], s=10, marker="x", color="tab:green",
                   label="slowest /health (s)")
        ax.axhline(ERROR_S, ls="--", color="tab:blue", lw=0.8, label="refusal bound 1 s")
        ax.axhline(HEALTH_S, ls="--", color="tab:green", lw=0.8, label="/health bound 100 ms")
        ax.set_yscale("log")
        ax.set_xlabel("case (order of tests/serving/hostile_cases.py; red: not handled)")
        ax.set_title(f"{report['family']}: {report['handled']}/{report['cases']} handled "
                     f"({report['handled_load_scaled']} with the bounds scaled by the measured load)", fontsize=9)
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=["llava", "qwen3_vl", "both"], default="both")
    ap.add_argument("--only", default=None, help="only the cases whose name contains this")
    ap.add_argument("--tag", default="cpu")
    args = ap.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    reports = []
    for family in (["llava", "qwen3_vl"] if args.family == "both" else [args.family]):
        report = run(family, args.only, args.tag)
        out = RESULTS / f"hostile_{family}_{args.tag}.json"
        out.write_text(json.dumps(report, indent=1))
        print(f"{family}: {report['handled']}/{report['cases']} handled ({report['handled_load_scaled']} with the time "
              f"bounds scaled by the load); not handled: {report['not_handled']}")
        reports.append(report)
    plot(reports, RESULTS / f"hostile_{args.tag}.png")
    return 0 if all(r["handled_load_scaled"] == r["cases"] for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
