"""End-to-end Pipeline latency on a shape-real 7B preset (random weights, few decoder layers).

Presets: llava-1.5-7b (576 visual tokens; budgets full/128/64/32; checks at 64) and llava-next-7b (a 672x672
image: 2x2 grid + base = 2,880 candidates + 48 newline rows; budgets full/640/320/160; checks at 320) and
qwen2.5-vl-7b (1008x1008 image = 1,296 visual tokens; budgets full/512/256/128, checks at 128, 28 real layers;
4 vision blocks) and qwen3-vl-8b (1024x1024 = 1,024 visual tokens, DeepStack features gathered with the kept rows;
budgets full/512/256/128, checks at 128, 36 real layers; 4 vision blocks), gemma-3-4b (two 896x896 images in one
turn = 2 x 256 soft tokens, budgets per image full/128/64/32, checks at 64 each; 2 layers: 1 sliding + 1 full, 34
real layers; 4 vision blocks; the image-block masks and the window in both decoder forms) and qwen3.5-4b (1024x1024
= 1,024 visual tokens; 4 decoder layers by default: 3 Gated DeltaNet + 1 full attention, the real 32-layer stack's
3:1 pattern, so the projection to 32 layers is 8 such groups; budgets full/512/256/128, checks at 128; the probe is
the exact one (layers 0-2 on the whole sequence, then layer 3's softmax), and the cheap proxy probe (layer 0's query
/ key) is timed beside it from a copy of the engine dir with only probe.onnx re-exported: --probe proxy).
For each budget (round-robin) the real ``Pipeline.generate`` runs ``--repeats`` times (after warm-up) with a
fixed answer length (``ignore_eos``); the medians of its stage timings are reported: vision, embed, probe,
select, prefill and per-token decode. Checks, all from the same run, at the preset's check budget m:
  (a) decoder prefill speed-up at m over full >= 0.9 x the ideal L_full / L_m (prefill lengths; for LLaVA-1.5
      (576+T)/(m+T), T = text tokens);
  (b) probe + select at m <= 0.25 x one decoder layer's prefill at full length (full prefill / number of layers);
      reported only for qwen3.5-4b, whose exact probe runs the decoder's first three layers over the sequence;
  (c) the speed-up projected to the real decoder depth L (32; Qwen2.5-VL-7B 28), L x per-layer prefill at full over
      L x per-layer prefill at the budget + probe + select, printed beside the ideal.
llava-next-7b also times, in the same run on the run's own projector features V [2880, 4096], the selector rows
of the paper's overhead table: similarity (cosine, centre, clip; float64) once and the greedy (numpy) per budget.

    python benchmarks/bench_pipeline.py                          # llava-1.5-7b: ~2 GB checkpoint, ~4 GB
    python benchmarks/bench_pipeline.py --preset llava-next-7b   # ~2 GB checkpoint, ~5 GB engine dir
    python benchmarks/bench_pipeline.py --quick                  # 1 repeat
    python benchmarks/bench_pipeline.py --preset qwen2.5-vl-7b --repeats 3   # ~3 GB checkpoint, ~8 GB
    python benchmarks/bench_pipeline.py --preset qwen3-vl-8b --repeats 3     # ~3 GB checkpoint, ~9 GB
    python benchmarks/bench_pipeline.py --preset gemma-3-4b --repeats 3      # ~1.5 GB checkpoint, ~8 GB
    python benchmarks/bench_pipeline.py --preset qwen3.5-4b --repeats 3 --genai   # ~2 GB checkpoint, ~6 GB

The checkpoint (coverpruner-make-checkpoint --preset <preset> --layers 2; qwen3.5-4b: 4) and its fp32 engine dir
are built under --workdir on first use and reused. Writes benchmarks/results/pipeline_<tag>.json and .png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("vision", "embed", "probe", "select", "prefill")
#: preset -> checkpoint preset, budgets (round-robin), budget of checks (a)/(b), real decoder depth, request options
#: side: the demo image resized to a square of this many pixels (None: the demo as is); the selector overhead rows
#: of the paper's table are timed for llava-next-7b only
PRESETS = {
    "llava-1.5-7b": {"budgets": ("full", 128, 64, 32), "check": 64, "real_layers": 32, "options": {}, "side": None},
    "llava-next-7b": {"budgets": ("full", 640, 320, 160), "check": 320, "real_layers": 32, "options": {},
                      "side": 672},
    "qwen2.5-vl-7b": {"budgets": ("full", 512, 256, 128), "check": 128, "real_layers": 28,
                      "options": {"image_size": (1008, 1008)}, "side": None},
    # a square 1024 px image: smart resize keeps it (32 px per visual token) -> 32 x 32 = 1,024 visual tokens
    "qwen3-vl-8b": {"budgets": ("full", 512, 256, 128), "check": 128, "real_layers": 36, "options": {},
                    "side": 1024},
    # two 896 px images in one user turn: 2 x 256 soft tokens, the budget per image (check: 64 each = 128 kept);
    # layer 0 sliding (window 1024 > the prompt), layer 1 full
    "gemma-3-4b": {"budgets": ("full", 128, 64, 32), "check": 64, "real_layers": 34, "options": {}, "side": 896,
                   "images": 2},
    # 3 Gated DeltaNet layers + 1 full: the real 32 layers are 8 such groups; probe + select reported, not checked
    "qwen3.5-4b": {"budgets": ("full", 512, 256, 128), "check": 128, "real_layers": 32, "options": {}, "side": 1024,
                   "layers": 4, "probe_check": False},
}


from coverpruner.engine_dir import GRAPH_NAMES as GRAPHS  # noqa: E402


def prepare(workdir: Path, layers: int, dtype: str, preset: str = "llava-1.5-7b") -> Path:
    """Shape-real checkpoint + engine dir under workdir (built once, reused); returns the engine dir."""
    ckpt = workdir / f"{preset}-{layers}l"
    engine = workdir / f"{preset}-{layers}l-{dtype}"
    if not (ckpt / "config.json").is_file():
        from coverpruner.testing.checkpoints import write_checkpoint

        print(f"writing checkpoint {ckpt}", flush=True)
        write_checkpoint(ckpt, preset=preset, layers=layers, seed=0)
    manifest = engine / "manifest.json"
    missing = GRAPHS if not manifest.is_file() else [g for g in GRAPHS if g not in json.loads(manifest.read_text())["graphs"]]
    if missing:  # a re-export of some graphs keeps the others in the manifest
        from coverpruner.export.exporter import ExportOptions, export_model

        print(f"exporting {', '.join(missing)} to {engine}", flush=True)
        export_model(ckpt, engine, f"{preset} preset, {layers} layers, random weights",
                     ExportOptions(dtype=dtype, graphs=tuple(missing), progress=False))
    return engine


def ask(pipe, images: list, prompt: str, **kw):
    """One request: generate for one image, else chat with one user turn holding the images, then the prompt (the
    budget is per image)."""
    if len(images) == 1:
        return pipe.generate(images[0], prompt, **kw)
    turn = [{"type": "image", "image": image} for image in images] + [{"type": "text", "text": prompt}]
    return pipe.chat([{"role": "user", "content": turn}], **kw)


def run_budgets(pipe, images, prompt, method, new_tokens, repeats, budgets, options=None):
    """Round-robin over budgets ``repeats`` times (a slow spell on a shared machine hits every budget alike).

    Returns {budget: {"timings": medians (+ decode_per_token), prefill/prompt tokens, kept, runs}}.
    """
    runs = {str(b): [] for b in budgets}
    for _ in range(repeats):
        for b in budgets:
            runs[str(b)].append(ask(pipe, images, prompt, budget=b, method=method, max_new_tokens=new_tokens,
                                    ignore_eos=True, **(options or {})))
    rows = {}
    for b, rs in runs.items():
        med = {k: statistics.median(r.timings[k] for r in rs) for k in rs[0].timings}
        med["decode_per_token"] = statistics.median(r.timings["decode"] / max(len(r.token_ids) - 1, 1) for r in rs)
        rows[b] = {"timings": med, "prefill_tokens": rs[-1].prefill_tokens, "prompt_tokens": rs[-1].prompt_tokens,
                   "kept": sum(len(i.kept_indices) for i in rs[-1].images),
                   "num_visual_tokens": sum(i.num_visual_tokens for i in rs[-1].images),
                   "runs": [r.timings for r in rs]}
    return rows


def analyse(rows: dict, n: int, layers: int, check: int, real_layers: int = 32, probe_check: bool = True) -> dict:
    full = rows["full"]
    T = full["prompt_tokens"] - n  # tokens that are no candidate: text (+ LLaVA-NeXT's newline rows)
    per_layer_full = full["timings"]["prefill"] / layers
    out = {"text_tokens": T, "per_layer_prefill_full_s": per_layer_full, "budgets": {}}
    for b, row in rows.items():
        if b == "full":
            continue
        t = row["timings"]
        ideal = full["prefill_tokens"] / row["prefill_tokens"]  # L_full / L_m
        measured = full["timings"]["prefill"] / t["prefill"]
        per_layer_b = t["prefill"] / layers
        projected = (real_layers * per_layer_full) / (real_layers * per_layer_b + t["probe"] + t["select"])
        out["budgets"][str(b)] = {
            "ideal_speedup": ideal, "measured_prefill_speedup": measured, "fraction_of_ideal": measured / ideal,
            "probe_plus_select_s": t["probe"] + t["select"],
            "probe_plus_select_over_layer": (t["probe"] + t["select"]) / per_layer_full,
            "projected_speedup": projected, "projected_layers": real_layers,
            "decode_per_token_speedup": full["timings"]["decode_per_token"] / t["decode_per_token"],
        }
    bm = out["budgets"][str(check)]
    out["checks"] = {f"a_prefill_{check}_at_least_0.9_ideal": bm["fraction_of_ideal"] >= 0.9}
    if probe_check:
        out["checks"][f"b_probe_select_{check}_at_most_0.25_layer"] = bm["probe_plus_select_over_layer"] <= 0.25
    return out


def proxy_probe(engine: Path, ckpt: Path, image, prompt: str, method: str, budget, new_tokens: int, repeats: int,
                pipe, options: dict, per_layer_full: float, per_layer_at_budget: float, real_layers: int) -> dict:
    """The family's cheap proxy probe beside the exact one (Qwen3.5: layer 0's query / key as a softmax): a copy of
    the engine dir (hard links) with probe.onnx re-exported --probe proxy, whose probe session takes turns with the
    exact one inside ``pipe`` (one pipeline: a second would hold the decoder and token table twice); probe + select
    at ``budget`` timed round-robin, in full-length layers (per_layer_full) and as the speed-up projected to
    ``real_layers`` (per_layer_at_budget: the pruned prefill per layer), and the overlap of the kept rows."""
    import shutil

    from coverpruner.engines.ort import OrtSessionFactory
    from coverpruner.export.exporter import ExportOptions, export_model

    proxy_dir = engine.with_name(engine.name + "-proxy")
    if not (proxy_dir / "manifest.json").is_file():
        shutil.copytree(engine, proxy_dir, copy_function=os.link)
        (proxy_dir / "probe.onnx").unlink()
        export_model(ckpt, proxy_dir, json.loads((engine / "manifest.json").read_text())["source_model"],
                     ExportOptions(dtype="fp32", graphs=("probe",), probe="proxy", progress=False))
    sessions = {"exact": pipe.sessions["probe"],
                "proxy": OrtSessionFactory(pipe.provider, manifest=pipe.manifest.raw)("probe", proxy_dir / "probe.onnx")}
    times, kept = {"exact": [], "proxy": []}, {}
    try:
        for _ in range(repeats + 1):  # the first round warms up and is dropped
            for name, session in sessions.items():
                pipe.sessions["probe"] = session
                r = pipe.generate(image, prompt, budget=budget, method=method, max_new_tokens=1, ignore_eos=True,
                                  **options)
                times[name].append(r.timings["probe"] + r.timings["select"])
                kept[name] = set(r.kept_indices.tolist())
    finally:
        pipe.sessions["probe"] = sessions["exact"]
    out = {}
    for name, ts in times.items():
        t = statistics.median(ts[1:])
        out[name] = {"probe_plus_select_s": t, "over_full_length_layer": t / per_layer_full,
                     # the real depth's prefill at full over the pruned one + this probe + select (as analyse)
                     "projected_speedup": real_layers * per_layer_full / (real_layers * per_layer_at_budget + t)}
    out["kept_overlap"] = len(kept["exact"] & kept["proxy"]) / budget
    return out


def selector_overhead(pipe, image, budgets, repeats) -> list[dict]:
    """The paper's selector overhead rows on this run's projector features V [n, d] (n = 2,880 for a 672 px
    LLaVA-NeXT image): similarity (float64 cosine, centre, clip; shared by all budgets) and the numpy greedy
    per budget, medians over `repeats`; relevance from the run's own probe."""
    import numpy as np

    from coverpruner.selection import coverage_utilities, demand_weights, greedy_incremental

    rt, opts = pipe.family_runtime, pipe.family_options()
    vision = rt.prepare_image(image, opts)
    span = rt.image_span(pipe.vision(vision.feeds), vision, opts)
    v = span.features.astype(np.float32)
    relevance = pipe.generate(image, "What is in the picture?", budget=budgets[0], max_new_tokens=1).relevance
    w = demand_weights(relevance, 0.3)

    def median_time(fn):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times), out

    t_sim, a = median_time(lambda: coverage_utilities(v))
    rows = []
    for m in budgets:
        t_sel, _ = median_time(lambda: greedy_incremental(a, w, int(m)))
        rows.append({"n": int(v.shape[0]), "d": int(v.shape[1]), "budget": int(m), "backend": "numpy",
                     "similarity_ms": 1e3 * t_sim, "selection_ms": 1e3 * t_sel, "total_ms": 1e3 * (t_sim + t_sel),
                     "selection_over_similarity": t_sel / t_sim})
        print(f"selector n={v.shape[0]} m={m}: similarity {1e3 * t_sim:7.1f} ms, greedy {1e3 * t_sel:7.1f} ms",
              flush=True)
    return rows


