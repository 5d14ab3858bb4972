"""Export time of the planted family: LLaVA-1.5 whose vision graph also returns two DeepStack-like levels.

Level k = image_features @ heads[k].T, heads float32 [2, d, d] read from the checkpoint's deepstack_heads.npy;
the decoder adds level k to the hidden states that decoder layer k outputs, at the image rows (as Qwen3-VL's
DeepStack adds its k-th visual level after layer k).
"""

import dataclasses
from pathlib import Path

import numpy as np

from coverpruner.families.contract import DecoderExtra, DecoderSpec
from coverpruner.families.llava.family import LlavaFamily
from planted_deepstack.runtime import EXTRAS, DeepStackRuntime

HEADS_FILE = "deepstack_heads.npy"


class DeepStackLlava(LlavaFamily):
    name = "planted_deepstack"

    def runtime(self, manifest):
        return DeepStackRuntime(manifest)

    def decoder_spec(self, config) -> DecoderSpec:
        return DecoderSpec(tuple(DecoderExtra(name, layer) for name, layer in EXTRAS.items()))

    def load_model(self, model_dir, dtype: str = "float32"):
        import torch

        model = super().load_model(model_dir, dtype)
        heads = np.load(Path(model_dir) / HEADS_FILE)
        model.deepstack_heads = torch.nn.Parameter(torch.from_numpy(heads).to(getattr(torch, dtype)),
                                                   requires_grad=False)
        return model

    def export_specs(self, model, config, dtype):
        """vision: pixel_values [B,3,s,s] -> image_features, visual_extra.0, visual_extra.1, each [B,n,d]."""
        import torch

        family = self

        class Vision(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, pixel_values):
                feats = family.image_features(self.model, pixel_values)
                return (feats, *(feats @ self.model.deepstack_heads[k].T for k in range(len(EXTRAS))))

        spec = super().export_specs(model, config, dtype)["vision"]
        return {"vision": dataclasses.replace(spec, module=Vision().eval(),
                                              output_names=["image_features", *EXTRAS])}
