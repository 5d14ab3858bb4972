"""Decoder graph against its peers, one process, round-robin, medians (issue 18, scope 5a).

Qwen2.5-VL-7B widths (coverpruner-make-checkpoint --preset qwen2.5-vl-7b --layers 2, random weights), a
1,320-token prompt with the native M-RoPE positions of a 1008x1008 image (36x36 merged grid between 15 text
tokens and 9 text tokens), then 16 greedy new tokens. Engines, fp32 and int4 (MatMulNBits, block 32,
symmetric, accuracy_level 4):
  ours   coverpruner/export/ortform + engines/rotary.py (GroupQueryAttention with rotary inside, host M-RoPE rows, packed QKV)
  genai  onnxruntime-genai's model builder (exclude_embeds=true, prune_lm_head=true; its MRotaryEmbedding)
Both graphs run on this onnxruntime through the same IOBinding loop with one preallocated KV buffer per layer
shared by past and present (genai's past_present_share_buffer), so the comparison is graph against graph.
Each round: prefill from an empty cache, then 16 decode steps; a precision's two engines alternate within a
round; the new tokens of both engines are compared (fp32: must be identical).
The int4 rows also give each engine's int4-vs-fp32 prefill logits difference and whether the two int4 graphs
hold the same 4-bit weights (both use onnxruntime's block quantizer), which explains the int4 token divergence.

llama.cpp (llama-cpp-python, its defaults: f16 KV cache; LLaVA-1.5-7B widths, 2 layers): the checkpoint's
language model written as an f32 GGUF by llama_gguf.py from the same DecoderWeights our ORT-form graph is
built from, and llama.cpp's own q4_0 of it (its q4_0 keeps output.weight at q6_K). The same 604 token ids
(ours: their rows of the same embedding table, positions 0..603), then 16 greedy tokens; fp32 against f32 and
int4 against q4_0, round-robin.

    python benchmarks/bench_decoder.py --workdir /tmp/bench_decoder --rounds 5      # both comparisons
    python benchmarks/bench_decoder.py --only llama --rounds 5                       # llama.cpp side only
    python benchmarks/bench_decoder.py --only genai --model qwen3-vl-8b --rounds 5   # Qwen3-VL-8B widths
    python benchmarks/bench_decoder.py --only genai --model qwen3.5-4b --rounds 5    # Qwen3.5-4B widths

--model qwen3-vl-8b: the same comparison at Qwen3-VL-8B widths (q/k norm, interleaved M-RoPE; a 1,048-token prompt
around a 32x32 grid). onnxruntime-genai 0.18's builder takes Qwen3-VL as its text decoder only, without DeepStack
inputs; our decoder's DeepStack inputs are bound to zeros, so both graphs compute the same function.
Writes benchmarks/results/decoder_peers_cpu.json and .png (--only genai / llama: decoder_genai_cpu.*,
decoder_llama_cpu.*; --model qwen3-vl-8b: decoder_genai_qwen3-vl-8b_cpu.*).

--model qwen3.5-4b: Qwen3.5-4B widths, 4 layers (3 Gated DeltaNet + 1 gated full-attention layer with a partial
rotary), a 1,048-token prompt around a 32x32 grid; genai 0.18's builder exports qwen3_5 natively (its
CausalConvWithState and LinearAttention contrib ops, which our ORT form uses too). Both graphs' conv and recurrent
states are bound in place like the KV buffers and zeroed before each prefill.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
PROMPT = (15, 36, 9)  # text tokens, image grid side (merged patches), text tokens after the image
#: --model: the shape-real preset both decoders are built from -> (its image grid side, decoder layers): Qwen2.5-VL-7B
#: at 1008x1008 (36 x 36 merged patches), Qwen3-VL-8B and Qwen3.5-4B at 1024x1024 (32 x 32); 2 layers, Qwen3.5-4B 4
#: (3 Gated DeltaNet layers + 1 full-attention layer, one group of its real 3:1 stack)
MODELS = {"qwen2.5-vl-7b": (36, 2), "qwen3-vl-8b": (32, 2), "qwen3.5-4b": (32, 4)}
NEW_TOKENS = 16
LLAVA_PROMPT = 604  # LLaVA-1.5: 576 image tokens + the chat template and a question


def native_positions(pre: int = PROMPT[0], side: int = PROMPT[1], post: int = PROMPT[2]) -> np.ndarray:
    """[3, pre + side^2 + post] int64 M-RoPE positions (T, H, W) of text + side x side image + text, as Qwen2.5-VL's
    and Qwen3-VL's get_rope_index for one image (default: 1320 tokens, a 36x36 grid)."""
    t = list(range(pre)); h = list(range(pre)); w = list(range(pre))
    for i in range(side * side):
        t.append(pre); h.append(pre + i // side); w.append(pre + i % side)
    nxt = pre + side
    for j in range(post):
        t.append(nxt + j); h.append(nxt + j); w.append(nxt + j)
    return np.array([t, h, w], dtype=np.int64)


def prepare(workdir: Path, engines: list[str], model: str = "qwen2.5-vl-7b") -> dict[str, Path]:
    """Checkpoint (the shape-real preset `model`, MODELS' layers) and the four decoder graphs (built once, reused)."""
    layers = MODELS[model][1]
    ckpt = workdir / f"{model}-{layers}l"
    if not (ckpt / "config.json").exists():
        from coverpruner.testing.checkpoints import write_checkpoint
        write_checkpoint(ckpt, preset=model, layers=layers, seed=0)
    prefix = "" if model == "qwen2.5-vl-7b" else f"{model}-"  # the Qwen2.5-VL graphs keep their old folder names
    paths = {"checkpoint": ckpt, **_ours(ckpt, workdir, f"{prefix}ours")}
    if "genai" in engines:
        for prec in ("fp32", "int4"):
            paths[f"genai-{prec}"] = genai_model(ckpt, workdir / f"{prefix}genai-{prec}", prec)
    return paths


def genai_model(ckpt: Path, out: Path, prec: str) -> Path:
    """onnxruntime-genai's model builder on `ckpt` (text decoder, embeddings as input, last-token logits) into
    `out` (built once, reused) -> its model.onnx."""
    if not (out / "model.onnx").exists():
        subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(ckpt), "-o", str(out),
                        "-p", prec, "-e", "cpu", "-c", str(out.with_name(out.name + "-cache")),
                        "--extra_options", "exclude_embeds=true", "prune_lm_head=true"], check=True)
    return out / "model.onnx"


