"""Qwen2.5-VL's facts for the family matrix (tests/matrix/): what the generic tests ask of this family."""

from __future__ import annotations

from tests.families import qwen_common as common

# the tiny preset (coverpruner/testing/presets.py) the matrix builds for this family
PRESET = "qwen2.5-vl-tiny"

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
# The reference (tests/families/qwen2_5_vl/hf_reference.py with tests/families/qwen_common.py): HF processor layout,
# HF get_rope_index positions, HF eager layer-0 demand, literal float64 selectors, a greedy loop over the HF model
# with explicit 3-D positions (pruned rows keep their native positions).
NEW, PROMPT, GRAPH_PROMPT = common.NEW, common.PROMPT, common.GRAPH_PROMPT
PIPELINE_CASES = ["300x250"]
# the shared facts (qwen_common.QwenFacts): 99 visual tokens for the 300x250 case
_facts = common.QwenFacts("qwen_hf", "qwen_checkpoint", "tests.families.qwen2_5_vl.hf_reference", 99)
pipeline_case, hf_pruned, check_full, check_pruned = (_facts.pipeline_case, _facts.hf_pruned, _facts.check_full,
                                                      _facts.check_pruned)


def hf_full(family, request, case_id: str) -> list[int]:
    """HF generate on the processor's inputs (greedy, no repetition penalty)."""
    import torch

    model, req = request.getfixturevalue("qwen_hf"), _facts.native(family, request, case_id)
    with torch.no_grad():
        out = model.generate(**req.inputs, max_new_tokens=NEW, do_sample=False, repetition_penalty=1.0)
    return out[0, req.inputs["input_ids"].shape[1]:].tolist()


# --- "every graph vs HF" (tests/matrix/test_graph_parity.py) ---
# vision: (H, W) of the input image -> grids after smart_resize: 8x8 (window 3 does not divide), 11x9, 5x15,
# 13x11, and 6x6 (window divides the grid exactly); test_vision_graph.py checks these grids and their windows.
VISION_SIZES = [(224, 224), (300, 250), (140, 420), (400, 330), (168, 168)]
PROBE_SIZES = [(224, 224), (300, 250), (140, 420)]
GRAPH_CASES = ([f"vision-{h}x{w}" for h, w in VISION_SIZES] + ["embed-ids"] + [f"probe-{h}x{w}" for h, w in PROBE_SIZES]
               + ["selector-64", "selector-16", "selector-200"])
DECODER_CASES = ["prefill-decode-300x250", "prefill-decode-140x420"]


def _graph_request(family, request, size):
    """qwen_common.graph_request with this family's HF inputs and request (no DeepStack levels)."""
    from tests.families.qwen2_5_vl.fixtures import our_request
    from tests.families.qwen2_5_vl.hf_qwen import hf_inputs

    return common.graph_request(family, request, size, "qwen_hf", hf_inputs, our_request)


def _hf_image(family, request, size):
    """(our preprocessed image, vision.onnx feed, HF get_image_features(...).pooler_output [n,d] f32)."""
    from coverpruner.families.qwen_vl import QwenImageSettings
    from coverpruner.families.qwen2_5_vl.vision import VISION_INPUTS, vision_inputs

    model = request.getfixturevalue("qwen_hf")
    img, out = common.hf_image(model, family.checkpoint, QwenImageSettings, size)
    vc = model.config.vision_config
    inputs = vision_inputs(img.pixel_values, img.grid_thw, vc.spatial_merge_size, vc.window_size, vc.patch_size)
    return img, {k: inputs[k] for k in VISION_INPUTS}, out.pooler_output[0].numpy()


def graph_case(family, request, case_id: str):
    import numpy as np

    from tests.family_matrix import GraphCase

    model = request.getfixturevalue("qwen_hf")
    graph = case_id.split("-")[0]
    if graph == "vision":
        img, feed, want = _hf_image(family, request, common.case_size(case_id))

        def check(got, want, sess):
            assert got.shape == (img.num_visual_tokens, model.config.text_config.hidden_size)
        # float32 through 4 blocks of 64-wide sums and a 256-wide merger: measured ~1e-6 of the output scale.
        return GraphCase(feed, want, rtol=0, atol=1e-5 * np.abs(want).max(), check=check)
    if graph == "embed":
        return common.embed_case(model)
    if graph == "probe":
        ref, embeds, _, layout, positions = _graph_request(family, request, common.case_size(case_id))
        return common.probe_case(model, ref, embeds, layout, positions)
    _, _, feats = _hf_image(family, request, (300, 250))  # selector-<budget>
    return common.selector_case(feats, int(case_id.split("-")[1]))


def decoder_case(family, request, case_id: str):
    """Prefill of the native sequence (HF computes its own 3-D positions, get_rope_index; its present keys too,
    float32 through 2 layers: 1e-4) and one decode step at max(native)+1 in all rows (HF: the whole sequence again,
    with its rope_deltas)."""
    ref, embeds, levels, _, positions = _graph_request(family, request, common.case_size(case_id))
    return common.hf_decoder_case(request.getfixturevalue("qwen_hf"), ref, embeds, positions, levels,
                                  present_atol=1e-4)
