"""Peak RSS and time of one attention over N tokens (16 heads x 80) in several ONNX forms on ONNX Runtime CPU.

The measurement behind the choice of the Qwen2.5-VL vision graph's full-attention form (docs/performance.md,
"Memory: Qwen2.5-VL 1008x1008"). One form per process (its own ru_maxrss); prints one line:

    for f in naive chunk8 chunk16 mha mha_bias att23 att23_mask; do python benchmarks/attention_forms.py $f 5184; done

Forms: naive (MatMul, scale, additive [N, N] mask, Softmax, MatMul), chunkK (K query blocks, no mask),
mha / mha_bias (com.microsoft MultiHeadAttention without / with an attention bias), att23 / att23_mask (opset-23
Attention). The error is against numpy on the first 256 queries.
"""
import resource
import sys
import time

import numpy as np
import onnxruntime as ort
from onnx import helper as h, TensorProto as T
form, N = sys.argv[1], int(sys.argv[2])
H, D = 16, 80
C = H * D
F = T.FLOAT
def vi(n, shape): return h.make_tensor_value_info(n, F, shape)
nodes, inputs, inits = [], [vi("q", [N, C]), vi("k", [N, C]), vi("v", [N, C])], []
opsets = [h.make_opsetid("", 18)]
if form == "naive":
    shp = h.make_tensor("shp", T.INT64, [3], [N, H, D]); inits.append(shp)
    for n in "qkv":
        nodes += [h.make_node("Reshape", [n, "shp"], [n + "r"]), h.make_node("Transpose", [n + "r"], [n + "t"], perm=[1, 0, 2])]
    nodes += [h.make_node("Transpose", ["kt"], ["ktt"], perm=[0, 2, 1]),
              h.make_node("MatMul", ["qt", "ktt"], ["s"]),
              h.make_node("Mul", ["s", "sc"], ["s2"]),
              h.make_node("Add", ["s2", "mask"], ["s3"]),
              h.make_node("Softmax", ["s3"], ["p"], axis=-1),
              h.make_node("MatMul", ["p", "vt"], ["o"]),
              h.make_node("Transpose", ["o"], ["ot"], perm=[1, 0, 2]),
              h.make_node("Reshape", ["ot", "oshp"], ["out"])]
    inits += [h.make_tensor("sc", F, [], [D ** -0.5]), h.make_tensor("oshp", T.INT64, [2], [N, C])]
    inputs.append(vi("mask", [N, N]))
elif form.startswith("chunk"):
    K = int(form[5:])
    shp = h.make_tensor("shp", T.INT64, [3], [N, H, D]); inits.append(shp)
    for n in "qkv":
        nodes += [h.make_node("Reshape", [n, "shp"], [n + "r"]), h.make_node("Transpose", [n + "r"], [n + "t"], perm=[1, 0, 2])]
    nodes += [h.make_node("Transpose", ["kt"], ["ktt"], perm=[0, 2, 1])]
    sizes = [N // K + (1 if i < N % K else 0) for i in range(K)]
    inits.append(h.make_tensor("splits", T.INT64, [K], sizes))
    nodes.append(h.make_node("Split", ["qt", "splits"], [f"qc{i}" for i in range(K)], axis=1))
    for i in range(K):
        nodes += [h.make_node("MatMul", [f"qc{i}", "ktt"], [f"s{i}"]),
                  h.make_node("Mul", [f"s{i}", "sc"], [f"s2{i}"]),
                  h.make_node("Softmax", [f"s2{i}"], [f"p{i}"], axis=-1),
                  h.make_node("MatMul", [f"p{i}", "vt"], [f"o{i}"])]
    nodes += [h.make_node("Concat", [f"o{i}" for i in range(K)], ["o"], axis=1),
              h.make_node("Transpose", ["o"], ["ot"], perm=[1, 0, 2]),
              h.make_node("Reshape", ["ot", "oshp"], ["out"])]
    inits += [h.make_tensor("sc", F, [], [D ** -0.5]), h.make_tensor("oshp", T.INT64, [2], [N, C])]
elif form.startswith("mha"):
    opsets.append(h.make_opsetid("com.microsoft", 1))
    shp = h.make_tensor("shp", T.INT64, [3], [1, N, C]); inits.append(shp)
    for n in "qkv":
        nodes.append(h.make_node("Reshape", [n, "shp"], [n + "3"]))
    ins = ["q3", "k3", "v3"]
    if form == "mha_bias":
        ins += ["", "", "bias"]; inputs.append(vi("bias", [1, 1, N, N]))
    nodes += [h.make_node("MultiHeadAttention", ins, ["o"], domain="com.microsoft", num_heads=H),
              h.make_node("Reshape", ["o", "oshp"], ["out"])]
    inits.append(h.make_tensor("oshp", T.INT64, [2], [N, C]))
elif form.startswith("att23"):
    opsets = [h.make_opsetid("", 23)]
    shp = h.make_tensor("shp", T.INT64, [3], [1, N, C]); inits.append(shp)
    for n in "qkv":
        nodes.append(h.make_node("Reshape", [n, "shp"], [n + "3"]))
    ins = ["q3", "k3", "v3"]
    if form == "att23_mask":
        ins += ["mask"]; inputs.append(vi("mask", [N, N]))
    nodes += [h.make_node("Attention", ins, ["o"], q_num_heads=H, kv_num_heads=H),
              h.make_node("Reshape", ["o", "oshp"], ["out"])]
    inits.append(h.make_tensor("oshp", T.INT64, [2], [N, C]))
g = h.make_graph(nodes, "a", inputs, [vi("out", [N, C])], initializer=inits)
m = h.make_model(g, opset_imports=opsets); m.ir_version = 10
so = ort.SessionOptions(); so.log_severity_level = 3
if len(sys.argv) > 3 and sys.argv[3] == "noarena": so.enable_cpu_mem_arena = False
s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
rng = np.random.default_rng(0)
feeds = {n: rng.standard_normal((N, C), dtype=np.float32) for n in "qkv"}
if form in ("naive", "att23_mask"): feeds["mask"] = np.zeros((N, N), np.float32)
if form == "mha_bias": feeds["bias"] = np.zeros((1, 1, N, N), np.float32)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
t0 = time.perf_counter(); (o,) = s.run(None, feeds); t = time.perf_counter() - t0
t0 = time.perf_counter(); (o,) = s.run(None, feeds); t2 = time.perf_counter() - t0
# reference
q, k, v = (feeds[n].reshape(N, H, D).transpose(1, 0, 2) for n in "qkv")
sc = q[:, :256] @ k.transpose(0, 2, 1) * D ** -0.5; sc = np.exp(sc - sc.max(-1, keepdims=True)); sc /= sc.sum(-1, keepdims=True)
ref = (sc @ v).transpose(1, 0, 2).reshape(256, C)
err = np.abs(o[:256] - ref).max()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
print(f"{form:10s} N={N} base {base:.2f} GiB peak {peak:.2f} GiB time {t:.2f}/{t2:.2f}s err {err:.2e}")