class Embedder:
    """Rows of the checkpoint's embed_tokens (fp16 on disk) as float32 [1, S, hidden]."""

    def __init__(self, ckpt: Path):
        from safetensors import safe_open
        with safe_open(str(ckpt / "model.safetensors"), "np") as f:
            key = next(k for k in f.keys() if k.endswith("embed_tokens.weight"))
            self.table = f.get_tensor(key)

    def __call__(self, ids) -> np.ndarray:
        return self.table[np.asarray(ids)][None].astype(np.float32)


class Runner:
    """One graph, batch 1, preallocated KV [1, kvH, C, D] shared by past and present; greedy generation."""

    def __init__(self, kind: str, path: Path, cfg: dict, capacity: int, threads: int,
                 profile_prefix: str | None = None):
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        if profile_prefix is not None:  # ORT's profiler (profile_decoder_ops.py)
            so.enable_profiling = True
            so.profile_file_prefix = profile_prefix
        self.ort, self.kind, self.cfg, self.capacity = ort, kind, cfg, capacity
        self.sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        inputs = self.sess.get_inputs()
        shape = (1, cfg["kv_heads"], capacity, cfg["head_dim"])
        # the KV layers (every layer, or a hybrid decoder's attention layers) and the other states (a Gated DeltaNet
        # layer's conv and recurrent: ours past_key_values.N.conv, genai's past.N.conv), all bound in place
        kv = [i.name for i in inputs if i.name.startswith("past_key_values.") and i.name.endswith((".key", ".value"))]
        self.kv = {name: ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, np.float32)) for name in kv}
        self.states = {i.name: np.zeros((1, *i.shape[1:]), np.float32) for i in inputs
                       if i.name.startswith(("past_key_values.", "past.")) and i.name not in self.kv}
        # decoder extras (Qwen3-VL's DeepStack inputs, [1, S, hidden]): zeros, so that both graphs compute the same
        # function (genai's decoder has no such input); the adds cost the same whatever the values
        known = {"inputs_embeds", "seqlens_k", "total_sequence_length", "rotary_cos", "rotary_sin", "rotary_row",
                 "attention_mask", "position_ids"}
        self.extras = [i.name for i in inputs if i.name not in known and not i.name.startswith(("past_key_values.",
                                                                                                   "past."))]
        self.cos = np.zeros((capacity, cfg["rotary_dim"] // 2), np.float32)
        self.sin = np.zeros_like(self.cos)

    def step(self, embeds: np.ndarray, positions: np.ndarray, past: int) -> np.ndarray:
        """embeds [1, S, hidden] f32, positions [3, S] int64, past = tokens already cached -> logits [V]."""
        from coverpruner.engines.rotary import rotary_rows
        b = self.sess.io_binding()
        s = embeds.shape[1]
        b.bind_cpu_input("inputs_embeds", embeds)
        if self.kind == "ours":
            c, n = self.cfg, past + s
            rows = positions if c["mrope_section"] else positions[0]  # [3, S] M-RoPE or [S]
            self.cos[past:n], self.sin[past:n] = rotary_rows(rows, c["rotary_dim"], c["theta"], c["mrope_section"],
                                                             c["interleaved"])
            b.bind_cpu_input("seqlens_k", np.array([n - 1], np.int32))
            b.bind_cpu_input("total_sequence_length", np.array(n, np.int32))
            b.bind_cpu_input("rotary_cos", self.cos)
            b.bind_cpu_input("rotary_sin", self.sin)
            b.bind_cpu_input("rotary_row", np.array([[past + i for i in range(s)]], np.int64))
            for name in self.extras:
                b.bind_cpu_input(name, np.zeros_like(embeds))
        else:
            b.bind_cpu_input("attention_mask", np.ones((1, past + s), np.int64))
            b.bind_cpu_input("position_ids", np.ascontiguousarray(positions[:, None, :]))
        for name, value in self.kv.items():
            b.bind_ortvalue_input(name, value)
            b.bind_ortvalue_output("present." + name.split(".", 1)[1], value)
        for name, array in self.states.items():
            value = self.ort.OrtValue.ortvalue_from_numpy(array)
            b.bind_ortvalue_input(name, value)
            b.bind_ortvalue_output("present." + name.split(".", 1)[1], value)
        b.bind_output("logits")
        self.sess.run_with_iobinding(b)
        return b.get_outputs()[-1].numpy().reshape(-1)  # logits only, not the bound KV buffers

    def generate(self, embed: Embedder, prompt_embeds: np.ndarray, positions: np.ndarray) -> dict:
        """Prefill + NEW_TOKENS greedy steps; positions [R, S] continue at max + 1 (Qwen's next decode
        position; LLaVA's compact positions: S)."""
        for array in self.states.values():  # a new request starts from zero states (KV: its length says)
            array[:] = 0
        t0 = time.perf_counter()
        logits = self.step(prompt_embeds, positions, 0)
        prefill = time.perf_counter() - t0
        tokens, decode, n, nxt = [int(logits.argmax())], [], positions.shape[1], int(positions.max()) + 1
        first_logits = logits
        for k in range(NEW_TOKENS - 1):
            t0 = time.perf_counter()
            logits = self.step(embed([tokens[-1]]), np.full((len(positions), 1), nxt + k, np.int64), n + k)
            decode.append(time.perf_counter() - t0)
            tokens.append(int(logits.argmax()))
        return {"prefill_ms": prefill * 1e3, "decode_ms": float(np.mean(decode)) * 1e3, "tokens": tokens,
                "first_logits": first_logits}


def text_config(checkpoint: Path) -> dict:
    """The text decoder's dims and rope of a Qwen2.5-VL or LLaVA checkpoint's config.json (what the Runner
    needs; mrope_section None for 1-D rope)."""
    t = json.loads((checkpoint / "config.json").read_text())["text_config"]
    rope = t.get("rope_parameters") or t.get("rope_scaling") or {}
    head_dim = t.get("head_dim") or t["hidden_size"] // t["num_attention_heads"]
    return dict(layers=t["num_hidden_layers"], kv_heads=t["num_key_value_heads"], head_dim=head_dim,
                rotary_dim=int(head_dim * rope.get("partial_rotary_factor", 1.0)),  # Qwen3.5: a partial rotary
                theta=rope.get("rope_theta", t.get("rope_theta", 10000.0)), mrope_section=rope.get("mrope_section"),
                interleaved=bool(rope.get("mrope_interleaved", False)))


class LlamaCppRunner:
    """One GGUF through llama-cpp-python (its default context params but one prefill batch), greedy generation
    from token ids."""

    def __init__(self, path: Path, capacity: int, threads: int):
        import llama_cpp
        self.llm = llama_cpp.Llama(str(path), n_ctx=capacity, n_batch=capacity, n_ubatch=capacity,
                                   n_threads=threads, n_threads_batch=threads, verbose=False)

    def _logits(self) -> np.ndarray:
        return np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.llm.n_vocab(),)).copy()

    def generate(self, ids: list[int]) -> dict:
        self.llm.reset()  # the next eval drops the cached tokens from position 0
        t0 = time.perf_counter()
        self.llm.eval(ids)
        logits = self._logits()
        prefill = time.perf_counter() - t0
        tokens, decode, first_logits = [int(logits.argmax())], [], logits
        for _ in range(NEW_TOKENS - 1):
            t0 = time.perf_counter()
            self.llm.eval([tokens[-1]])
            logits = self._logits()
            decode.append(time.perf_counter() - t0)
            tokens.append(int(logits.argmax()))
        return {"prefill_ms": prefill * 1e3, "decode_ms": float(np.mean(decode)) * 1e3, "tokens": tokens,
                "first_logits": first_logits}


