"""The cheap proxy probe (--probe proxy): layer 0's Gated DeltaNet query and key scored as a causal softmax.

The engine dir is a hard-linked copy of the ORT-form one with probe.onnx re-exported alone (--graphs probe --probe
proxy), as benchmarks/bench_pipeline.py compares the two. The reference reads the query and key HF's own layer 0
hands its chunked gated delta rule (a wrapper on the modeling module's torch_chunk_gated_delta_rule records the first
call's: after HF's input norm, in_proj_qkv, causal convolution and SiLU) and scores them itself in float64: L2 norm per head (HF's l2norm, eps
1e-6), 1/sqrt(dk), causal softmax of the instruction rows over the whole native sequence, mean over heads and rows at
the visual columns; the literal selector picks on that demand and generation is tests/families/qwen3_5/
hf_reference.py's greedy loop. A family without a proxy is refused before anything is written.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch", reason="the reference runs the PyTorch model")
PROMPT = "What is written on the sign?"
BUDGET, NEW = 16, 6


@pytest.fixture(scope="module")
def proxy_dir(qwen35_export_ort, qwen35_checkpoint, tmp_path_factory):
    from coverpruner.engine_dir import read_raw
    from coverpruner.export.exporter import ExportOptions, export_model

    out = tmp_path_factory.mktemp("qwen35_proxy") / "engine"
    shutil.copytree(qwen35_export_ort, out, copy_function=os.link)
    (out / "probe.onnx").unlink()
    export_model(qwen35_checkpoint, out, read_raw(out)["source_model"],
                 ExportOptions(dtype="fp32", graphs=("probe",), probe="proxy", progress=False))
    return out


def _proxy_demand(model, req) -> np.ndarray:
    """float64 [n]: the reference proxy demand from the query / key HF's layer 0 feeds its gated delta rule."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as modeling

    seen, rule = {}, modeling.torch_chunk_gated_delta_rule

    def record(query, key, *args, **kwargs):
        seen.setdefault("q", query)  # the first call is layer 0's: [1, L, Hk, dk] before the rule's own L2 norm
        seen.setdefault("k", key)
        return rule(query, key, *args, **kwargs)

    modeling.torch_chunk_gated_delta_rule = record  # the name HF's Gated DeltaNet forward calls
    try:
        with torch.no_grad():
            model(**req.inputs)
    finally:
        modeling.torch_chunk_gated_delta_rule = rule
    q, k = (seen[n][0].double().transpose(0, 1) for n in ("q", "k"))  # [Hk, L, dk]
    q, k = (x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6) for x in (q, k))
    rows = torch.from_numpy(req.instruction)
    scores = q[:, rows] @ k.transpose(1, 2) / np.sqrt(q.shape[-1])  # [Hk, T, L]
    scores = scores.masked_fill(torch.arange(k.shape[1])[None, :] > rows[:, None], float("-inf"))
    return torch.softmax(scores, -1)[:, :, torch.from_numpy(req.visual)].mean(dim=(0, 1)).numpy()


def test_proxy_probe_equals_its_reference(proxy_dir, qwen35_hf, qwen35_checkpoint):
    from coverpruner.engine_dir import read_raw
    from coverpruner.runtime import Pipeline
    from tests.families.qwen3_5 import hf_reference as ref
    from tests.families.qwen_common import sample_image

    assert read_raw(proxy_dir)["graphs"]["probe"]["kind"] == "proxy"
    assert read_raw(proxy_dir)["graphs"]["probe"]["layer"] == 0
    image = sample_image(5, (300, 250))
    req = ref.native_request(qwen35_hf, str(qwen35_checkpoint), image, PROMPT)
    demand = _proxy_demand(qwen35_hf, req)
    keep = ref.literal_coverage(req.features.numpy(), demand, BUDGET, 0.3)
    got = Pipeline.load(proxy_dir, threads=1).generate(image, PROMPT, budget=BUDGET, max_new_tokens=NEW)
    assert np.abs(got.relevance - demand).max() <= 1e-6  # float32 softmax over ~100 keys of scores within +-0.25
    assert got.kept_indices.tolist() == np.sort(keep).tolist()
    eos = set(qwen35_hf.generation_config.eos_token_id)
    assert got.token_ids == ref.pruned_generate(qwen35_hf, req, keep, NEW, eos)
    # a stand-in, not the exact demand: the first full-attention layer's softmax differs
    assert np.abs(ref.layer0_relevance(qwen35_hf, req) - demand).max() > 1e-3


def test_a_family_without_a_proxy_is_refused(builds, tmp_path, capsys):
    from coverpruner.export.cli import main

    out, checkpoint = tmp_path / "engine", builds.checkpoint("tiny")
    capsys.readouterr()  # what building the checkpoint printed
    code = main(["--model", str(checkpoint), "--output", str(out), "--probe", "proxy", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--probe proxy" in err[0] and "'llava'" in err[0]
    assert not out.exists()
