"""LLaVA-NeXT's facts for the family matrix (tests/matrix/): what the generic tests ask of this family."""

from __future__ import annotations

# the tiny preset (coverpruner/testing/presets.py) the matrix builds for this family
PRESET = "llava-next-tiny"

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


# --- "every graph vs HF" (tests/matrix/test_graph_parity.py) ---
# vision over the tile axis with our packing == HF get_image_features (pack_image_features included); tile counts
# 5, 4, 3, 4 (2x2, 1x3, 1x2, 3x1 grids): square / landscape / tiny / extreme portrait. The other graphs on one real
# NeXT request (HF's processor and packed features, hf_reference.native_request).
VISION_SIZES = [(200, 240), (500, 120), (20, 30), (50, 10000)]
GRAPH_CASES = [f"vision-{w}x{h}" for w, h in VISION_SIZES] + [
    "embed-request", "probe-request", "selector-64", "selector-16", "selector-500"]
DECODER_CASES = ["prefill-8-steps"]
GRAPH_PROMPT = "What is on the left of the picture?"


def _graph_request(family, request):
    from tests.families.llava_next import hf_reference as ref
    from tests.families.llava_next.fixtures import smooth_image

    return family.memo("graph_request", lambda: ref.native_request(
        request.getfixturevalue("next_hf_model"), request.getfixturevalue("next_processor"),
        smooth_image(300, 120, seed=4), GRAPH_PROMPT))


def graph_case(family, request, case_id: str):
    import numpy as np
    import torch

    from tests.families.llava_next import hf_reference as ref
    from tests.family_matrix import GraphCase

    model = request.getfixturevalue("next_hf_model")
    if case_id.startswith("vision-"):
        return _vision_case(request, model, *map(int, case_id.split("-")[1].split("x")))
    native = _graph_request(family, request)
    if case_id == "embed-request":
        ids = native.ids[None].numpy()
        with torch.no_grad():
            return GraphCase({"input_ids": ids}, model.get_input_embeddings()(torch.from_numpy(ids)).numpy())
    cand = native.image_pos[~native.newline]
    if case_id == "probe-request":
        # Newline rows stay in the sequence (they take attention mass); the demand is read at the candidates.
        want = ref.layer0_relevance(request.getfixturevalue("next_eager_model"), native)
        length = native.ids.shape[0]

        def check(got, want, sess):
            assert got.shape == (cand.size,) and native.newline.sum() > 0
            assert want.std() > 0.05 * want.mean()  # not a uniform map: a wrong column would show
        return GraphCase({"inputs_embeds": native.embeds.numpy(),
                          "position_ids": np.arange(length, dtype=np.int64)[None],
                          "visual_positions": cand, "instruction_positions": native.instr}, want, atol=1e-5,
                         check=check)
    budget = int(case_id.split("-")[1])  # selector-<budget>: the selector graph == coverage_select
    from coverpruner.selection import coverage_select

    feats = native.embeds[0, torch.from_numpy(cand)].numpy()
    relevance = np.random.default_rng(0).random(feats.shape[0]).astype(np.float32)
    return GraphCase({"image_features": feats, "relevance": relevance, "budget": np.array(budget, np.int64),
                      "tau": np.array(0.3, np.float32)}, coverage_select(feats, relevance, budget=budget, tau=0.3))


def _vision_case(request, model, w: int, h: int):
    """vision.onnx [tiles,3,84,84] -> [tiles,36,64], packed by our numpy packing, against HF's own
    get_image_features (tower, projector, pack_image_features with image_newline). [N,d] f32."""
    import numpy as np
    import torch

    from coverpruner.families.llava_next.anyres import pack_features, prepare_tiles
    from tests.families.llava_next.fixtures import smooth_image
    from tests.family_matrix import GraphCase

    pixels, geo = prepare_tiles(smooth_image(w, h, seed=3), request.getfixturevalue("next_settings"))
    newline = model.model.image_newline.detach().numpy()
    with torch.no_grad():
        want = model.get_image_features(pixel_values=torch.from_numpy(pixels)[None],
                                        image_sizes=torch.tensor([[h, w]])).pooler_output[0].numpy()

    def post(feats):
        assert feats.shape == (geo.num_tiles, 36, 64)
        return pack_features(feats, geo, newline)

    def check(rows, want, sess):
        assert rows.shape == (geo.num_rows, 64)
        # The newline rows are exactly the model's image_newline vector (HF concatenates it, no arithmetic).
        mask = geo.newline_mask()
        np.testing.assert_array_equal(want[mask], np.broadcast_to(newline, (mask.sum(), 64)))

    # fp32 rounding of a 3-layer CLIP + projector, |features| ~ 1: same bound as LLaVA-1.5's vision case.
    return GraphCase({"pixel_values": pixels}, want, atol=1e-4, post=post, check=check)


def decoder_case(family, request, case_id: str):
    """A pruned NeXT sequence (every 3rd image row, newline rows among them) with compact positions, prefill +
    8 decode steps."""
    import torch

    from tests.family_matrix import compact_decoder_case

    native = _graph_request(family, request)
    image = set(native.image_pos.tolist())
    rows = [i for i in range(native.ids.shape[0]) if i not in image or (i - native.image_pos[0]) % 3 == 0]
    return compact_decoder_case(request.getfixturevalue("next_hf_model"), native.embeds[:, torch.tensor(rows)],
                                steps=8)