def prepare_ours_llava(workdir: Path) -> dict[str, Path]:
    """LLaVA-1.5-7B-width checkpoint (2 layers) and our ORT-form fp32 / int4 decoders of it (built once, reused)."""
    ckpt = workdir / "llava-1.5-7b-2l"
    if not (ckpt / "config.json").exists():
        from coverpruner.testing.checkpoints import write_checkpoint
        write_checkpoint(ckpt, preset="llava-1.5-7b", layers=2, seed=0)
    return {"checkpoint": ckpt, **_ours(ckpt, workdir, "ours-llava")}


def _ours(ckpt: Path, workdir: Path, prefix: str) -> dict[str, Path]:
    """{"ours-fp32", "ours-int4"}: our ORT-form decoders of ckpt under workdir/<prefix>-<prec>/ (built once)."""
    from coverpruner.export.ortform.decoder_graph import build_from_checkpoint

    paths = {}
    for prec in ("fp32", "int4"):
        path = workdir / f"{prefix}-{prec}" / "decoder.onnx"
        if not path.exists():
            build_from_checkpoint(ckpt, path, prec)
        paths[f"ours-{prec}"] = path
    return paths


def prepare_llama(workdir: Path) -> dict[str, Path]:
    """prepare_ours_llava and the f32 / q4_0 GGUFs of the same weights (built once, reused)."""
    from llama_gguf import quantize, write_llama_gguf

    paths = prepare_ours_llava(workdir)
    ckpt = paths["checkpoint"]
    f32 = workdir / "llama-f32.gguf"
    if not f32.exists():
        from coverpruner.families import family_for_model_type
        fam = family_for_model_type("llava")
        weights = fam.decoder_weights(fam.load_model(ckpt, "float32"))
        write_llama_gguf(weights, Embedder(ckpt).table.astype(np.float32), f32, 4096)
        del weights
    q4 = workdir / "llama-q4_0.gguf"
    if not q4.exists():
        quantize(f32, q4, "q4_0")
    paths["llama.cpp-fp32"], paths["llama.cpp-int4"] = f32, q4
    return paths


