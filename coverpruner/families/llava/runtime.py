"""LLaVA-1.5's run-time rules (numpy only): one CLIP crop, n fixed by the checkpoint, every image row a
candidate, compact positions."""

from __future__ import annotations

import numpy as np

from coverpruner.families.clip import ImageSettings, crop_box, preprocess_image
from coverpruner.families.contract import GridPanel, ImageSpan, VisionInputs
from coverpruner.families.hf import CompactPositions, HFRuntime
from coverpruner.images import load_image

IMAGE_TOKEN = "<image>"


class LlavaRuntime(CompactPositions, HFRuntime):
    """LLaVA-1.5's run-time rules for one engine dir (contract.FamilyRuntime)."""

    image_token = IMAGE_TOKEN

    def __init__(self, manifest):
        super().__init__(manifest)
        self.settings = ImageSettings.from_dict(manifest.processor)
        self.n = manifest.max_visual_tokens
        dims = manifest.dims
        self.side = int(dims["image_size"]) // int(dims["patch_size"])

    def prepare_image(self, image, options: dict) -> VisionInputs:
        """pixel_values [1,3,s,s] in the graph's float dtype; one panel: the crop's patch grid."""
        img = load_image(image)
        pixel_values = preprocess_image(img, self.settings).astype(self.float_dtype)
        grid = self.side * self.side
        # "full" select strategy keeps CLS as candidate 0: it has no cell in the picture
        cells = np.arange(self.n - grid, self.n, dtype=np.int64)
        panel = GridPanel("patches", (self.side, self.side), crop_box(img.width, img.height, self.settings),
                          cells)
        return VisionInputs({"pixel_values": pixel_values}, self.n, (panel,), {"size": (img.width, img.height)})

    def image_span(self, outputs: dict, vision: VisionInputs, options: dict) -> ImageSpan:
        """image_features [1,n,d] -> rows [n,d], all candidates."""
        feats = outputs["image_features"]
        if feats.ndim != 3 or feats.shape[:2] != (1, self.n):
            raise ValueError(f"vision graph returned image_features {list(feats.shape)}, expected [1, {self.n}, d]")
        return ImageSpan(feats[0], np.arange(self.n, dtype=np.int64))
