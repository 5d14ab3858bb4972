"""Contract v4 proof: a family planted in a temporary package declares DeepStack-like decoder extras (two levels of
visual features added after decoder layers 0 and 1) and runs export -> Pipeline -> tokens equal to an independent
torch reference, with no file outside its package (tests/contract/planted_deepstack/, copied to tmp_path).

The reference is written here on the HF model: HF image features, HF eager layer-0 demand, the literal float64
selector of tests/literal_selection.py, its own pruned rows and compact positions (HF generate's defaults), its
own gather of the extras at the kept image rows, added by forward hooks on HF's decoder layers at prefill only.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from tests.contract.planting import image, want  # noqa: F401 - the planted tests' shared fixtures

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch", reason="the reference runs the PyTorch model")

PROMPT = "What is shown in this image?"
NEW = 8
BUDGET = 16
LEVELS = 2  # extras enter after decoder layers 0 and 1
PACKAGE = "planted_deepstack"  # its manifests name this family


@pytest.fixture(scope="module")
def planted(builds, tmp_path_factory):
    """(checkpoint dir with the extra heads, {form: engine dir}) exported with the planted family registered."""
    from tests.contract import planted_deepstack
    from tests.contract.planting import planted as plant

    root = tmp_path_factory.mktemp("planted")
    checkpoint = root / "checkpoint"
    shutil.copytree(builds.checkpoint("tiny"), checkpoint)
    d = 64  # the tiny preset's hidden size (the projector's output width)
    rng = np.random.default_rng(7)
    np.save(checkpoint / "deepstack_heads.npy", (rng.standard_normal((LEVELS, d, d)) / np.sqrt(d)).astype(np.float32))
    with plant(planted_deepstack, checkpoint, root) as exports:
        yield checkpoint, exports


def reference(checkpoint, image, with_extras: bool = True):
    """(new token ids, kept indices): HF LLaVA with the extras added after layers 0 and 1 at the kept image rows."""
    from tests.contract.planting import llava_request
    from tests.families.llava import hf_reference as ref
    from tests.literal_selection import coverage_reference

    model, ids, vpos, instr, feats, embeds = llava_request(checkpoint, image, PROMPT)
    image_id = model.config.image_token_id
    relevance = ref.hf_layer0_relevance(model, embeds, vpos.numpy(), instr)
    keep = coverage_reference(feats.numpy(), relevance, BUDGET, 0.3)  # ascending candidate indices
    heads = torch.from_numpy(np.load(checkpoint / "deepstack_heads.npy"))
    kept_rows = vpos[torch.from_numpy(keep)]
    rows = torch.sort(torch.cat([torch.nonzero(ids != image_id).flatten(), kept_rows])).values
    at = torch.isin(rows, kept_rows)  # where the kept image rows sit in the pruned sequence (native order)
    levels = []
    for k in range(LEVELS):
        level = torch.zeros(1, len(rows), feats.shape[1])
        level[0, at] = (feats @ heads[k].T)[torch.from_numpy(keep)]
        levels.append(level)

    hooks = []
    if with_extras:
        for k, layer in enumerate(model.model.language_model.layers[:LEVELS]):
            def add(module, args, out, level=levels[k]):
                hidden = out[0] if isinstance(out, tuple) else out
                if hidden.shape[1] != level.shape[1]:  # decode steps: one new row, no extras
                    return out
                return (hidden + level, *out[1:]) if isinstance(out, tuple) else hidden + level
            hooks.append(layer.register_forward_hook(add))
    try:
        with torch.no_grad():
            out = model.generate(inputs_embeds=embeds[:, rows], attention_mask=torch.ones(1, len(rows), dtype=torch.long),
                                 max_new_tokens=NEW, do_sample=False)
    finally:
        for h in hooks:
            h.remove()
    return out[0].tolist(), keep


def test_manifest_records_the_extras(planted):
    from coverpruner.engine_dir import load_manifest

    for path in planted[1].values():
        manifest = load_manifest(path, verify=False)
        assert manifest.family == PACKAGE
        assert manifest.graphs["decoder"].extras == (("visual_extra.0", 0), ("visual_extra.1", 1))
        inputs = {t.name: t.shape for t in manifest.graphs["decoder"].inputs}
        assert inputs["visual_extra.0"] == inputs["inputs_embeds"]
        assert [o.name for o in manifest.graphs["vision"].outputs] == ["image_features", "visual_extra.0",
                                                                      "visual_extra.1"]


def test_tensorrt_profiles_cover_the_extras(planted):
    """The standard form's extras sit on inputs_embeds' axes, so coverpruner-build gives them its profile."""
    from coverpruner.engine_dir import read_raw
    from coverpruner.engines.tensorrt import BuildOptions, axis_ranges, input_profile

    raw = read_raw(planted[1]["standard"])
    ranges = axis_ranges(raw, BuildOptions(max_context=128, max_batch=2))
    specs = {s["name"]: s for s in raw["graphs"]["decoder"]["inputs"]}
    want = input_profile("decoder", specs["inputs_embeds"], ranges)
    assert want["max"] == [2, 128, 64]
    for name in ("visual_extra.0", "visual_extra.1"):
        assert input_profile("decoder", specs[name], ranges) == want


@pytest.mark.parametrize("form", ["ort", "standard"])
def test_planted_family_equals_torch_reference(planted, image, want, form):
    from coverpruner.runtime import Pipeline

    tokens, keep = want
    pipe = Pipeline.load(planted[1][form], provider="cpu", threads=1, prefix_cache_mb=0)
    got = pipe.generate(image, PROMPT, budget=BUDGET, method="coverpruner", max_new_tokens=NEW)
    assert got.kept_indices.tolist() == keep.tolist()
    assert got.token_ids == tokens


def test_extras_change_the_answer(planted, image, want):
    """The extras are large enough to matter: without them the reference answers otherwise."""
    plain, keep = reference(planted[0], image, with_extras=False)
    assert keep.tolist() == want[1].tolist()  # the extras enter after layer 0: the selection is the same
    assert plain != want[0]


def test_prefix_cache_replays_the_extras(planted, image, want):
    """A second identical request restores its prefix from the cache (whose KV holds the extras' effect)."""
    from coverpruner.runtime import Pipeline

    pipe = Pipeline.load(planted[1]["ort"], provider="cpu", threads=1, prefix_cache_mb=16)
    first = pipe.generate(image, PROMPT, budget=BUDGET, method="coverpruner", max_new_tokens=NEW)
    again = pipe.generate(image, PROMPT, budget=BUDGET, method="coverpruner", max_new_tokens=NEW)
    assert again.cached_tokens > 0
    assert first.token_ids == again.token_ids == want[0]


def test_batched_decoding_feeds_the_extras(planted, image, want):
    """Continuous batching (ORT form) joins each request with its extras: the answer is the batch-1 answer."""
    from coverpruner.runtime import Pipeline

    pipe = Pipeline.load(planted[1]["ort"], provider="cpu", threads=1, prefix_cache_mb=0)
    kwargs = dict(image=image, prompt=PROMPT, budget=BUDGET, method="coverpruner", max_new_tokens=NEW)
    results = pipe.batch_generate([kwargs, {**kwargs, "prompt": "Describe it."}], max_batch=2)
    assert results[0].token_ids == want[0]


@pytest.mark.tensorrt
def test_tensorrt_rtx_builds_the_extras_decoder(planted, trt_rtx, tmp_path):
    """TensorRT-RTX (no GPU needed) builds the planted standard-form decoder; its profile covers the extras."""
    from coverpruner.engine_dir import read_raw
    from coverpruner.engines.tensorrt import BuildOptions, build_engine_dir

    work = tmp_path / "dir"
    shutil.copytree(planted[1]["standard"], work)
    build_engine_dir(work, BuildOptions(max_context=128, graphs=("decoder",)), trt_rtx)
    profile = read_raw(work)["tensorrt"]["engines"]["decoder"]["profile"]
    assert profile["visual_extra.0"] == profile["visual_extra.1"] == profile["inputs_embeds"]


@pytest.mark.gpu
@pytest.mark.tensorrt
def test_tensorrt_pipeline_equals_torch_reference(planted, image, want, tmp_path):
    """On a GPU, the TensorRT decoder session feeds the extras at prefill (zeros at decode): the same tokens."""
    from coverpruner.engines.cudart import device_problem
    from coverpruner.engines.tensorrt import BuildOptions, TensorRTBuildError, build_engine_dir, load_tensorrt
    from coverpruner.runtime import Pipeline

    problem = device_problem()
    if problem is not None:
        pytest.skip(f"no usable CUDA GPU: {problem}")
    try:
        trt = load_tensorrt()
    except TensorRTBuildError as exc:
        pytest.skip(str(exc))
    work = tmp_path / "dir"
    shutil.copytree(planted[1]["standard"], work)
    build_engine_dir(work, BuildOptions(budgets=(BUDGET,), max_context=256), trt)
    pipe = Pipeline.load(work, provider="tensorrt", prefix_cache_mb=0)
    got = pipe.generate(image, PROMPT, budget=BUDGET, method="coverpruner", max_new_tokens=NEW)
    assert got.kept_indices.tolist() == want[1].tolist()
    assert got.token_ids == want[0]