def run_llama(args) -> dict:
    """Ours vs llama.cpp on the LLaVA-1.5-7B-width language model: fp32 vs f32, int4 vs q4_0, round-robin."""
    paths = prepare_llama(args.workdir)
    cfg = text_config(paths["checkpoint"])
    embed = Embedder(paths["checkpoint"])
    ids = [int(i) for i in np.random.default_rng(0).integers(3, 1000, LLAVA_PROMPT)]
    prompt, positions = embed(ids), np.arange(LLAVA_PROMPT, dtype=np.int64)[None]
    capacity = LLAVA_PROMPT + NEW_TOKENS
    results, first = {}, {}
    for prec in ("fp32", "int4"):
        runners = {"ours": Runner("ours", paths[f"ours-{prec}"], cfg, capacity, args.threads),
                   "llama.cpp": LlamaCppRunner(paths[f"llama.cpp-{prec}"], capacity, args.threads)}
        calls = {"ours": lambda r: r.generate(embed, prompt, positions), "llama.cpp": lambda r: r.generate(ids)}
        rows = {e: [] for e in runners}
        for r in range(args.rounds):
            for e in (list(runners) if r % 2 == 0 else list(runners)[::-1]):
                rows[e].append(calls[e](runners[e]))
                print(f"llama {prec} round {r} {e}: prefill {rows[e][-1]['prefill_ms']:.0f} ms, "
                      f"decode {rows[e][-1]['decode_ms']:.1f} ms/token", flush=True)
        results[prec] = summarize(rows, "llama.cpp")
        first[prec] = {e: rows[e][0]["first_logits"] for e in rows}
        del runners
        gc.collect()
    # what each engine's 4-bit format moves the prefill logits by (ORT int4 block 32 vs q4_0 + q6_K lm_head)
    results["int4"]["int4_vs_fp32_prefill_logits_max_abs_diff"] = {
        e: float(np.abs(first["int4"][e] - first["fp32"][e]).max()) for e in first["fp32"]}
    results["int4"]["fp32_prefill_logits_max_abs"] = float(np.abs(first["fp32"]["ours"]).max())
    return {"checkpoint": "llava-1.5-7b preset, 2 decoder layers, random weights (same weights on both sides)",
            "prompt_tokens": LLAVA_PROMPT, "peer": f"llama-cpp-python {__import__('llama_cpp').__version__}, "
            "defaults (f16 KV cache); f32 GGUF and its q4_0 (output.weight q6_K)", "results": results}


