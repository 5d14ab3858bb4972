"""Qwen2.5-VL's facts for the family matrix (tests/matrix/): what the generic tests ask of this family."""

from __future__ import annotations

# candidates of assets/demo.png (tests/matrix/test_pipeline_api.py)
DEMO_CANDIDATES = 140
# M-RoPE: kept rows keep their native positions and decoding continues
# after the unpruned prompt's last position, so pruning frees no context
PRUNING_FREES_CONTEXT = False
# generate options under which budget >= n keeps every visual row (every visual row is a candidate)
KEEP_ALL_OPTIONS: dict = {}

TRT_BUILD_ARGS = ["--budgets", "16,64", "--max-context", "512"]


def check_trt_profiles(section: dict, manifest: dict) -> None:
    """Dynamic patch / window / visual-token axes (the manifest's family axes) and 3-row M-RoPE positions."""
    vision_axes = {a for spec in manifest["graphs"]["vision"]["inputs"] for a in spec["shape"] if isinstance(a, str)}
    assert vision_axes == {"num_patches", "num_visual", "num_windows", "window_slots"}
    vision = section["engines"]["vision"]["profile"]
    # tiny preset: up to 160 visual tokens = 640 patches; windows of 3x3 merged tokens = 36 patches
    assert vision["pixel_values"]["max"] == [640, 1176] and vision["window_gather"]["max"] == [160, 36]
    assert section["engines"]["decoder"]["profile"]["position_ids"]["max"] == [3, 1, 512]


# --- "pipeline == independent HF reference" (tests/matrix/test_pipeline_reference.py) ---
# The reference (tests/families/qwen2_5_vl/hf_reference.py): HF processor layout, HF get_rope_index positions,
# HF eager layer-0 demand, literal float64 selectors, a greedy loop over the HF model with explicit 3-D positions
# (pruned rows keep their native positions).
NEW = 10
PROMPT = "What is written on the sign next to the red car?"
PIPELINE_CASES = ["300x250"]


def pipeline_case(family, request, case_id: str):
    """(PIL image, prompt, generate options) of one case."""
    from tests.families.qwen2_5_vl.fixtures import sample_image

    return sample_image(5, (300, 250)), PROMPT, {}


def _native(family, request, case_id: str):
    from tests.families.qwen2_5_vl import hf_reference as ref

    image, prompt, _ = pipeline_case(family, request, case_id)
    return family.memo(("native", case_id), lambda: ref.native_request(
        request.getfixturevalue("qwen_hf"), request.getfixturevalue("qwen_checkpoint"), image, prompt))


def _eos(model) -> set[int]:
    return set(model.generation_config.eos_token_id)  # what HF generate stops on


def hf_full(family, request, case_id: str) -> list[int]:
    """HF generate on the processor's inputs (greedy, no repetition penalty)."""
    import torch

    model, req = request.getfixturevalue("qwen_hf"), _native(family, request, case_id)
    with torch.no_grad():
        out = model.generate(**req.inputs, max_new_tokens=NEW, do_sample=False, repetition_penalty=1.0)
    return out[0, req.inputs["input_ids"].shape[1]:].tolist()


def hf_pruned(family, request, case_id: str, budget: int, method: str):
    """(new token ids, kept indices, demand or None, the native request)."""
    from tests.families.qwen2_5_vl import hf_reference as ref

    model, req = request.getfixturevalue("qwen_hf"), _native(family, request, case_id)
    keep = ref.select(model, req, method, budget)
    relevance = ref.layer0_relevance(model, req) if method == "coverpruner" else None
    return ref.pruned_generate(model, req, keep, NEW, _eos(model)), keep, relevance, req


def check_full(family, request, case_id: str, got, want) -> None:
    import numpy as np

    model, req = request.getfixturevalue("qwen_hf"), _native(family, request, case_id)
    assert got.num_visual_tokens == req.visual.size == 99 and got.prompt_tokens == req.embeds.shape[1]
    # it stops on the same ids as HF generate (generation_config: <|im_end|> and <|endoftext|>)
    assert set(np.atleast_1d(family.pipe.manifest.token_ids["eos_token_id"]).tolist()) == \
        set(model.generation_config.eos_token_id)


def check_pruned(family, request, case_id: str, got, ref_out, budget: int) -> None:
    """Pruned == the full model with the dropped columns masked out (M-RoPE positions kept)."""
    from tests.families.qwen2_5_vl import hf_reference as ref

    model = request.getfixturevalue("qwen_hf")
    _, keep, _, req = ref_out
    assert got.prefill_tokens == req.embeds.shape[1] - (req.visual.size - budget)
    assert got.token_ids == ref.masked_generate(model, req, keep, NEW, _eos(model))
