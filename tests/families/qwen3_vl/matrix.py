"""Qwen3-VL's facts for the family matrix (tests/matrix/): what the generic tests ask of this family."""

from __future__ import annotations

from tests.families import qwen_common as common

PRESET = "qwen3-vl-tiny"

# candidates of assets/demo.png (480x360 -> 448x320 -> 14 x 10 merged tokens)
DEMO_CANDIDATES = 140
# M-RoPE: kept rows keep their native positions and decoding continues after the unpruned prompt's last position
PRUNING_FREES_CONTEXT = False
KEEP_ALL_OPTIONS: dict = {}

TRT_BUILD_ARGS = ["--budgets", "16,64", "--max-context", "512"]


def check_trt_profiles(section: dict, manifest: dict) -> None:
    """One dynamic patch axis (no windows) and 3-row M-RoPE positions; the DeepStack inputs ride the sequence axis."""
    vision_axes = {a for spec in manifest["graphs"]["vision"]["inputs"] for a in spec["shape"] if isinstance(a, str)}
    assert vision_axes == {"num_patches"}
    # tiny preset: up to 160 visual tokens = 640 patches of 3*2*16*16 values
    assert section["engines"]["vision"]["profile"]["pixel_values"]["max"] == [640, 1536]
    decoder = section["engines"]["decoder"]["profile"]
    assert decoder["position_ids"]["max"] == [3, 1, 512]
    assert decoder["visual_extra.0"]["max"][1:] == [512, 64]


# --- "pipeline == independent HF reference" (tests/matrix/test_pipeline_reference.py) ---
# The reference (tests/families/qwen3_vl/hf_reference.py with tests/families/qwen_common.py): HF processor layout,
# HF get_rope_index positions, HF eager layer-0 demand, literal float64 selectors, HF's DeepStack levels gathered with
# the kept indices, a greedy loop over HF's text model with explicit 3-D positions.
NEW, PROMPT, GRAPH_PROMPT = common.NEW, common.PROMPT, common.GRAPH_PROMPT
PIPELINE_CASES = ["300x250"]
# the shared facts (qwen_common.QwenFacts): 72 visual tokens for the 300x250 case
_facts = common.QwenFacts("qwen3_hf", "qwen3_checkpoint", "tests.families.qwen3_vl.hf_reference", 72)
pipeline_case, hf_pruned, check_full, check_pruned = (_facts.pipeline_case, _facts.hf_pruned, _facts.check_full,
                                                      _facts.check_pruned)


def hf_full(family, request, case_id: str) -> list[int]:
    """HF generate on the processor's inputs (greedy): the whole model, DeepStack included."""
    import torch

    model, req = request.getfixturevalue("qwen3_hf"), _facts.native(family, request, case_id)
    model.model.rope_deltas = None  # HF keeps rope deltas between calls
    with torch.no_grad():
        out = model.generate(**req.inputs, max_new_tokens=NEW, do_sample=False)
    return out[0, req.inputs["input_ids"].shape[1]:].tolist()


# --- "every graph vs HF" (tests/matrix/test_graph_parity.py) ---
# vision: (H, W) -> grids after smart_resize at 32 px: 18x16, 8x26, 26x20 patches (the learned 8x8 position grid
# interpolated up and, for 8 rows, at its own size). 224x224 (14x14) and the 140x420 decoder run end to end in
# tests/families/qwen3_vl/test_pipeline.py (three shapes, budgets full / 32 / 8, DivPrune): not repeated here.
VISION_SIZES = [(300, 250), (140, 420), (400, 330)]
PROBE_SIZES = [(300, 250)]
GRAPH_CASES = ([f"vision-{h}x{w}" for h, w in VISION_SIZES] + ["embed-ids"] + [f"probe-{h}x{w}" for h, w in PROBE_SIZES]
               + ["selector-64", "selector-16"])
DECODER_CASES = ["prefill-decode-300x250"]


def _graph_request(family, request, size):
    """qwen_common.graph_request with this family's HF inputs and request (DeepStack levels scattered to [1,L,d])."""
    from tests.families.qwen3_vl.fixtures import our_request
    from tests.families.qwen3_vl.hf_qwen3 import hf_inputs

    return common.graph_request(family, request, size, "qwen3_hf", hf_inputs, our_request)


def _hf_image(family, request, size):
    """(vision.onnx feed, HF main features [n,d], HF DeepStack levels [[n,d], ...]) for one image."""
    from coverpruner.families.qwen3_preprocess import Qwen3ImageSettings
    from coverpruner.families.qwen3_vision import vision_inputs

    model = request.getfixturevalue("qwen3_hf")
    img, out = common.hf_image(model, family.checkpoint, Qwen3ImageSettings, size)
    vc = model.config.vision_config
    feed = vision_inputs(img.pixel_values, img.grid_thw, vc.spatial_merge_size, vc.num_position_embeddings)
    return feed, out.pooler_output[0].numpy(), [level[0].numpy() for level in out.deepstack_features]


def graph_case(family, request, case_id: str):
    import numpy as np

    from tests.family_matrix import GraphCase

    model = request.getfixturevalue("qwen3_hf")
    graph = case_id.split("-")[0]
    if graph == "vision":
        feed, want, levels = _hf_image(family, request, common.case_size(case_id))
        # float32 through 3 blocks of 64-wide sums and 256-wide mergers: measured ~1e-6 of the output scale
        atol = 1e-5 * np.abs(want).max()

        def check(got, want, sess):
            outputs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))
            assert sorted(outputs) == ["image_features", "visual_extra.0", "visual_extra.1"]
            for k, level in enumerate(levels):  # every DeepStack merger == HF's, same rows in the same order
                np.testing.assert_allclose(outputs[f"visual_extra.{k}"], level, rtol=0,
                                           atol=1e-5 * np.abs(level).max())
                assert np.abs(level - want).max() > 0.1 * np.abs(want).max()  # the levels are not the main output
        return GraphCase(feed, want, rtol=0, atol=atol, check=check)
    if graph == "embed":
        return common.embed_case(model)
    if graph == "probe":
        ref, embeds, _, layout, positions = _graph_request(family, request, common.case_size(case_id))
        return common.probe_case(model, ref, embeds, layout, positions)
    _, feats, _ = _hf_image(family, request, (300, 250))  # selector-<budget>
    return common.selector_case(feats, int(case_id.split("-")[1]))


def decoder_case(family, request, case_id: str):
    """Prefill of the native sequence with the DeepStack levels at the visual rows (HF: the whole model on the
    processor's inputs, its own positions and DeepStack), then one decode step at max(native)+1."""
    ref, embeds, levels, _, positions = _graph_request(family, request, common.case_size(case_id))
    return common.hf_decoder_case(request.getfixturevalue("qwen3_hf"), ref, embeds, positions, levels,
                                  reset_rope_deltas=True)