def medians(rows: list[dict]) -> dict:
    """One engine's rounds -> median prefill ms and decode ms/token, the raw rounds, the first round's tokens."""
    return {"prefill_ms": float(np.median([x["prefill_ms"] for x in rows])),
            "decode_ms_per_token": float(np.median([x["decode_ms"] for x in rows])),
            "prefill_ms_rounds": [x["prefill_ms"] for x in rows], "decode_ms_rounds": [x["decode_ms"] for x in rows],
            "tokens": rows[0]["tokens"]}


def summarize(rows: dict, peer: str) -> dict:
    """Medians per engine and ours / peer ratios; the first round's tokens and prefill logits compared."""
    res = {e: medians(rows[e]) for e in rows}
    a, b = rows["ours"][0], rows[peer][0]
    res[f"ours_vs_{peer}"] = {
        "decode_ratio": res["ours"]["decode_ms_per_token"] / res[peer]["decode_ms_per_token"],
        "prefill_ratio": res["ours"]["prefill_ms"] / res[peer]["prefill_ms"],
        "tokens_equal": a["tokens"] == b["tokens"],
        "prefill_logits_max_abs_diff": float(np.abs(a["first_logits"] - b["first_logits"]).max()),
        "prefill_logits_max_abs": float(np.abs(a["first_logits"]).max())}
    return res


