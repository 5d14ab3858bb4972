"""Gemma 3 (HF `Gemma3ForConditionalGeneration`: SigLIP vision tower, multi-modal projector (RMSNorm, average pool
to mm_tokens_per_image soft tokens, linear), Gemma 3 decoder): export time. Importing this module does not import
torch.

One request (google/gemma-3-*-it's chat template; Gemma3Processor expands <start_of_image>):
    "<bos><start_of_turn>user\\n\\n\\n<start_of_image>" + "<image_soft_token>" * 256 + "<end_of_image>\\n\\n{prompt}"
    "<end_of_turn>\\n<start_of_turn>model\\n"
The soft-token rows take the projector's outputs (every one a candidate; with pan-and-scan the crops' rows too, one
budget per image). In prefill the soft tokens of one crop attend to each other both ways (transformers' block mask
from token_type_ids), and five of six decoder layers (layer 0 among them) see a sliding window: contract v5's
AttentionSpec (blocks, windows). Positions are 1-D: a pruned sequence is re-packed 0..L'-1 (as LLaVA-1.5).
The decoder scales token embeddings by sqrt(hidden) inside its embedding module (the embed graph carries it) and
transformers 5.24's Gemma3ForConditionalGeneration applies no logit softcapping (its attention ignores
attn_logit_softcapping; final_logit_softcapping is Gemma3ForCausalLM's only), so neither is declared.
"""

from __future__ import annotations

from pathlib import Path

from coverpruner.families.contract import AttentionSpec, DecoderLayerWeights, DecoderSpec, DecoderWeights, ExportSpec
from coverpruner.families.gemma3.preprocess import Gemma3ImageSettings
from coverpruner.families.gemma3.runtime import BOI_TOKEN, PAN_AND_SCAN_OPTION, Gemma3Runtime
from coverpruner.families.hf import HFFamily, attention_windows, chat_layout, text_dims
from coverpruner.families.clip import read_processor_config


def _rope(params: dict) -> dict:
    """{"theta", "factor"} of one layer type's rope_parameters ("default", or "linear": frequencies / factor);
    ValueError (one line) for another rope type, which the ORT form's host rows do not implement."""
    kind = params.get("rope_type", "default")
    if kind not in ("default", "linear"):
        raise ValueError(f"rope_type {kind!r} has no ORT-form rotary rows; export with --decoder-form standard")
    return {"theta": float(params["rope_theta"]), "factor": float(params.get("factor", 1.0)) if kind == "linear"
            else 1.0}


