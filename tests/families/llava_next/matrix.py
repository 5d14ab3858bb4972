"""LLaVA-NeXT's facts for the family matrix (tests/matrix/): what the generic tests ask of this family."""

from __future__ import annotations

# candidates of assets/demo.png (tests/matrix/test_pipeline_api.py)
DEMO_CANDIDATES = 156
# compact positions: a pruned prompt uses fewer positions
PRUNING_FREES_CONTEXT = True
# generate options under which budget >= n keeps every visual row: under the default "drop" a budget >= n still
# drops the image_newline rows (prefill 167 of 177 rows for the demo image), so its answer may leave the full one
# after a few tokens
KEEP_ALL_OPTIONS: dict = {"newline_policy": "keep"}

TRT_BUILD_ARGS = ["--budgets", "16,64", "--max-context", "256"]


def check_trt_profiles(section: dict, manifest: dict) -> None:
    """The vision engine runs over 1-5 tiles of 84 px (the manifest's `axes.tiles`); 180 candidates at most."""
    engines = section["engines"]
    assert engines["vision"]["profile"]["pixel_values"] == {"min": [1, 3, 84, 84], "opt": [5, 3, 84, 84],
                                                            "max": [5, 3, 84, 84]}
    n = manifest["visual"]["max_visual_tokens"]
    assert n == 180 and engines["probe"]["profile"]["visual_positions"]["max"] == [n]
    assert engines["selector"]["profile"]["image_features"]["max"][0] == n


# --- "pipeline == independent HF reference" (tests/matrix/test_pipeline_reference.py) ---
# The reference (tests/families/llava_next/hf_reference.py): HF processor (tiling) -> HF get_image_features
# (HF packing; newline rows found by value) -> HF eager layer-0 demand -> literal float64 selectors -> pruned
# inputs_embeds (compact positions) -> HF generate.
NEW = 8
# (width, height, prompt): portrait 2x2 grid, landscape 1x3 grid, tall 3x1 grid; prompts for which the
# tiny random model's unpruned answer is not one repeated token. Each under both newline policies.
_IMAGES = {f"{w}x{h}": (w, h, p) for w, h, p in [(200, 240, "What is on the left of the picture?"),
                                                 (300, 120, "What is on the left of the picture?"),
                                                 (90, 260, "Describe the image.")]}
PIPELINE_CASES = [f"{size}-{policy}" for size in _IMAGES for policy in ("drop", "keep")]


def pipeline_case(family, request, case_id: str):
    """(PIL image, prompt, generate options) of one case."""
    from tests.families.llava_next.fixtures import smooth_image

    size, policy = case_id.rsplit("-", 1)
    w, h, prompt = _IMAGES[size]
    return smooth_image(w, h, seed=w), prompt, {"newline_policy": policy}


def _native(family, request, case_id: str):
    from tests.families.llava_next import hf_reference as ref

    size = case_id.rsplit("-", 1)[0]
    image, prompt, _ = pipeline_case(family, request, case_id)
    return family.memo(("native", size), lambda: ref.native_request(
        request.getfixturevalue("next_hf_model"), request.getfixturevalue("next_processor"), image, prompt))


def hf_full(family, request, case_id: str) -> list[int]:
    """HF generate on the processor's inputs (every row: both policies give the same answer at full budget)."""
    from tests.families.llava_next import hf_reference as ref

    req = _native(family, request, case_id)
    size = case_id.rsplit("-", 1)[0]
    return family.memo(("full", size), lambda: ref.full_generate(request.getfixturevalue("next_hf_model"), req, NEW))


def hf_pruned(family, request, case_id: str, budget: int, method: str):
    """(new token ids, kept candidate indices, demand float64 [n] or None)."""
    from tests.families.llava_next import hf_reference as ref

    req = _native(family, request, case_id)
    policy = case_id.rsplit("-", 1)[1]
    assert budget < int((~req.newline).sum())
    return ref.pruned_generate(request.getfixturevalue("next_hf_model"), request.getfixturevalue("next_eager_model"),
                               req, budget, method, policy, NEW)


def check_full(family, request, case_id: str, got, want) -> None:
    req = _native(family, request, case_id)
    n = int((~req.newline).sum())
    assert got.num_visual_tokens == n and got.kept_indices.tolist() == list(range(n))
    assert got.prefill_tokens == got.prompt_tokens == len(req.ids)


def check_pruned(family, request, case_id: str, got, ref_out, budget: int) -> None:
    """Prefill = text + kept candidates (+ every newline row under "keep")."""
    req = _native(family, request, case_id)
    n, newlines = int((~req.newline).sum()), int(req.newline.sum())
    extra = newlines if case_id.endswith("-keep") else 0
    assert got.prefill_tokens == len(req.ids) - n - newlines + budget + extra