def same_int4_weights(ours: Path, genai: Path) -> dict:
    """Are layer 0's q_proj (None when it has none) and lm_head 4-bit blocks and scales byte-identical between our
    int4 graph (q is the first rows of the packed QKV) and genai's?"""
    import onnx
    from onnx import numpy_helper

    def load(path: Path, names: set[str]) -> dict:
        out = {}
        for t in onnx.load(str(path), load_external_data=False).graph.initializer:
            if t.name in names:
                onnx.external_data_helper.load_external_data_for_tensor(t, str(path.parent))
                out[t.name] = numpy_helper.to_array(t)
        return out

    g = load(genai, {"model.layers.0.attn.q_proj.MatMul.weight_Q4", "model.layers.0.attn.q_proj.MatMul.weight_scales",
                     "lm_head.MatMul.weight_Q4", "lm_head.MatMul.weight_scales"})
    o = load(ours, {"layers.0.qkv.qweight", "layers.0.qkv.scales", "lm_head.qweight", "lm_head.scales"})
    layer0 = None  # a hybrid decoder's layer 0 has no q_proj (a Gated DeltaNet layer)
    if "model.layers.0.attn.q_proj.MatMul.weight_Q4" in g and "layers.0.qkv.qweight" in o:
        gq, gs = g["model.layers.0.attn.q_proj.MatMul.weight_Q4"], g["model.layers.0.attn.q_proj.MatMul.weight_scales"]
        layer0 = bool(np.array_equal(gq, o["layers.0.qkv.qweight"][:len(gq)])
                      and np.array_equal(gs.reshape(-1), o["layers.0.qkv.scales"][:gs.size]))
    return {"layer0_q_proj": layer0,
            "lm_head": bool(np.array_equal(g["lm_head.MatMul.weight_Q4"].reshape(-1), o["lm_head.qweight"].reshape(-1))
                            and np.array_equal(g["lm_head.MatMul.weight_scales"].reshape(-1), o["lm_head.scales"]))}


def run(args) -> dict:
    """Ours vs onnxruntime-genai on the --model preset's decoder widths (MODELS' layers), fp32 and int4,
    round-robin."""
    engines = ["ours"]
    skipped = {}
    if importlib.util.find_spec("onnxruntime_genai") is None:
        skipped["onnxruntime-genai"] = "not installed (pip install onnxruntime-genai)"
    else:
        engines.append("genai")
    paths = prepare(args.workdir, engines, args.model)
    cfg = text_config(paths["checkpoint"])
    embed = Embedder(paths["checkpoint"])
    positions = native_positions(PROMPT[0], MODELS[args.model][0], PROMPT[2])
    ids = np.random.default_rng(0).integers(0, 1000, positions.shape[1])
    prompt = embed(ids)
    capacity = positions.shape[1] + NEW_TOKENS
    results, first = {}, {}
    for prec in ("fp32", "int4"):
        runners = {e: Runner(e, paths[f"{e}-{prec}"], cfg, capacity, args.threads) for e in engines}
        rows = {e: [] for e in engines}
        for r in range(args.rounds):
            order = engines if r % 2 == 0 else engines[::-1]
            for e in order:
                rows[e].append(runners[e].generate(embed, prompt, positions))
                print(f"{prec} round {r} {e}: prefill {rows[e][-1]['prefill_ms']:.0f} ms, "
                      f"decode {rows[e][-1]['decode_ms']:.1f} ms/token", flush=True)
        first[prec] = {e: rows[e][0]["first_logits"] for e in engines}
        results[prec] = summarize(rows, "genai") if "genai" in engines else {"ours": medians(rows["ours"])}
        del runners
        gc.collect()
    # int4 against fp32 per engine: what 4-bit weights + int8 activations (accuracy_level 4) move the logits by
    results["int4"]["int4_vs_fp32_prefill_logits_max_abs_diff"] = {
        e: float(np.abs(first["int4"][e] - first["fp32"][e]).max()) for e in engines}
    results["int4"]["fp32_prefill_logits_max_abs"] = float(np.abs(first["fp32"]["ours"]).max())
    if "genai" in engines:
        results["int4"]["same_4bit_weights_as_genai"] = same_int4_weights(paths["ours-int4"], paths["genai-int4"])
    return {"checkpoint": f"{args.model} preset, {MODELS[args.model][1]} decoder layers, random weights",
            "prompt_tokens": int(positions.shape[1]), "results": results, "skipped": skipped,
            "onnxruntime_genai": getattr(__import__("onnxruntime_genai"), "__version__", None)
            if "genai" in engines else None}


