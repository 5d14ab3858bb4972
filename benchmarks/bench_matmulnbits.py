"""One 7B-sized MatMul (x [M, 4096] @ W [4096, 4096], W ~ N(0, 0.02)) on ONNX Runtime CPU: fp32 against
MatMulNBits int8 / int4 (block 32, onnxruntime's quantizer) with accuracy_level unset and 4 (int8 compute), for
one token (M = 1, decode) and a full LLaVA prompt (M = 604, prefill). Output error is relative to fp32.

Chose the ORT form's default accuracy_level (4). Light (~0.5 GB, seconds): no lock needed.

    python benchmarks/bench_matmulnbits.py
Writes benchmarks/results/matmulnbits_cpu.json.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
K = N = 4096
ROWS = (1, 604)


def _model() -> onnx.ModelProto:
    w = (np.random.default_rng(0).standard_normal((K, N)) * 0.02).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", K])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", N])],
                          [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 10
    return m


def _min_ms(sess, x, repeats=5) -> float:
    sess.run(None, {"x": x})
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        sess.run(None, {"x": x})
        times.append(time.perf_counter() - t)
    return min(times) * 1e3


def main() -> None:
    from coverpruner.export.quant.ort_nbits import quantize_graph_nbits

    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    base = _model()
    xs = {m: np.random.default_rng(m).standard_normal((m, K)).astype(np.float32) for m in ROWS}
    ref_sess = ort.InferenceSession(base.SerializeToString(), so, providers=["CPUExecutionProvider"])
    ref = {m: ref_sess.run(None, {"x": x})[0] for m, x in xs.items()}
    rows = [{"weights": "fp32", "accuracy_level": None, **{f"ms_m{m}": _min_ms(ref_sess, xs[m]) for m in ROWS}}]
    for bits in (8, 4):
        for level in (None, 4):
            q = quantize_graph_nbits(onnx.ModelProto.FromString(base.SerializeToString()), {"mm"}, bits, 32, level)
            sess = ort.InferenceSession(q.SerializeToString(), so, providers=["CPUExecutionProvider"])
            row = {"weights": f"int{bits}", "accuracy_level": level}
            for m, x in xs.items():
                row[f"ms_m{m}"] = _min_ms(sess, x)
                row[f"rel_err_m{m}"] = float(np.linalg.norm(sess.run(None, {"x": x})[0] - ref[m]) / np.linalg.norm(ref[m]))
            rows.append(row)
    for r in rows:
        print(r)
    out = ROOT / "benchmarks" / "results" / "matmulnbits_cpu.json"
    out.write_text(json.dumps({
        "benchmark": "matmulnbits", "command": "python benchmarks/bench_matmulnbits.py", "K": K, "N": N,
        "block_size": 32, "threads": 2, "timing": "min of 5 after one warm-up",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "onnxruntime": ort.__version__},
        "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
