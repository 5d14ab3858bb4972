"""Server RSS over ten 16-frame 448x448 video requests (issue 29): peak growth per request against the documented
bound (docs/video.md#memory-of-a-video-request) and idle RSS after them against before.

One coverpruner-serve process (--max-batch 1, one ORT thread) on a Qwen2.5-VL engine dir (default: the tiny preset,
built by bench_soak.py). Before each request the kernel's peak-RSS mark of the server is reset (/proc/PID/clear_refs
"5"), so VmHWM after the answer is that request's peak; growth = VmHWM - idle RSS before it. The bound is computed
from the manifest's widths and the request's geometry (``video_peak_bound``). Writes
benchmarks/results/video_rss_<tag>.json and .png.

    python benchmarks/bench_video_rss.py [--engine DIR] [--requests 10]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from bench_soak import RESULTS, _mp4, _msg, _text, _url, post, rss_mb, start_server, tiny_engine  # noqa: E402

def video_peak_bound(vision_config: dict, frames: int, size: tuple[int, int], resized: tuple[int, int]) -> dict:
    """Bytes a video request may add at its peak (docs/video.md): decoded and resized frames (uint8), pixel values
    (float32 + the float64 rescale), one temporal patch's vision run (x2 for the ORT arena's power-of-two growth),
    the selection's two float64 n x n matrices. vision_config: the checkpoint's (num_heads, hidden_size,
    intermediate_size)."""
    from coverpruner.families.qwen2_5_vl.video import FRAME_FACTOR

    heads, width, inner = (vision_config[k] for k in ("num_heads", "hidden_size", "intermediate_size"))
    patch, tp = 14, FRAME_FACTOR
    h, w = resized
    P = (h // patch) * (w // patch)
    t = frames // tp
    N, n = t * P, t * P // 4
    K = 3 * tp * patch * patch
    terms = {
        "decoded_frames": frames * size[0] * size[1] * 3 + frames * h * w * 3,
        "pixel_values": N * K * (4 + 8),
        "vision_one_temporal_patch": 2 * (4 * (2 * heads + 2) * P * P + 4 * P * (K + 16 * width + 4 * inner)),
        "selection": 16 * n * n,
    }
    return {**terms, "total": sum(terms.values()), "P": P, "t": t, "n": n}


def hwm_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", type=Path)
    ap.add_argument("--checkpoint", type=Path, help="the checkpoint the engine came from (its vision widths); "
                                                     "default: the tiny preset's, next to the default engine")
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--tag", default="qwen2.5-vl-tiny_cpu")
    args = ap.parse_args(argv)
    engine = args.engine or tiny_engine()
    checkpoint = args.checkpoint or engine.with_name(engine.name + "_ck")
    RESULTS.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"model": "tiny", "temperature": 0, "max_tokens": 4, "budget": 64, "messages": _msg(
        {"type": "video_url", "video_url": {"url": _url(_mp4(16, 448, 448), "video/mp4")}},
        _text("What happens?"))}).encode()
    proc, url = start_server(engine, RESULTS / f"video_rss_{args.tag}.log")
    try:
        time.sleep(2)
        idle0 = rss_mb(proc.pid)
        rows = []
        for i in range(args.requests):
            before = rss_mb(proc.pid)
            Path(f"/proc/{proc.pid}/clear_refs").write_text("5")  # VmHWM := current RSS
            t = time.monotonic()
            status, data = post(url, body)
            assert status == 200, data
            rows.append({"request": i, "idle_before_mb": before, "peak_growth_mb": hwm_mb(proc.pid) - before,
                         "seconds": time.monotonic() - t, "answer": data["choices"][0]["message"]["content"]})
            time.sleep(0.5)
            print(rows[-1])
        time.sleep(2)
        idle1 = rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(60)
    from coverpruner.runtime import Pipeline
    from coverpruner.video import VideoInput

    pipe = Pipeline.load(engine, threads=1, prefix_cache_mb=0)
    vision = pipe.family_runtime.prepare_video(VideoInput(_mp4(16, 448, 448)), {"max_video_frames": 64})
    vision_config = json.loads((checkpoint / "config.json").read_text())["vision_config"]
    bound = video_peak_bound(vision_config, vision.facts["num_frames"], vision.facts["original"],
                             vision.facts["resized"])
    peak = max(r["peak_growth_mb"] for r in rows)
    report = {"command": "python " + " ".join(sys.argv), "engine": str(engine), "rows": rows,
              "bound_bytes": bound, "bound_mb": bound["total"] / 2 ** 20, "max_peak_growth_mb": peak,
              "idle_before_mb": idle0, "idle_after_mb": idle1,
              "checks": {"peak_within_bound": peak <= bound["total"] / 2 ** 20,
                         "idle_within_200mb": idle1 - idle0 <= 200,
                         "answers_equal": len({r["answer"] for r in rows}) == 1}}
    out = RESULTS / f"video_rss_{args.tag}.json"
    out.write_text(json.dumps(report, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar([r["request"] for r in rows], [r["peak_growth_mb"] for r in rows], color="tab:blue",
           label="peak growth per request (VmHWM - idle before)")
    ax.plot([r["request"] for r in rows], [r["idle_before_mb"] - idle0 for r in rows], "k.-",
            label="idle RSS before it - idle at start")
    ax.axhline(bound["total"] / 2 ** 20, color="tab:red", ls="--", label="documented bound")
    ax.set_xlabel("request (16 frames, 448x448)")
    ax.set_ylabel("MB")
    ax.legend(fontsize=7)
    ax.set_title(f"idle {idle0:.0f} -> {idle1:.0f} MB after {len(rows)} requests", fontsize=9)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)
    print(json.dumps({k: report[k] for k in ("bound_mb", "max_peak_growth_mb", "idle_before_mb", "idle_after_mb",
                                             "checks")}, indent=1))
    return 0 if all(report["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