def plot(path: Path, rows: dict, analysis: dict, title: str) -> None:
    """Stacked stage times per budget (left) and prefill speed-up measured / ideal / projected (right)."""
    from PIL import Image, ImageDraw

    W, H, pad = 1100, 520, 60
    img = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(img)
    d.text((pad, 15), title, fill="black")
    colors = {"vision": (120, 120, 200), "embed": (160, 160, 160), "probe": (230, 150, 40),
              "select": (200, 60, 60), "prefill": (60, 150, 90), "decode_per_token": (40, 40, 40)}
    # left: stacked seconds
    x0, y0, w, h = pad, 60, 460, 380
    names = list(rows)
    total_max = max(sum(rows[b]["timings"][s] for s in STAGES) for b in names) * 1.1
    d.line([x0, y0 + h, x0 + w, y0 + h], fill="black")
    d.line([x0, y0, x0, y0 + h], fill="black")
    for k in range(5):
        v = total_max * k / 4
        yy = y0 + h - h * k / 4
        d.text((x0 - 50, yy - 6), f"{v:.2f}s", fill="black")
    bw = w / len(names) * 0.6
    for i, b in enumerate(names):
        cx = x0 + (i + 0.5) * w / len(names)
        acc = 0.0
        for s in STAGES:
            v = rows[b]["timings"][s]
            ya, yb = y0 + h - h * (acc + v) / total_max, y0 + h - h * acc / total_max
            d.rectangle([cx - bw / 2, ya, cx + bw / 2, yb], fill=colors[s])
            acc += v
        d.text((cx - 20, y0 + h + 8), f"{b}", fill="black")
    d.text((x0, y0 + h + 30), "budget (visual tokens kept): stage seconds, median", fill="black")
    for j, s in enumerate(STAGES):
        d.rectangle([x0 + j * 90, y0 + h + 50, x0 + j * 90 + 12, y0 + h + 62], fill=colors[s])
        d.text((x0 + j * 90 + 16, y0 + h + 50), s, fill="black")
    # right: speed-ups
    x1 = 620
    bud = list(analysis["budgets"])
    vmax = max(max(v["ideal_speedup"], v["measured_prefill_speedup"], v["projected_speedup"])
               for v in analysis["budgets"].values()) * 1.1
    d.line([x1, y0 + h, x1 + w - 40, y0 + h], fill="black")
    d.line([x1, y0, x1, y0 + h], fill="black")
    for k in range(5):
        v = vmax * k / 4
        d.text((x1 - 40, y0 + h - h * k / 4 - 6), f"{v:.1f}x", fill="black")
    layers = next(iter(analysis["budgets"].values()))["projected_layers"]
    series = [("ideal L_full / L_m", "ideal_speedup", (150, 150, 150)),
              ("measured prefill", "measured_prefill_speedup", (60, 150, 90)),
              (f"projected {layers}-layer incl. probe+select", "projected_speedup", (200, 60, 60))]
    gw = (w - 40) / len(bud)
    for i, b in enumerate(bud):
        for j, (_, key, col) in enumerate(series):
            v = analysis["budgets"][b][key]
            xa = x1 + i * gw + 15 + j * (gw - 30) / 3
            d.rectangle([xa, y0 + h - h * v / vmax, xa + (gw - 30) / 3 - 4, y0 + h], fill=col)
            d.text((xa, y0 + h - h * v / vmax - 14), f"{v:.1f}", fill="black")
        d.text((x1 + i * gw + gw / 2 - 10, y0 + h + 8), b, fill="black")
    for j, (label, _, col) in enumerate(series):
        d.rectangle([x1, y0 + h + 30 + j * 16, x1 + 12, y0 + h + 42 + j * 16], fill=col)
        d.text((x1 + 16, y0 + h + 30 + j * 16), label, fill="black")
    img.save(path)


