"""The hybrid decoder's export helpers (coverpruner/families/gated_delta.py) against transformers' own Qwen3.5 code:
the exportable chunked gated delta rule == HF's token-by-token recurrence (torch_recurrent_gated_delta_rule) at
lengths that end inside, exactly at and past a 64-row chunk, with grouped value heads and a carried-in state; the
per-chunk triangular solve == torch.linalg.solve_triangular on keys that all point one way (the worst case for the
solve's growth); the family's declarations match the checkpoint; the shape-real presets build (meta device)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.mark.parametrize("length", [1, 5, 64, 65, 200])
def test_chunked_rule_equals_hf_recurrence(length):
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_recurrent_gated_delta_rule

    from coverpruner.families.gated_delta import chunk_gated_delta_rule

    gen = torch.Generator().manual_seed(length)
    q = torch.randn(1, length, 2, 16, generator=gen)
    k = torch.randn(1, length, 2, 16, generator=gen) + 2 * torch.randn(1, 1, 2, 16, generator=gen)
    v = torch.randn(1, length, 4, 16, generator=gen)
    g, beta = -0.5 * torch.rand(1, length, 4, generator=gen), torch.rand(1, length, 4, generator=gen)
    state = 0.1 * torch.randn(1, 4, 16, 16, generator=gen)
    kw = dict(g=g, beta=beta, initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True)
    want, want_state = torch_recurrent_gated_delta_rule(q, k, v, **kw)
    got, got_state = chunk_gated_delta_rule(q, k, v, **kw)
    # float32, sums of <= 64 terms reordered: measured <= 5e-7 on outputs of magnitude ~1
    torch.testing.assert_close(got, want, rtol=0, atol=2e-6)
    torch.testing.assert_close(got_state, want_state, rtol=0, atol=2e-6)


def test_block_inversion_equals_triangular_solve():
    from coverpruner.families.gated_delta import unit_lower_inverse

    gen = torch.Generator().manual_seed(0)
    noise = torch.randn(3, 64, 16, generator=gen)
    keys = torch.nn.functional.normalize(noise + 3 * torch.randn(3, 1, 16, generator=gen), dim=-1)  # close keys
    system = (0.9 * keys @ keys.transpose(-1, -2)).tril(-1)
    eye = torch.eye(64).expand(3, 64, 64)
    want = torch.linalg.solve_triangular(eye + system, eye, upper=False, unitriangular=True)
    torch.testing.assert_close(unit_lower_inverse(system), want, rtol=0, atol=2e-6)


def test_declarations_match_the_checkpoint(qwen35_hf):
    """KV at the full layer only, conv [C, K-1] / recurrent [Hv, dk, dv] states at the linear ones, the probe at layer
    3 with its output gate dropped, the zero-centred norms written as their effective scale."""
    from coverpruner.families import get_family
    from coverpruner.families.contract import DecoderState

    family = get_family("qwen3_5")
    spec = family.decoder_spec(qwen35_hf.config)
    assert spec.kv_layers == (3,) and spec.kv_layer_list(4) == (3,)
    assert spec.states == (DecoderState("conv", (0, 1, 2), (128, 3), "model"),
                           DecoderState("recurrent", (0, 1, 2), (4, 16, 16), "float32"))
    parts = family.probe_parts(qwen35_hf)
    assert (parts.layer, parts.q_gate, parts.head_dim) == (3, True, 64) and parts.prefix is not None
    weights = family.decoder_weights(qwen35_hf)
    lm = qwen35_hf.model.language_model
    norm = lm.layers[0].input_layernorm.weight.detach().numpy()
    np.testing.assert_array_equal(weights.layers[0].input_norm, 1 + norm)
    assert weights.layers[3].q.shape == (4 * 2 * 64, 64) and weights.layers[0].linear.conv.shape == (128, 4)
    assert weights.rotary == {"theta": 10000.0, "mrope_section": [2, 3, 3], "mrope_interleaved": True, "dim": 16}


REAL = {  # preset: (text hidden, layers, value heads, vision hidden, vision out, tied)
    "qwen3.5-0.8b": (1024, 24, 16, 768, 1024, True), "qwen3.5-2b": (2048, 24, 16, 1024, 2048, True),
    "qwen3.5-4b": (2560, 32, 32, 1024, 2560, True), "qwen3.5-9b": (4096, 32, 32, 1152, 4096, False)}


@pytest.mark.parametrize("preset", sorted(REAL))
def test_shape_real_presets_build(preset):
    """transformers builds each shape-real preset (meta device); --layers 4 is 3 Gated DeltaNet layers + 1 full."""
    from transformers import Qwen3_5ForConditionalGeneration

    from coverpruner.families import get_family
    from coverpruner.testing.qwen3_5_checkpoints import build_qwen3_5_config
    from coverpruner.testing.qwen_vl_common import train_qwen_tokenizer

    config = build_qwen3_5_config(preset, train_qwen_tokenizer(), 4)
    with torch.device("meta"):
        model = Qwen3_5ForConditionalGeneration(config)
    hidden, layers, value_heads, vision, out, tied = REAL[preset]
    t = config.text_config
    assert t.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    assert (t.hidden_size, t.linear_num_value_heads, t.head_dim) == (hidden, value_heads, 256)
    assert (config.vision_config.hidden_size, config.vision_config.out_hidden_size) == (vision, out)
    # tied at the top and in text_config, as the released configs (onnxruntime-genai's builder reads text_config's)
    assert config.tie_word_embeddings == t.tie_word_embeddings == tied and len(model.model.visual.blocks) == 4
    assert model.model.language_model.layers[3].self_attn.q_proj.weight.shape[0] == 2 * 256 * t.num_attention_heads
    assert get_family("qwen3_5").dims(config)["rotary_dim"] == 64
    full = build_qwen3_5_config(preset, train_qwen_tokenizer(), None).text_config
    assert full.num_hidden_layers == layers and full.layer_types.count("full_attention") == layers // 4
