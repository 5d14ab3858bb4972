"""A tiny hand-built ONNX "decoder" with the engine-dir decoder contract, and its numpy twin.

Its logits depend on every cached key/value, the attention mask length and the position ids, so
a cache that loses, duplicates or misorders entries gives different logits than the twin.
"""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def build(path, layers=2, d=8, heads=2, hd=4, vocab=11, seed=0):
    rng = np.random.default_rng(seed)
    w = {f"wk{i}": rng.standard_normal((d, heads * hd)).astype(np.float32) for i in range(layers)}
    w.update({f"wv{i}": rng.standard_normal((d, heads * hd)).astype(np.float32) for i in range(layers)})
    w["wo"] = rng.standard_normal((heads * hd, vocab)).astype(np.float32)
    w["shape_new"] = np.array([1, -1, heads, hd], np.int64)
    w["axes1"] = np.array([1], np.int64)
    w["last"] = np.array([-1], np.int64)
    w["big"] = np.array([2**62], np.int64)
    nodes, inputs, outputs = [], [], []
    f = TensorProto.FLOAT
    inputs += [helper.make_tensor_value_info("inputs_embeds", f, [1, "s", d]),
               helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, "t"]),
               helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, "s"])]
    acc = None
    for i in range(layers):
        for kv in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kv}", f, [1, heads, "p", hd]))
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{kv}", f, [1, heads, "t", hd]))
            wn = f"w{kv[0]}{i}"
            nodes += [helper.make_node("MatMul", ["inputs_embeds", wn], [f"{kv}{i}_flat"]),
                      helper.make_node("Reshape", [f"{kv}{i}_flat", "shape_new"], [f"{kv}{i}_bshd"]),
                      helper.make_node("Transpose", [f"{kv}{i}_bshd"], [f"{kv}{i}_new"], perm=[0, 2, 1, 3]),
                      helper.make_node("Concat", [f"past_key_values.{i}.{kv}", f"{kv}{i}_new"],
                                       [f"present.{i}.{kv}"], axis=2),
                      # cumulative sum over the cache positions weights later entries more
                      helper.make_node("CumSum", [f"present.{i}.{kv}", "two"], [f"{kv}{i}_cs"]),
                      helper.make_node("ReduceSum", [f"{kv}{i}_cs", "axes2"], [f"{kv}{i}_r"], keepdims=0)]
            term = f"{kv}{i}_r"
            if acc is None:
                acc = term
            else:
                nodes.append(helper.make_node("Add", [acc, term], [f"acc_{i}_{kv}"]))
                acc = f"acc_{i}_{kv}"
    w["two"] = np.array(2, np.int64)
    w["axes2"] = np.array([2], np.int64)
    w["shape_hd"] = np.array([1, heads * hd], np.int64)
    nodes += [helper.make_node("Reshape", [acc, "shape_hd"], ["feat"]),
              helper.make_node("MatMul", ["feat", "wo"], ["lg0"]),
              helper.make_node("ReduceSum", ["attention_mask"], ["msum"], keepdims=0),
              helper.make_node("Slice", ["position_ids", "last", "big", "axes1"], ["plast"]),
              helper.make_node("Cast", ["msum"], ["msumf"], to=f),
              helper.make_node("Cast", ["plast"], ["plastf"], to=f),
              helper.make_node("Mul", ["msumf", "plastf"], ["mp"]),
              helper.make_node("Add", ["lg0", "mp"], ["lg1"]),
              helper.make_node("Unsqueeze", ["lg1", "axes1"], ["logits"])]
    outputs.insert(0, helper.make_tensor_value_info("logits", f, [1, 1, vocab]))
    graph = helper.make_graph(nodes, "fake_decoder", inputs, outputs,
                              [numpy_helper.from_array(v, k) for k, v in w.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return w


def reference_logits(w, layers, heads, hd, embeds_so_far, positions_so_far):
    """Numpy twin: logits after feeding all tokens at once (embeds [T,d], positions [T])."""
    acc = 0
    for i in range(layers):
        for kv in ("k", "v"):
            x = (embeds_so_far @ w[f"w{kv}{i}"]).reshape(-1, heads, hd).transpose(1, 0, 2)  # [H,T,hd]
            acc = acc + np.cumsum(x, axis=1).sum(axis=1)
    return acc.reshape(-1) @ w["wo"] + len(embeds_so_far) * positions_so_far[-1]
