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
    """(HF processor inputs, HF inputs_embeds [1,L,d] with image rows, our layout and native positions [3,L])."""
    def make():
        import torch

        from tests.families.qwen2_5_vl.fixtures import our_request, sample_image
        from tests.families.qwen2_5_vl.hf_qwen import hf_inputs

        model = request.getfixturevalue("qwen_hf")
        image = sample_image(3, size)
        ref = hf_inputs(family.checkpoint, image, GRAPH_PROMPT)
        _, layout, positions = our_request(family.export, image, GRAPH_PROMPT)
        with torch.no_grad():
            feats = model.model.get_image_features(ref["pixel_values"], ref["image_grid_thw"]).pooler_output[0]
            embeds = model.model.get_input_embeddings()(ref["input_ids"])
            embeds[0, torch.from_numpy(layout.visual_positions)] = feats
        return ref, embeds.numpy(), layout, positions
    return family.memo(("graph_request", size), make)


def _hf_image(family, request, size):
    """(our preprocessed image, vision.onnx feed, HF get_image_features(...).pooler_output [n,d] f32)."""
    import json

    import torch

    from coverpruner.families.qwen_vl import QwenImageSettings, preprocess_qwen_image
    from coverpruner.families.qwen2_5_vl.vision import VISION_INPUTS, vision_inputs
    from tests.families.qwen2_5_vl.fixtures import sample_image

    model = request.getfixturevalue("qwen_hf")
    settings = QwenImageSettings.from_dict(json.loads((family.checkpoint / "preprocessor_config.json").read_text()))
    img = preprocess_qwen_image(sample_image(1, size), settings)
    vc = model.config.vision_config
    inputs = vision_inputs(img.pixel_values, img.grid_thw, vc.spatial_merge_size, vc.window_size, vc.patch_size)
    with torch.no_grad():
        want = model.model.get_image_features(torch.from_numpy(img.pixel_values),
                                              torch.tensor([img.grid_thw])).pooler_output[0].numpy()
    return img, {k: inputs[k] for k in VISION_INPUTS}, want


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
        ref, embeds, layout, positions = _graph_request(family, request, common.case_size(case_id))
        return common.probe_case(model, ref, embeds, layout, positions)
    _, _, feats = _hf_image(family, request, (300, 250))  # selector-<budget>
    return common.selector_case(feats, int(case_id.split("-")[1]))


def decoder_case(family, request, case_id: str):
    """Prefill of the native sequence (HF computes its own 3-D positions, get_rope_index; its present keys too)
    and one decode step at max(native)+1 in all rows (HF: the whole sequence again, with its rope_deltas)."""
    import numpy as np
    import torch

    from tests.family_matrix import DecoderCase

    model = request.getfixturevalue("qwen_hf")
    ref, embeds, layout, positions = _graph_request(family, request, common.case_size(case_id))
    with torch.no_grad():
        out = model(**ref, use_cache=True)

    def hf_logits(step, token):
        if step == 0:
            return out.logits[:, -1].numpy()
        with torch.no_grad():
            ids = torch.cat([ref["input_ids"], torch.tensor([[token]])], 1)
            mm = torch.cat([ref["mm_token_type_ids"], torch.zeros(1, 1, dtype=torch.long)], 1)
            return model(input_ids=ids, pixel_values=ref["pixel_values"], image_grid_thw=ref["image_grid_thw"],
                         mm_token_type_ids=mm).logits[:, -1].numpy()

    def check_present(present):
        for i, layer in enumerate(out.past_key_values.layers):
            np.testing.assert_allclose(present[2 * i], layer.keys.numpy(), rtol=0, atol=1e-4)

    return DecoderCase(embeds, np.ones((1, embeds.shape[1]), np.int64), positions[:, None], hf_logits,
                       common.decode_step_inputs(model, positions), steps=1, check_present=check_present)