class Gemma3Family(HFFamily):
    """Adapter for Gemma 3 checkpoints in the HF format (model_type "gemma3")."""

    name = "gemma3"
    model_class = "Gemma3ForConditionalGeneration"
    image_token = BOI_TOKEN
    position_rank = 1
    request_options = (PAN_AND_SCAN_OPTION,)

    # ------------------------------------------------------------------ run time (no torch)
    def runtime(self, manifest) -> Gemma3Runtime:
        return Gemma3Runtime(manifest)

    # ------------------------------------------------------------------ checkpoint facts (no torch)
    def processor_settings(self, model_dir: Path) -> dict:
        cfg, _ = read_processor_config(model_dir)
        return Gemma3ImageSettings.from_dict(cfg).to_dict()

    def max_crops(self, model_dir: Path) -> int:
        return Gemma3ImageSettings.from_dict(read_processor_config(model_dir)[0]).pan_and_scan_max_num_crops

    def dims(self, config) -> dict:
        v = config.vision_config
        return {**text_dims(config.text_config), "image_size": v.image_size, "patch_size": v.patch_size,
                "mm_tokens_per_image": int(config.mm_tokens_per_image)}

    def token_ids(self, config, model_dir: Path | None = None) -> dict:
        """The soft token is the image row; eos_token_id is generation_config.json's list (<eos>, <end_of_turn>)
        when the checkpoint has one."""
        ids = super().token_ids(config, model_dir)
        ids["eos_token_id"] = self.generation_eos(config, model_dir)
        ids.update(boi_token_id=int(config.boi_token_index), eoi_token_id=int(config.eoi_token_index))
        return ids

    def manifest_fields(self, config, model_dir: Path) -> dict:
        crops = 1 + self.max_crops(model_dir)
        return self.family_fields(
            config, model_dir, dims=self.dims(config),
            visual={"max_visual_tokens": crops * int(config.mm_tokens_per_image), "position_rank": 1,
                    "position_mode": "compact"},
            layout=chat_layout(BOI_TOKEN, "mm_tokens_per_image per crop (Gemma3Processor's image sequence)",
                               "chat-template", "0..L-1"),
            processor=self.processor_settings(model_dir), options={}, axes={"crops": [1, crops, crops]})

    # ------------------------------------------------------------------ export time (torch)
    def image_features(self, model, pixel_values):
        """pixel_values float [B,3,s,s] -> soft tokens float [B,T,d] (SigLIP last hidden state -> projector)."""
        return model.model.get_image_features(pixel_values=pixel_values).pooler_output

    def probe_example_visual(self, config) -> int:
        return int(config.mm_tokens_per_image)

    def export_specs(self, model, config, dtype) -> dict[str, ExportSpec]:
        """vision: pixel_values float [crops,3,s,s] -> image_features float [crops,T,d]."""
        import torch
        from torch.export import Dim

        from coverpruner.families.hf_graphs import VisionGraph

        s = config.vision_config.image_size
        return {"vision": ExportSpec(VisionGraph(self, model).eval(), (torch.randn(2, 3, s, s, dtype=dtype),),
                                     ["pixel_values"], ["image_features"], ({0: Dim("crops")},))}

    def decoder_spec(self, config) -> DecoderSpec:
        """Sliding windows on the sliding layers and bidirectional blocks (each crop's soft tokens) in prefill."""
        return DecoderSpec(attention=AttentionSpec(windows=attention_windows(config.text_config), blocks=True))

    def probe_parts(self, model):
        """The HF base's parts with Gemma's rotary module, which takes the layer type (layer 0's: its base)."""
        parts = super().probe_parts(model)
        lm = self.language_model(model)
        layer_type = lm.config.layer_types[0]
        rotary = lm.rotary_emb
        parts.rotary = lambda x, position_ids: rotary(x, position_ids, layer_type)
        return parts

    def decoder_weights(self, model) -> DecoderWeights:
        """Gemma's layer layout: input norm -> attention (q/k norm) -> post-attention norm -> residual; pre-ffn norm
        -> GELU-tanh MLP -> post-ffn norm -> residual; every RMSNorm scales by 1 + w (folded into the arrays here);
        scores scaled by query_pre_attn_scalar^-1/2; rotary per layer type (full: table 0, sliding: table 1)."""
        lm = self.language_model(model)
        cfg = lm.config

        def arr(t):
            return None if t is None else t.detach().float().numpy().copy()

        def norm(module):
            return arr(module.weight) + 1.0

        layers = []
        for layer in lm.layers:
            a, m = layer.self_attn, layer.mlp
            layers.append(DecoderLayerWeights(
                input_norm=norm(layer.input_layernorm), post_norm=norm(layer.pre_feedforward_layernorm),
                q=arr(a.q_proj.weight), k=arr(a.k_proj.weight), v=arr(a.v_proj.weight), q_bias=arr(a.q_proj.bias),
                k_bias=arr(a.k_proj.bias), v_bias=arr(a.v_proj.bias), o=arr(a.o_proj.weight),
                gate=arr(m.gate_proj.weight), up=arr(m.up_proj.weight), down=arr(m.down_proj.weight),
                q_norm=norm(a.q_norm), k_norm=norm(a.k_norm), attn_out_norm=norm(layer.post_attention_layernorm),
                mlp_out_norm=norm(layer.post_feedforward_layernorm)))
        if cfg.hidden_activation != "gelu_pytorch_tanh":
            raise ValueError(f"hidden_activation {cfg.hidden_activation!r} has no ORT-form MLP; export with "
                             "--decoder-form standard")
        full, local = _rope(cfg.rope_parameters["full_attention"]), _rope(cfg.rope_parameters["sliding_attention"])
        rotary = {**full, "mrope_section": None, "mrope_interleaved": False, "tables": [local],
                  "layer_tables": [1 if t == "sliding_attention" else 0 for t in cfg.layer_types]}
        return DecoderWeights(layers, norm(lm.norm), arr(self.lm_head(model).weight), float(cfg.rms_norm_eps),
                              cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, rotary,
                              activation="gelu_tanh", scale=float(cfg.query_pre_attn_scalar) ** -0.5)
