"""Export time of the planted family: LLaVA-1.5 with a hybrid language model (LlavaForConditionalGeneration loads any
text model by its config; here transformers' Qwen3_5TextModel). Its decoder declares the states of its Gated
DeltaNet layers and its probe reads the first full-attention layer, through the shared hybrid-decoder helpers of
families/gated_delta.py; the vision tower, layout and compact positions are LLaVA-1.5's."""

from coverpruner.families import gated_delta
from coverpruner.families.llava.family import LlavaFamily


class HybridLlava(LlavaFamily):
    name = "planted_hybrid"

    def load_model(self, model_dir, dtype: str = "float32"):
        model = super().load_model(model_dir, dtype)
        gated_delta.make_exportable(self.language_model(model))
        return model

    def apply_rope(self):
        from transformers.models.qwen3_5.modeling_qwen3_5 import apply_rotary_pos_emb  # a partial rotary

        return apply_rotary_pos_emb

    def dims(self, config) -> dict:
        """LLaVA's dims and the dims its partial rotary turns (what lets export pick the ORT form for it)."""
        return {**super().dims(config), "rotary_dim": gated_delta.rotary_dim(config.text_config)}

    def decoder_spec(self, config):
        return gated_delta.decoder_spec(config.text_config)

    def probe_parts(self, model):
        return gated_delta.probe_parts(self.language_model(model), self.apply_rope())

    def decoder_weights(self, model):
        return gated_delta.decoder_weights(self.language_model(model), self.lm_head(model))
