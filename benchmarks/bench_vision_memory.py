"""Peak RSS per stage: our Qwen2.5-VL pipeline (ONNX Runtime CPU) vs transformers (sdpa), 1008x1008 image.

Shape-real preset (`coverpruner-make-checkpoint --preset qwen2.5-vl-7b --layers 2`: 1280-wide vision blocks, the
preset's 4 vision blocks with block 3 full attention, 3584-wide Qwen2 layers, 152,064-entry vocabulary, random
weights), exported in fp32; transformers loads the same checkpoint in float32 with attn_implementation="sdpa".
Each side runs in its own fresh subprocess (one after the other, same run): load, then one request of
`--new-tokens` greedy tokens. A sampler thread reads the process RSS (/proc/self/statm) every 2 ms and keeps the
maximum per stage; stages are marked by wrapping the pipeline's stage calls (ours) or by forward hooks (HF). The
process peak is ru_maxrss.

    python benchmarks/bench_vision_memory.py                       # ours at budget full and 128, HF; ~6 min
    python benchmarks/bench_vision_memory.py --engine DIR --tag T  # another engine dir of the same checkpoint

Stages, ours: load (Pipeline.load: every session), vision, embed, probe, select, prefill, decode.
transformers: load (from_pretrained), vision (model.visual), prefill (first language-model call), decode.
Writes benchmarks/results/vision_memory_<tag>.json and .png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PROMPT = "What is the color of the house next to the tree, and is there a stop sign in the picture?"
SIDE = 1008  # the paper's Qwen2.5-VL resolution: 36 x 36 merged tokens = 1,296 visual tokens
GIB = 2 ** 30


class StageRss:
    """Samples this process's RSS every `period` s in a thread; `stage(name)` sets the label the samples go to.

    peaks: {stage: max RSS bytes while it was the label}. Stages that run several times keep their maximum."""

    def __init__(self, period: float = 0.002):
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.label, self.peaks, self.period = "start", {}, period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def _sample(self) -> None:
        self.peaks[self.label] = max(self.peaks.get(self.label, 0), self.rss())

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            time.sleep(self.period)

    def stage(self, name: str) -> None:
        self._sample()  # the previous stage's last sample
        self.label = name
        self._sample()

    def wrap(self, obj, method: str, name) -> None:
        """Replace obj.method by a call that runs under stage `name` (a str or a callable -> str)."""
        real = getattr(obj, method)

        def call(*a, **k):
            self.stage(name() if callable(name) else name)
            try:
                return real(*a, **k)
            finally:
                self.stage("between")
        setattr(obj, method, call)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        self._sample()
        return {k: v / GIB for k, v in self.peaks.items()}


def demo_image():
    from PIL import Image

    return Image.open(ROOT / "coverpruner" / "assets" / "demo.png").convert("RGB")


def child_ours(engine: Path, budget: str, new_tokens: int) -> dict:
    rss = StageRss()
    rss.stage("load")
    from coverpruner.runtime import Pipeline

    pipe = Pipeline.load(engine)
    rss.stage("between")
    calls = {"n": 0}

    def decoder_stage():
        calls["n"] += 1
        return "prefill" if calls["n"] == 1 else "decode"
    for method, name in (("vision", "vision"), ("embed", "embed"), ("relevance", "probe"), ("select_onnx", "select")):
        rss.wrap(pipe, method, name)
    rss.wrap(pipe.decoder, "forward", decoder_stage)
    t0 = time.perf_counter()
    result = pipe.generate(demo_image(), PROMPT, budget=budget, max_new_tokens=new_tokens, ignore_eos=True,
                           image_size=(SIDE, SIDE))
    seconds = time.perf_counter() - t0
    peaks = rss.stop()
    peaks.pop("between", None), peaks.pop("start", None)
    # embed also runs once per decode step: its peak is the larger of the two
    return {"stages": peaks, "peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB,
            "seconds": seconds, "timings": result.timings, "tokens": result.token_ids,
            "num_visual_tokens": result.num_visual_tokens, "prefill_tokens": result.prefill_tokens}


def child_hf(checkpoint: Path, new_tokens: int) -> dict:
    rss = StageRss()
    rss.stage("load")
    import torch
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(checkpoint), dtype=torch.float32,
                                                               attn_implementation="sdpa").eval()
    rss.stage("between")
    tok = AutoTokenizer.from_pretrained(str(checkpoint))
    images = Qwen2VLImageProcessorPil.from_pretrained(str(checkpoint))
    img = demo_image().resize((SIDE, SIDE), resample=3)  # PIL bicubic, as the image_size option
    pix = images(images=img, return_tensors="pt")
    n = int(pix["image_grid_thw"].prod()) // images.merge_size ** 2
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}]
    text = tok.apply_chat_template(messages, chat_template=(checkpoint / "chat_template.jinja").read_text(),
                                   tokenize=False, add_generation_prompt=True)
    text = text.replace("<|image_pad|>", "<|image_pad|>" * n)
    ids = tok(text, return_tensors="pt")
    # what Qwen2_5_VLProcessor adds: 1 on image pads (get_rope_index needs it for the 3-D positions)
    ids["mm_token_type_ids"] = (ids["input_ids"] == model.config.image_token_id).long()
    calls = {"n": 0}

    def lm_pre(*_):
        calls["n"] += 1
        rss.stage("prefill" if calls["n"] == 1 else "decode")
    model.model.visual.register_forward_pre_hook(lambda *_: rss.stage("vision"))
    model.model.visual.register_forward_hook(lambda *_: rss.stage("between"))
    model.model.language_model.register_forward_pre_hook(lm_pre)
    model.model.language_model.register_forward_hook(lambda *_: rss.stage("between"))
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(**ids, pixel_values=pix["pixel_values"], image_grid_thw=pix["image_grid_thw"],
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             repetition_penalty=1.0)
    seconds = time.perf_counter() - t0
    peaks = rss.stop()
    peaks.pop("between", None), peaks.pop("start", None)
    return {"stages": peaks, "peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB,
            "seconds": seconds, "tokens": out[0, ids["input_ids"].shape[1]:].tolist(), "num_visual_tokens": n,
            "prefill_tokens": int(ids["input_ids"].shape[1])}


def run_child(args: list[str]) -> dict:
    """One measurement in a fresh interpreter (its own RSS), result as JSON on the last stdout line."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode != 0:
        raise SystemExit(f"child {args} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def plot(path: Path, runs: dict, title: str) -> None:
    """Grouped bars: peak RSS (GiB) per stage, one colour per run; the process peak as the last group."""
    from PIL import Image, ImageDraw

    stages = ["load", "vision", "embed", "probe", "select", "prefill", "decode", "process peak"]
    colors = [(60, 150, 90), (120, 120, 200), (200, 60, 60), (230, 150, 40)]
    W, H, x0, y0, h = 1100, 500, 70, 50, 360
    img = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(img)
    d.text((x0, 15), title, fill="black")
    vmax = max(max(max(r["stages"].values()), r["peak_gib"]) for r in runs.values()) * 1.1
    d.line([x0, y0 + h, W - 20, y0 + h], fill="black")
    d.line([x0, y0, x0, y0 + h], fill="black")
    for k in range(6):
        v = vmax * k / 5
        d.text((x0 - 55, y0 + h - h * v / vmax - 6), f"{v:.1f} GiB", fill="black")
    gw = (W - 20 - x0) / len(stages)
    bw = gw * 0.8 / len(runs)
    for i, s in enumerate(stages):
        for j, (name, r) in enumerate(runs.items()):
            v = r["peak_gib"] if s == "process peak" else r["stages"].get(s)
            if v is None:
                continue
            xa = x0 + i * gw + gw * 0.1 + j * bw
            d.rectangle([xa, y0 + h - h * v / vmax, xa + bw - 3, y0 + h], fill=colors[j % len(colors)])
            d.text((xa, y0 + h - h * v / vmax - 12), f"{v:.1f}", fill="black")
        d.text((x0 + i * gw + 8, y0 + h + 8), s, fill="black")
    for j, name in enumerate(runs):
        d.rectangle([x0 + j * 260, y0 + h + 35, x0 + j * 260 + 12, y0 + h + 47], fill=colors[j % len(colors)])
        d.text((x0 + j * 260 + 16, y0 + h + 35), name, fill="black")
    img.save(path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", type=Path, default=ROOT / "benchmarks" / "work", help="checkpoint/engine cache")
    p.add_argument("--layers", type=int, default=2, help="decoder layers of the shape-real preset (default 2)")
    p.add_argument("--engine", type=Path, default=None, help="engine dir (default: the preset's fp32 export)")
    p.add_argument("--before", type=Path, default=None,
                   help="also measure this engine dir (e.g. one exported before a change) at budget full, as 'before'")
    p.add_argument("--budgets", default="full,128", help="our budgets, one subprocess each (default full,128)")
    p.add_argument("--new-tokens", type=int, default=8, help="answer length (default 8)")
    p.add_argument("--no-hf", action="store_true", help="skip the transformers run")
    p.add_argument("--tag", default="qwen2.5-vl-7b-2l_cpu", help="results file tag")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        kind, *rest = args.child
        out = child_ours(Path(rest[0]), rest[1], int(rest[2])) if kind == "ours" else \
            child_hf(Path(rest[0]), int(rest[1]))
        print(json.dumps(out))
        return 0

    from benchmarks.bench_pipeline import prepare

    ckpt = args.workdir / f"qwen2.5-vl-7b-{args.layers}l"
    engine = args.engine or prepare(args.workdir, args.layers, "fp32", "qwen2.5-vl-7b")
    runs = {}
    if args.before is not None:
        runs["before: budget full"] = run_child(["ours", str(args.before), "full", str(args.new_tokens)])
        print("before: budget full: " + json.dumps({k: round(v, 2) for k, v in runs["before: budget full"]["stages"].items()})
              + f" peak {runs['before: budget full']['peak_gib']:.2f} GiB", flush=True)
    for b in args.budgets.split(","):
        runs[f"ours budget {b}"] = run_child(["ours", str(engine), b, str(args.new_tokens)])
        print(f"ours budget {b}: " + json.dumps({k: round(v, 2) for k, v in runs[f'ours budget {b}']['stages'].items()})
              + f" peak {runs[f'ours budget {b}']['peak_gib']:.2f} GiB", flush=True)
    if not args.no_hf:
        runs["transformers sdpa"] = run_child(["hf", str(ckpt), str(args.new_tokens)])
        print("transformers: " + json.dumps({k: round(v, 2) for k, v in runs["transformers sdpa"]["stages"].items()})
              + f" peak {runs['transformers sdpa']['peak_gib']:.2f} GiB", flush=True)
    checks = {}
    if "transformers sdpa" in runs:
        hf = runs["transformers sdpa"]["peak_gib"]
        for name, r in runs.items():
            if name.startswith("ours"):  # "before" is the reference point, not a check
                checks[f"b_{name.replace(' ', '_')}_peak_at_most_transformers"] = r["peak_gib"] <= hf
        ours_full = next((r for n, r in runs.items() if n == "ours budget full"), None)
        if ours_full is not None:
            checks["full_budget_tokens_equal_transformers"] = ours_full["tokens"] == runs["transformers sdpa"]["tokens"]
    for k, ok in checks.items():
        print(f"check {k}: {'PASS' if ok else 'FAIL'}")

    import onnxruntime
    import torch
    import transformers

    out_dir = ROOT / "benchmarks" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": "vision_memory", "command": "python benchmarks/bench_vision_memory.py " + " ".join(argv or sys.argv[1:]),
        "engine": str(engine), "before": str(args.before) if args.before else None, "checkpoint": str(ckpt), "image": f"demo.png resized to {SIDE}x{SIDE}",
        "new_tokens": args.new_tokens, "unit": "GiB (2^30 bytes) of RSS",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "onnxruntime": onnxruntime.__version__,
                    "torch": torch.__version__, "transformers": transformers.__version__,
                    "python": platform.python_version(), "loadavg": os.getloadavg()},
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": runs, "checks": checks,
    }
    path = out_dir / f"vision_memory_{args.tag}.json"
    path.write_text(json.dumps(result, indent=2))
    plot(path.with_suffix(".png"), runs, f"Peak RSS per stage, Qwen2.5-VL-7B widths ({args.layers} decoder layers, "
                                         f"4 vision blocks), {SIDE}x{SIDE}, fp32, {os.cpu_count()} CPUs")
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
