"""Teacher-forced logits of a decoder graph, and how close a quantized decoder's are to the float one's.

Teacher forcing: every sequence is fed as given (no sampling), a prefill of the first `prefill` tokens and
then one decode step per remaining token through the KV cache, so both graph paths are compared and the
logits at every position from prefill-1 on are collected.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def teacher_forced_logits(decoder: Path, embeds: np.ndarray, num_layers: int, num_kv_heads: int,
                          head_dim: int, prefill: int = 8, threads: int = 1) -> np.ndarray:
    """embeds float [S, L, d] (dtype of the graph) -> logits float32 [S, L - prefill + 1, V].

    Runs `decoder` (an engine dir's decoder.onnx) on ONNX Runtime CPU, one sequence at a time.
    """
    import onnxruntime as ort

    from coverpruner.engine_dir import past_names

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(decoder), so, providers=["CPUExecutionProvider"])
    out_names = [o.name for o in sess.get_outputs()]
    rows = []
    for seq in embeds:
        past = {name: np.zeros((1, num_kv_heads, 0, head_dim), embeds.dtype) for name in past_names(num_layers)}
        logits, start = [], 0
        for stop in [prefill, *range(prefill + 1, len(seq) + 1)]:
            feeds = {"inputs_embeds": seq[None, start:stop], "attention_mask": np.ones((1, stop), np.int64),
                     "position_ids": np.arange(start, stop, dtype=np.int64)[None], **past}
            outs = dict(zip(out_names, sess.run(None, feeds)))
            logits.append(outs["logits"][0, -1].astype(np.float32))
            past = {k.replace("present", "past_key_values"): v for k, v in outs.items() if k.startswith("present")}
            start = stop
        rows.append(np.stack(logits))
    return np.stack(rows)


def logit_agreement(reference: np.ndarray, other: np.ndarray) -> dict:
    """Closeness of `other` to `reference` (both [..., V] float32), per position then summarised.

    cosine: cosine similarity of the logit vectors; rel_err: ||other - ref|| / ||ref||; top1: fraction of
    positions whose argmax agrees; max_abs_err: largest |other - ref| over all logits; disagree_margins: the
    reference's top-1 minus top-2 logit at positions whose argmax differs (a near-tie explains a flip).
    """
    ref = reference.reshape(-1, reference.shape[-1]).astype(np.float64)
    oth = other.reshape(-1, other.shape[-1]).astype(np.float64)
    cos = (ref * oth).sum(1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(oth, axis=1))
    rel = np.linalg.norm(oth - ref, axis=1) / np.linalg.norm(ref, axis=1)
    agree = ref.argmax(1) == oth.argmax(1)
    top2 = np.sort(ref, axis=1)[:, -2:]
    margins = (top2[:, 1] - top2[:, 0])[~agree]
    return {"positions": int(len(ref)), "cosine_mean": float(cos.mean()), "cosine_min": float(cos.min()),
            "rel_err_mean": float(rel.mean()), "rel_err_max": float(rel.max()), "top1": float(agree.mean()),
            "max_abs_err": float(np.abs(oth - ref).max()), "disagree_margins": [float(m) for m in margins]}