def genai_peer(ckpt: Path, engine: Path, workdir: Path, rows: dict, n: int, check, rounds: int,
               threads: int | None) -> dict:
    """--genai: our engine dir's decoder.onnx against onnxruntime-genai's model builder on the same checkpoint, the
    full-budget prompt's length and layout (text, the square grid, text; native M-RoPE positions), round-robin in
    two halves that create the two sessions in opposite orders, medians of prefill and decode per token
    (bench_decoder.Runner: one IOBinding loop for both). Time to first
    token of the whole request: ours pruned (this run's vision + embed + probe + select + prefill at `check`) and
    unpruned, against genai's unpruned pipeline = this run's vision and embed (genai has no Qwen3-VL vision model:
    its builder takes the text decoder only) + genai's prefill at full length."""
    import gc

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import numpy as np
    from bench_decoder import NEW_TOKENS, Embedder, Runner, genai_model, native_positions, summarize, text_config

    side = int(round(n ** 0.5))
    if side * side != n:
        raise SystemExit(f"--genai: expected a square grid of visual tokens, got n={n}")
    text = rows["full"]["prompt_tokens"] - n
    pre = 4  # <|im_start|> user \n <|vision_start|> before the grid; the question and the assistant turn after
    positions = native_positions(pre, side, text - pre)
    cfg, embed = text_config(ckpt), Embedder(ckpt)
    prompt = embed(np.random.default_rng(0).integers(0, 1000, positions.shape[1]))
    cap = positions.shape[1] + NEW_TOKENS
    threads = threads or os.cpu_count()
    paths = {"ours": engine / "decoder.onnx",
             "genai": genai_model(ckpt, workdir / f"{ckpt.name}-genai-fp32", "fp32")}
    out = {e: [] for e in paths}
    # Two halves with the sessions created in opposite orders: in an A/A run of two sessions of the SAME graph in one
    # process (round-robin, this 2-core VM) the one created second had a ~2% lower median decode (where each
    # session's weights land in memory), a bias one fixed creation order would hand one engine. Round 0 of each half
    # warms both up and is dropped.
    for half, order in enumerate((("ours", "genai"), ("genai", "ours"))):
        runners = {e: Runner(e, paths[e], cfg, cap, threads) for e in order}
        for r in range(1 + ((rounds + 1) // 2 if half == 0 else rounds // 2)):
            for e in (order if r % 2 == 0 else order[::-1]):
                res = runners[e].generate(embed, prompt, positions)
                if r:
                    out[e].append(res)
                print(f"genai comparison half {half} round {r} {e}: prefill {res['prefill_ms']:.0f} ms, "
                      f"decode {res['decode_ms']:.1f} ms/token", flush=True)
        del runners
        gc.collect()
    dec = summarize(out, "genai")
    dec["ours_vs_genai"].update(paired_decode_ratio(out))
    t_full, t_m = rows["full"]["timings"], rows[str(check)]["timings"]
    ttft = {"ours_pruned_s": sum(t_m[s] for s in STAGES),
            "ours_full_s": sum(t_full[s] for s in STAGES),
            "genai_full_s": t_full["vision"] + t_full["embed"] + dec["genai"]["prefill_ms"] / 1e3}
    ttft["ours_pruned_over_genai_full"] = ttft["ours_pruned_s"] / ttft["genai_full_s"]
    return {"prompt_tokens": int(positions.shape[1]), "check_budget": check, "decoder": dec, "ttft": ttft,
            "note": "genai's builder takes the text decoder only (no vision model; for Qwen3-VL no DeepStack input: "
                    "our decoder extras are bound to zeros here so both graphs compute the same function, "
                    "tokens_equal checks it); genai's TTFT borrows this run's vision and embed times"}


def paired_decode_ratio(out: dict) -> dict:
    """Ours / genai decode per token of each round (the two runs of a round are adjacent in time) and their median:
    the box's memory moves between a ~105 and a ~145 ms/token regime for minutes at a time, which the ratio of the
    two medians (decode_ratio) takes whole when it hits one engine's rounds more than the other's; a round's two
    runs mostly share one regime."""
    rounds = [o["decode_ms"] / g["decode_ms"] for o, g in zip(out["ours"], out["genai"])]
    return {"decode_ratio_rounds": rounds, "decode_ratio_paired_median": statistics.median(rounds)}


def plot_genai(path: Path, peer: dict, title: str) -> None:
    """Left: time to first token (ours pruned / ours full / genai full, stacked by stage); right: decoder prefill
    and decode per token, ours vs genai."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    t = peer["ttft"]
    a.bar(["ours\npruned", "ours\nfull", "genai\nfull"], [t["ours_pruned_s"], t["ours_full_s"], t["genai_full_s"]],
          color=["#3366cc", "#88aadd", "#999999"])
    for i, v in enumerate([t["ours_pruned_s"], t["ours_full_s"], t["genai_full_s"]]):
        a.text(i, v, f"{v:.2f} s", ha="center", va="bottom", fontsize=8)
    a.set_title(f"time to first token (budget {peer['check_budget']} vs full), s", fontsize=9)
    d = peer["decoder"]
    labels = ["prefill ms\n(full prompt)", "decode ms/token"]
    x = np.arange(2)
    for k, (e, col) in enumerate((("ours", "#3366cc"), ("genai", "#999999"))):
        vals = [d[e]["prefill_ms"], d[e]["decode_ms_per_token"]]
        b.bar(x + (k - 0.5) * 0.38, vals, 0.38, label=e, color=col)
        for xi, v in zip(x, vals):
            b.text(xi + (k - 0.5) * 0.38, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
    b.set_yscale("log")
    b.set_xticks(x, labels)
    b.legend(fontsize=8)
    r = d["ours_vs_genai"]
    b.set_title(f"decoder, {peer['prompt_tokens']} tokens: prefill {r['prefill_ratio']:.2f}x, decode "
                f"{r['decode_ratio']:.2f}x (per round {r['decode_ratio_paired_median']:.2f}x) genai", fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="llava-1.5-7b",
                   help="shape-real checkpoint preset and its budgets (default llava-1.5-7b)")
    p.add_argument("--workdir", type=Path, default=ROOT / "benchmarks" / "work", help="checkpoint/engine cache")
    p.add_argument("--layers", type=int, default=None,
                   help="decoder layers of the shape-real preset (default 2; qwen3.5-4b: 4 = 3 linear + 1 full)")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "fp16"), help="export precision (CPU: fp32)")
    p.add_argument("--provider", default="cpu", help="cpu, cuda or tensorrt")
    p.add_argument("--threads", type=int, default=None, help="ORT intra-op threads (default: all cores)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per budget (median)")
    p.add_argument("--new-tokens", type=int, default=8, help="answer length per run (decode timing)")
    p.add_argument("--method", default="coverpruner")
    p.add_argument("--selector", choices=("auto", "onnx", "numpy"), default="auto",
                   help="how the coverpruner method selects (Pipeline.load selector=; default auto: selector.onnx)")
    p.add_argument("--quick", action="store_true", help="1 repeat")
    p.add_argument("--tag", default=None, help="results file tag (default: <provider>)")
    p.add_argument("--genai", action="store_true",
                   help="after the budgets, the decoder against onnxruntime-genai's builder on the same checkpoint and "
                        "the time to first token against genai's unpruned pipeline (needs onnxruntime-genai)")
    p.add_argument("--genai-rounds", type=int, default=6, help="--genai: round-robin rounds (median; default 6)")
    p.add_argument("--engine", type=Path, default=None,
                   help="use this engine dir instead of building the shape-real preset (smoke runs)")
    args = p.parse_args(argv)
    repeats = 1 if args.quick else args.repeats

    preset = PRESETS[args.preset]
    args.layers = args.layers or preset.get("layers", 2)
    engine = args.engine or prepare(args.workdir, args.layers, args.dtype, args.preset)
    from PIL import Image

    from coverpruner.runtime import Pipeline

    pipe = Pipeline.load(engine, provider=args.provider, threads=args.threads, selector=args.selector)
    image = Image.open(ROOT / "coverpruner" / "assets" / "demo.png").convert("RGB")
    if preset["side"]:  # LLaVA-NeXT: a square 672 px image fills the 2x2 grid, nothing is unpadded; Qwen3-VL 1024 px
        image = image.resize((preset["side"], preset["side"]), Image.BICUBIC)
    prompt = "What is the color of the house next to the tree, and is there a stop sign in the picture?"
    images = [image] * preset.get("images", 1)
    for b in ("full", preset["check"]):  # warm-up: ORT arenas, first-run kernel selection
        ask(pipe, images, prompt, budget=b, method=args.method, max_new_tokens=args.new_tokens, ignore_eos=True,
            **preset["options"])
    rows = run_budgets(pipe, images, prompt, args.method, args.new_tokens, repeats, preset["budgets"],
                       preset["options"])
    n = rows["full"]["num_visual_tokens"]  # per request (dynamic-resolution families)
    print(f"engine {engine.name}: n={n}, layers={args.layers}, provider={args.provider}, threads={args.threads}",
          flush=True)
    for b, row in rows.items():
        med = row["timings"]
        print(f"budget {b:>4}: prefill {row['prefill_tokens']:4d} tok "
              + " ".join(f"{s}={med[s] * 1e3:8.1f}ms" for s in STAGES)
              + f" decode/token={med['decode_per_token'] * 1e3:7.1f}ms", flush=True)
    analysis = analyse(rows, n, args.layers, preset["check"], preset["real_layers"], preset.get("probe_check", True))
    if not preset.get("probe_check", True) and args.engine is None:  # a hybrid decoder: the proxy probe beside it
        analysis["proxy_probe"] = proxy_probe(engine, args.workdir / f"{args.preset}-{args.layers}l", image, prompt,
                                              args.method, preset["check"], args.new_tokens, repeats, pipe,
                                              preset["options"], analysis["per_layer_prefill_full_s"],
                                              rows[str(preset["check"])]["timings"]["prefill"] / args.layers,
                                              preset["real_layers"])
        print(f"probe + select at {preset['check']}: " + ", ".join(
            f"{k} {v['probe_plus_select_s'] * 1e3:.0f} ms = {v['over_full_length_layer']:.2f} layers, projected "
            f"{preset['real_layers']}-layer speed-up {v['projected_speedup']:.2f}x"
            for k, v in analysis["proxy_probe"].items() if isinstance(v, dict))
            + f"; kept overlap {analysis['proxy_probe']['kept_overlap']:.2f}", flush=True)
    selector_rows = (selector_overhead(pipe, image, preset["budgets"][1:], repeats)
                     if args.preset == "llava-next-7b" else None)
    print(f"T = {analysis['text_tokens']} non-candidate tokens (text, newline rows); per-layer prefill at full = "
          f"{analysis['per_layer_prefill_full_s'] * 1e3:.1f} ms")
    for b, a in analysis["budgets"].items():
        print(f"budget {b:>4}: prefill speed-up {a['measured_prefill_speedup']:5.2f}x vs ideal {a['ideal_speedup']:5.2f}x"
              f" ({a['fraction_of_ideal']:.2f} of ideal); probe+select = {a['probe_plus_select_over_layer']:.3f}"
              f" x one layer; projected {a['projected_layers']}-layer speed-up {a['projected_speedup']:5.2f}x"
              f" (ideal {a['ideal_speedup']:5.2f}x)")
    for k, ok in analysis["checks"].items():
        print(f"check {k}: {'PASS' if ok else 'FAIL'}")
    selector_backend, selector_at_n = pipe.selector_backend, pipe.selector_for(n)
    peer = None
    if args.genai:
        if args.engine is not None:
            raise SystemExit("--genai builds genai's model from the preset's checkpoint: leave --engine out")
        del pipe  # the two decoders below need the memory
        peer = genai_peer(args.workdir / f"{args.preset}-{args.layers}l", engine, args.workdir, rows, n,
                          preset["check"], args.genai_rounds, args.threads)
        r, t = peer["decoder"]["ours_vs_genai"], peer["ttft"]
        print(f"vs onnxruntime-genai ({peer['prompt_tokens']} tokens): prefill {r['prefill_ratio']:.3f}x, decode/token "
              f"{r['decode_ratio']:.3f}x (per round, median {r['decode_ratio_paired_median']:.3f}x), tokens equal {r['tokens_equal']}; TTFT ours at {preset['check']} "
              f"{t['ours_pruned_s']:.2f} s vs genai full {t['genai_full_s']:.2f} s "
              f"({t['ours_pruned_over_genai_full']:.3f}x)", flush=True)

    import onnxruntime

    tag = args.tag or args.provider + ("_quick" if args.quick else "")
    out_dir = ROOT / "benchmarks" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": "pipeline", "command": "python benchmarks/bench_pipeline.py " + " ".join(argv or sys.argv[1:]),
        "preset": args.preset if args.engine is None else str(args.engine), "layers": args.layers,
        "precision": args.dtype, "method": args.method, "options": preset["options"],
        "selector_backend": selector_backend, "selector_at_n": selector_at_n,
        "provider": args.provider, "threads": args.threads, "repeats": repeats, "new_tokens": args.new_tokens,
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
                    "onnxruntime": onnxruntime.__version__, "python": platform.python_version()},
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "num_visual_tokens": n, "timing_unit": "seconds (median)", "budgets": rows, "analysis": analysis,
        "selector_overhead": selector_rows, "onnxruntime_genai": peer,
    }
    name = f"{args.preset}-{args.layers}l" if args.engine is None else args.engine.name
    path = out_dir / f"pipeline_{name}_{tag}.json"
    path.write_text(json.dumps(result, indent=2))
    plot(path.with_suffix(".png"), rows, analysis,
         f"CoverPruner pipeline, {args.preset} widths, n={n}, {args.layers} decoder layers, {args.provider}, "
         f"{args.dtype}, {os.cpu_count()} CPUs (median of {repeats})")
    if peer is not None:
        plot_genai(path.with_name(path.stem + "_genai.png"), peer,
                   f"{args.preset} widths, {args.layers} layers, fp32, {os.cpu_count()} CPUs: ours vs onnxruntime-genai "
                   f"{__import__('onnxruntime_genai').__version__}")
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return 0 if all(analysis["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
