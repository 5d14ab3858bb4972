"""What the Qwen2.5-VL and Qwen3-VL tests share (tests only): the sample image, our runtime's view of one request,
the HF reference's native request / layer-0 demand / literal selection (independent of the code under test: HF's
processor, get_rope_index and eager attention, tests/literal_selection.py's selectors), and the family-matrix facts
that are the same for both (tests/matrix/). Each family passes its fixture names and its hf_reference module; what
differs (DeepStack, window tables, HF's rope-delta cache, the greedy loops) stays in tests/families/<family>/.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np


def sample_image(seed: int = 0, size=(200, 240)):
    """A smooth random RGB image (gradients + blobs), (H, W) = size, so visual tokens differ but correlate."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    h, w = size
    yy, xx = np.mgrid[0:h, 0:w]
    y, x = yy / max(h, w), xx / max(h, w)
    img = np.stack([np.sin(6 * x + rng.random() * 6), np.cos(5 * y + rng.random() * 6), x * y], -1)
    for _ in range(6):
        cy, cx, r = rng.random() * h, rng.random() * w, 10 + rng.random() * 30
        img[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = rng.random(3)
    img = (img - img.min()) / (img.max() - img.min())
    return Image.fromarray((img * 255).astype(np.uint8))


def our_request(family_name: str, engine_dir: Path, image, prompt: str, options: dict | None = None):
    """The family runtime's view of one request: (VisionInputs, ConversationLayout, native positions int64 [3, L])."""
    from tokenizers import Tokenizer

    from coverpruner.engine_dir import load_manifest
    from coverpruner.families import get_family

    rt = get_family(family_name).runtime(load_manifest(engine_dir))
    vision = rt.prepare_image(image, options or {})
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    layout = rt.conversation_layout(Tokenizer.from_file(str(Path(engine_dir) / "tokenizer.json")), messages,
                                    [vision.num_candidates])
    return vision, layout, rt.native_positions(layout, [vision])


# ---------------------------------------------------------------------------------------------- HF reference


@dataclass
class Native:
    """One request laid out by HF: processor outputs, inputs_embeds [1,L,d], positions [3,1,L], visual positions
    [n], instruction positions [T] (between <|vision_end|> and the user turn's <|im_end|>), main features [n,d] and,
    for Qwen3-VL, the DeepStack levels (list of [n,d])."""

    inputs: dict
    embeds: object
    positions: object
    visual: np.ndarray
    instruction: np.ndarray
    features: object
    deepstack: list | None = None


def native_request(model, inputs: dict, deepstack: bool = False) -> Native:
    """Native of HF processor ``inputs`` on ``model``: HF's image features in the image-pad rows, HF's
    get_rope_index positions; ``deepstack``: keep HF's DeepStack levels too."""
    import torch

    ids = inputs["input_ids"][0]
    cfg = model.config
    visual = torch.nonzero(ids == cfg.image_token_id).flatten()
    end = int(torch.nonzero(ids == cfg.vision_end_token_id)[0])
    im_end = int(torch.nonzero(ids == cfg.text_config.eos_token_id).flatten()[-1])  # the user turn's <|im_end|>
    with torch.no_grad():
        out = model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"])
        feats = out.pooler_output[0]
        embeds = model.model.get_input_embeddings()(inputs["input_ids"]).clone()
        embeds[0, visual] = feats
        positions, _ = model.model.get_rope_index(inputs["input_ids"], inputs["mm_token_type_ids"],
                                                  image_grid_thw=inputs["image_grid_thw"])
    levels = [level[0] for level in out.deepstack_features] if deepstack else None
    return Native(inputs, embeds, positions, visual.numpy(), np.arange(end + 1, im_end), feats, levels)


def layer0_relevance(model, req: Native) -> np.ndarray:
    """Mean over heads and instruction rows of HF's layer-0 attention at the visual columns (eager)."""
    import torch

    with torch.no_grad():
        att = model(**req.inputs, output_attentions=True).attentions[0][0]  # [H, L, L]
    return att[:, req.instruction][:, :, req.visual].mean(dim=(0, 1)).numpy()


def select(model, req: Native, method: str, budget, tau: float = 0.3) -> np.ndarray:
    """Kept visual indices: all for budget None / "full" / >= n, else tests/literal_selection.py's literal float64
    coverage (on HF's layer-0 demand) or DivPrune over HF's features."""
    from tests.literal_selection import coverage_reference as literal_coverage  # literal float64 greedy
    from tests.literal_selection import divprune_reference as literal_divprune

    n = req.visual.size
    if budget is None or budget == "full" or budget >= n:
        return np.arange(n)
    feats = req.features.float().numpy()
    if method == "coverpruner":
        return literal_coverage(feats, layer0_relevance(model, req), budget, tau)
    if method == "divprune":
        return literal_divprune(feats, budget)
    raise ValueError(method)


def processor_inputs(processor, text: str, images: list) -> dict:
    """Conversation hook: HF's processor on one rendered text and its images."""
    return processor(images=images or None, text=[text], return_tensors="pt")


def native_positions(model, inputs: dict):
    """Conversation hook: int64 [3, L], HF's get_rope_index (text only: 0..L-1 in all three rows)."""
    import torch

    ids = inputs["input_ids"]
    if "image_grid_thw" not in inputs:
        return torch.arange(ids.shape[1])[None].expand(3, -1).clone()
    with torch.no_grad():
        positions, _ = model.model.get_rope_index(ids, inputs["mm_token_type_ids"],
                                                  image_grid_thw=inputs["image_grid_thw"])
    return positions[:, 0]


def before_generate(model) -> None:
    """HF keeps rope deltas between calls: a previous call's must not leak into model.generate."""
    model.model.rope_deltas = None


def single_image_reference(ref, fam, img, prompt: str, budget: int, steps: int):
    """(tokens, kept indices, relevance) from a family's hf_reference module ``ref``."""
    req = ref.native_request(fam.model, fam.ckpt, img, prompt)
    keep = select(fam.model, req, "coverpruner", budget)
    return ref.pruned_generate(fam.model, req, keep, steps, fam.eos), keep, layer0_relevance(fam.model, req)


# ---------------------------------------------------------------------------------------------- family matrix

NEW = 10
PROMPT = "What is written on the sign next to the red car?"
GRAPH_PROMPT = "Describe the small red sign near the top left corner."


def case_size(case_id: str) -> tuple[int, int]:
    """(H, W) of a case id ending in -<H>x<W>."""
    h, w = case_id.rsplit("-", 1)[1].split("x")
    return int(h), int(w)


def graph_request(family, request, size, hf: str, hf_inputs, ours):
    """(HF processor inputs, HF inputs_embeds [1,L,d] with HF's image features at our layout's visual rows, HF's
    DeepStack levels scattered to [1,L,d] each ([] without DeepStack), our layout and native positions [3,L]) of
    sample_image(3, size) with GRAPH_PROMPT, once per family and size. hf: the HF model's fixture name;
    hf_inputs(checkpoint, image, prompt): the family's HF processor inputs; ours(engine_dir, image, prompt): the
    family's our_request."""
    def make():
        import torch

        model = request.getfixturevalue(hf)
        image = sample_image(3, size)
        ref = hf_inputs(family.checkpoint, image, GRAPH_PROMPT)
        _, layout, positions = ours(family.export, image, GRAPH_PROMPT)
        with torch.no_grad():
            out = model.model.get_image_features(ref["pixel_values"], ref["image_grid_thw"])
            embeds = model.model.get_input_embeddings()(ref["input_ids"])
            embeds[0, torch.from_numpy(layout.visual_positions)] = out.pooler_output[0]
            levels = []
            for level in getattr(out, "deepstack_features", None) or []:
                full = np.zeros(embeds.shape, np.float32)
                full[0, layout.visual_positions] = level[0].numpy()
                levels.append(full)
        return ref, embeds.numpy(), levels, layout, positions
    return family.memo(("graph_request", size), make)


def hf_image(model, checkpoint: Path, settings_class, size):
    """(our preprocessed sample_image(1, size) with the checkpoint's preprocessor_config.json read by
    ``settings_class``, HF's get_image_features output on our pixels)."""
    import json

    import torch

    from coverpruner.families.qwen_vl import preprocess_qwen_image

    settings = settings_class.from_dict(json.loads((Path(checkpoint) / "preprocessor_config.json").read_text()))
    img = preprocess_qwen_image(sample_image(1, size), settings)
    with torch.no_grad():
        out = model.model.get_image_features(torch.from_numpy(img.pixel_values), torch.tensor([img.grid_thw]))
    return img, out


def embed_case(model):
    """embed.onnx == HF's token table on a few ids."""
    import torch

    from tests.family_matrix import GraphCase

    ids = np.array([[1, 5, 17, 900, 1003, 1005]], np.int64)
    return GraphCase({"input_ids": ids}, model.model.get_input_embeddings()(torch.from_numpy(ids)).detach().numpy())


def selector_case(feats: np.ndarray, budget: int):
    """The selector graph == coverage_select on HF's features with a fixed random demand."""
    from coverpruner.selection import coverage_select
    from tests.family_matrix import GraphCase

    relevance = np.random.default_rng(0).random(feats.shape[0]).astype(np.float32)
    return GraphCase({"image_features": feats, "relevance": relevance, "budget": np.array(budget, np.int64),
                      "tau": np.array(0.3, np.float32)}, coverage_select(feats, relevance, budget=budget, tau=0.3))


def probe_case(model, ref: dict, embeds: np.ndarray, layout, positions: np.ndarray):
    """HF's own layer-0 attention (its positions and causal mask), instruction rows x visual columns, against the
    probe fed our layout and native positions."""
    import torch

    from tests.family_matrix import GraphCase

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


def hf_decoder_case(model, ref: dict, embeds: np.ndarray, positions: np.ndarray, levels: list,
                    reset_rope_deltas: bool = False, present_atol: float | None = None):
    """DecoderCase: prefill of our native layout (embeds [1,L,d], positions [3,L], DeepStack ``levels`` [1,L,d] each
    as the decoder extras visual_extra.k) against HF's whole model on its processor inputs ``ref`` (its own
    positions and DeepStack), then one decode step at max(native)+1 in all rows (HF: the whole sequence again).
    reset_rope_deltas: clear HF's cached rope deltas before each HF call (Qwen3-VL keeps them between calls);
    present_atol: also compare the prefill's present keys with HF's cache."""
    import torch

    from tests.family_matrix import DecoderCase

    if reset_rope_deltas:
        model.model.rope_deltas = None
    with torch.no_grad():
        out = model(**ref, use_cache=True)

    def hf_logits(step, token):
        if step == 0:
            return out.logits[:, -1].numpy()
        with torch.no_grad():
            ids = torch.cat([ref["input_ids"], torch.tensor([[token]])], 1)
            mm = torch.cat([ref["mm_token_type_ids"], torch.zeros(1, 1, dtype=ref["mm_token_type_ids"].dtype)], 1)
            if reset_rope_deltas:
                model.model.rope_deltas = None
            return model(input_ids=ids, pixel_values=ref["pixel_values"], image_grid_thw=ref["image_grid_thw"],
                         mm_token_type_ids=mm).logits[:, -1].numpy()

    def check_present(present):
        for i, layer in enumerate(out.past_key_values.layers):
            np.testing.assert_allclose(present[2 * i], layer.keys.numpy(), rtol=0, atol=present_atol)

    start = int(np.max(positions)) + 1  # HF's get_rope_index continues here; written here, not taken from coverpruner

    def step_inputs(step, token):
        emb = model.model.get_input_embeddings()(torch.tensor([[token]])).detach().numpy()
        return emb, np.full((3, 1, 1), start + step - 1, np.int64)

    return DecoderCase(embeds, np.ones((1, embeds.shape[1]), np.int64), positions[:, None], hf_logits, step_inputs,
                       steps=1, check_present=check_present if present_atol is not None else None,
                       extras={f"visual_extra.{k}": level for k, level in enumerate(levels)} or None)


class QwenFacts:
    """The matrix facts both Qwen families state the same way, bound to one family's session fixtures (HF model,
    checkpoint) and hf_reference module; a family's matrix.py exposes the bound methods under the matrix's names."""

    def __init__(self, hf: str, checkpoint: str, reference: str, visual_tokens: int):
        self.hf, self.checkpoint, self.reference, self.visual_tokens = hf, checkpoint, reference, visual_tokens

    def ref(self):
        return importlib.import_module(self.reference)

    def pipeline_case(self, family, request, case_id: str):
        """(PIL image, prompt, generate options) of one case."""
        return sample_image(5, (300, 250)), PROMPT, {}

    def native(self, family, request, case_id: str):
        image, prompt, _ = self.pipeline_case(family, request, case_id)
        return family.memo(("native", case_id), lambda: self.ref().native_request(
            request.getfixturevalue(self.hf), request.getfixturevalue(self.checkpoint), image, prompt))

    @staticmethod
    def eos(model) -> set[int]:
        return set(model.generation_config.eos_token_id)  # what HF generate stops on

    def hf_pruned(self, family, request, case_id: str, budget: int, method: str):
        """(new token ids, kept indices, demand or None, the native request)."""
        model, req = request.getfixturevalue(self.hf), self.native(family, request, case_id)
        keep = select(model, req, method, budget)
        relevance = layer0_relevance(model, req) if method == "coverpruner" else None
        return self.ref().pruned_generate(model, req, keep, NEW, self.eos(model)), keep, relevance, req

    def check_full(self, family, request, case_id: str, got, want) -> None:
        model, req = request.getfixturevalue(self.hf), self.native(family, request, case_id)
        assert got.num_visual_tokens == req.visual.size == self.visual_tokens
        assert got.prompt_tokens == req.embeds.shape[1]
        # it stops on the same ids as HF generate (generation_config: <|im_end|> and <|endoftext|>)
        assert set(np.atleast_1d(family.pipe.manifest.token_ids["eos_token_id"]).tolist()) == \
            set(model.generation_config.eos_token_id)

    def check_pruned(self, family, request, case_id: str, got, ref_out, budget: int) -> None:
        """Pruned == the full model with the dropped columns masked out (native M-RoPE positions kept)."""
        model = request.getfixturevalue(self.hf)
        _, keep, _, req = ref_out
        assert got.prefill_tokens == req.embeds.shape[1] - (req.visual.size - budget)
        assert got.token_ids == self.ref().masked_generate(model, req, keep, NEW, self.eos(model))