def platform_info() -> dict:
    return {"machine": platform.machine(), "cpus": os.cpu_count(), "onnxruntime": __import__("onnxruntime").__version__,
            # other jobs on the cores skew absolutes; ratios less (round-robin)
            "load_average_1min": os.getloadavg()[0]}


def plot(data: dict, png: Path) -> None:
    """Decode ms/token and prefill ms, bars per precision and engine: one row per comparison in the run."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    parts = [(k, data[k]) for k in ("genai", "llama_cpp") if k in data]
    fig, axes = plt.subplots(len(parts), 2, figsize=(10, 4 * len(parts)), squeeze=False)
    for row, (key, part) in zip(axes, parts):
        peer = "genai" if key == "genai" else "llama.cpp"
        for ax, field, title in ((row[0], "decode_ms_per_token", "decode, ms/token"),
                                 (row[1], "prefill_ms", f"prefill, ms ({part['prompt_tokens']:,} tokens)")):
            labels, values = [], []
            for prec, res in part["results"].items():
                for e in ("ours", peer):
                    if e in res:
                        name = {"fp32": "f32", "int4": "q4_0"}[prec] if e == "llama.cpp" else prec
                        labels.append(f"{e}\n{name}"); values.append(res[e][field])
            ax.bar(labels, values, color=["#3366cc" if lab.startswith("ours") else "#999999" for lab in labels])
            ax.set_title(f"{part['checkpoint'].split(',')[0]}: {title}", fontsize=9)
            for i, v in enumerate(values):
                ax.text(i, v, f"{v:.1f}", ha="center", va="bottom", fontsize=8)
    fig.suptitle(f"few-layer decoders at real widths, {data['threads']} threads, ORT CPU: ours (ORT form) vs peers; "
                 f"load {data['platform']['load_average_1min']:.1f}", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", type=Path, default=Path("/tmp/bench_decoder"),
                   help="checkpoints and built graphs (reused when present)")
    p.add_argument("--rounds", type=int, default=5, help="round-robin rounds (median reported)")
    p.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads (llama.cpp: n_threads)")
    p.add_argument("--only", choices=("genai", "llama"), default=None, help="run one of the two comparisons")
    p.add_argument("--model", choices=sorted(MODELS), default="qwen2.5-vl-7b",
                   help="preset of the genai comparison (default qwen2.5-vl-7b; qwen3-vl-8b: ours with its DeepStack "
                        "inputs bound to zeros, genai's text decoder, which has none)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results",
                   help="folder for the JSON and PNG")
    args = p.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()[0]
    data = {"benchmark": "bench_decoder", "new_tokens": NEW_TOKENS, "rounds": args.rounds, "threads": args.threads,
            "command": "python benchmarks/bench_decoder.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    if args.only != "llama":
        data["genai"] = run(args)
    if args.only != "genai":
        if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("gguf") is None:
            data["skipped_llama_cpp"] = "llama-cpp-python or gguf not installed (pip install llama-cpp-python gguf)"
        else:
            data["llama_cpp"] = run_llama(args)
    data["platform"] = {**platform_info(), "load_average_1min_at_start": load0}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = {"llama": "decoder_llama_cpu", "genai": "decoder_genai_cpu"}.get(args.only, "decoder_peers_cpu")
    if args.model != "qwen2.5-vl-7b":
        stem = stem.replace("_cpu", f"_{args.model}_cpu")
    tmp = args.out / f"{stem}.json.tmp"
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(args.out / f"{stem}.json")
    if "genai" in data or "llama_cpp" in data:
        plot(data, args.out / f"{stem}.png")
    for key in ("genai", "llama_cpp"):
        for prec, res in data.get(key, {}).get("results", {}).items():
            print(key, prec, {k: v for k, v in res.items() if k.startswith("ours_vs") or "int4" in k or "same" in k})
    return 0


if __name__ == "__main__":
    sys.exit(main())
