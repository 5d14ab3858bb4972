"""The torch vision wrapper of the families whose vision graph is one call of `Family.image_features`
(LLaVA-1.5, LLaVA-NeXT). Export time only: importing this module imports torch, so the families import it
inside `export_specs`."""

from __future__ import annotations

import torch
from torch import nn


class VisionGraph(nn.Module):
    """pixel_values float [B,3,H,W] -> image_features float [B,n,d] (vision tower, feature layer, projector).

    Holds references to the HF model's submodules (no copies of weights); B is the batch or the tile axis."""

    def __init__(self, family, model):
        super().__init__()
        self.family, self.model = family, model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.family.image_features(self.model, pixel_values)
