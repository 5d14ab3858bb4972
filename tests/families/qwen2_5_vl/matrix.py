"""Qwen2.5-VL's facts for the family matrix (tests/matrix/): what the generic tests ask of this family."""

from __future__ import annotations

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


# --- "every graph vs HF" (tests/matrix/test_graph_parity.py) ---
# vision: (H, W) of the input image -> grids after smart_resize: 8x8 (window 3 does not divide), 11x9, 5x15,
# 13x11, and 6x6 (window divides the grid exactly); test_vision_graph.py checks these grids and their windows.
VISION_SIZES = [(224, 224), (300, 250), (140, 420), (400, 330), (168, 168)]
PROBE_SIZES = [(224, 224), (300, 250), (140, 420)]
GRAPH_PROMPT = "Describe the small red sign near the top left corner."
GRAPH_CASES = ([f"vision-{h}x{w}" for h, w in VISION_SIZES] + ["embed-ids"] + [f"probe-{h}x{w}" for h, w in PROBE_SIZES]
               + ["selector-64", "selector-16", "selector-200"])
DECODER_CASES = ["prefill-decode-300x250", "prefill-decode-140x420"]


def _size(case_id: str) -> tuple[int, int]:
    h, w = case_id.rsplit("-", 1)[1].split("x")
    return int(h), int(w)


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
    import torch

    from tests.family_matrix import GraphCase

    model = request.getfixturevalue("qwen_hf")
    graph = case_id.split("-")[0]
    if graph == "vision":
        img, feed, want = _hf_image(family, request, _size(case_id))

        def check(got, want, sess):
            assert got.shape == (img.num_visual_tokens, model.config.text_config.hidden_size)
        # float32 through 4 blocks of 64-wide sums and a 256-wide merger: measured ~1e-6 of the output scale.
        return GraphCase(feed, want, rtol=0, atol=1e-5 * np.abs(want).max(), check=check)
    if graph == "embed":
        ids = np.array([[1, 5, 17, 900, 1003, 1005]], np.int64)
        return GraphCase({"input_ids": ids}, model.model.get_input_embeddings()(torch.from_numpy(ids)).detach().numpy())
    if graph == "probe":
        return _probe_case(family, request, model, _size(case_id))
    budget = int(case_id.split("-")[1])  # selector-<budget>: the selector graph == coverage_select on HF features
    from coverpruner.selection import coverage_select

    _, _, feats = _hf_image(family, request, (300, 250))
    relevance = np.random.default_rng(0).random(feats.shape[0]).astype(np.float32)
    return GraphCase({"image_features": feats, "relevance": relevance, "budget": np.array(budget, np.int64),
                      "tau": np.array(0.3, np.float32)}, coverage_select(feats, relevance, budget=budget, tau=0.3))


def _probe_case(family, request, model, size):
    """HF's own layer-0 attention (its positions and causal mask), instruction rows x visual columns."""
    import numpy as np
    import torch

    from tests.family_matrix import GraphCase

    ref, embeds, layout, positions = _graph_request(family, request, size)
    with torch.no_grad():
        out = model(**ref, output_attentions=True)
    att = out.attentions[0][0].numpy()  # [H, L, L]
    want = att[:, layout.instruction_positions][:, :, layout.visual_positions].mean(axis=(0, 1))
    feed = {"inputs_embeds": embeds, "position_ids": positions[:, None], "visual_positions": layout.visual_positions,
            "instruction_positions": layout.instruction_positions}

    def check(got, want, sess):
        assert got.shape == (layout.visual_positions.size,)
        # positions matter: 1-D positions 0..L-1 give a different demand
        flat_positions = np.broadcast_to(np.arange(embeds.shape[1]), (3, 1, embeds.shape[1])).copy()
        (flat,) = sess.run(None, {**feed, "position_ids": flat_positions})
        assert np.abs(flat - want).max() > 1e-3 * want.max()
    # probabilities averaged over H*T entries; float32 softmax rounding ~1e-7 relative to each entry.
    return GraphCase(feed, want, rtol=1e-4, atol=1e-7, check=check)


def decoder_case(family, request, case_id: str):
    """Prefill of the native sequence (HF computes its own 3-D positions, get_rope_index; its present keys too)
    and one decode step at max(native)+1 in all rows (HF: the whole sequence again, with its rope_deltas)."""
    import numpy as np
    import torch

    from coverpruner.families.qwen_vl import decode_position
    from tests.family_matrix import DecoderCase

    model = request.getfixturevalue("qwen_hf")
    ref, embeds, layout, positions = _graph_request(family, request, _size(case_id))
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

    def step_inputs(step, token):
        emb = model.model.get_input_embeddings()(torch.tensor([[token]])).detach().numpy()
        return emb, decode_position(positions, step - 1)[:, None, None]

    def check_present(present):
        for i, layer in enumerate(out.past_key_values.layers):
            np.testing.assert_allclose(present[2 * i], layer.keys.numpy(), rtol=0, atol=1e-4)

    return DecoderCase(embeds, np.ones((1, embeds.shape[1]), np.int64), positions[:, None], hf_logits, step_inputs,
                       steps=1, check_present=check_present)
