"""LLaVA-NeXT's run-time rules (numpy only): anyres tiles, per-request n, HF packing with the stored
image_newline vector, the newline policy, compact positions."""

from __future__ import annotations

import numpy as np

from coverpruner.families.contract import GridPanel, ImageSpan, RequestOption, VisionInputs
from coverpruner.families.hf import CompactPositions, HFRuntime
from coverpruner.families.llava_next.anyres import AnyresGeometry, AnyresSettings, pack_features, prepare_tiles

IMAGE_TOKEN = "<image>"
NEWLINE_POLICIES = ("drop", "keep")
NEWLINE_FILE = "image_newline.npy"  # float32 [d], in the engine dir
NEWLINE_OPTION = RequestOption(
    "newline_policy", "image_newline rows of a pruned LLaVA-NeXT image: 'drop' them with the pruned tokens "
    "(default) or 'keep' all of them", default="drop", choices=NEWLINE_POLICIES, metavar="drop|keep")


def panels(geo: AnyresGeometry, s: AnyresSettings) -> tuple[GridPanel, GridPanel]:
    """The two picture panels of one image, in original-image pixels.

    base: p x p cells over the whole image (the base tile is the image squeezed to tile x tile).
    high-res: (gh*p) x (gw*p) cells over the padded canvas mapped back through the resize and the centred
    paste (the box extends past the image where the model saw padding); cells cut by unpadding are -1.
    """
    height, width = geo.image_size
    p = geo.p
    base = GridPanel("base image", (p, p), (0.0, 0.0, float(width), float(height)), np.arange(p * p, dtype=np.int64))
    sy, sx = height / geo.resized[0], width / geo.resized[1]
    top, left = geo.paste
    box = (-left * sx, -top * sy, (geo.best[1] - left) * sx, (geo.best[0] - top) * sy)
    cells = np.full((geo.grid[0] * p, geo.grid[1] * p), -1, dtype=np.int64)
    (r0, r1), (c0, c1) = geo.rows_kept, geo.cols_kept
    cells[r0:r1, c0:c1] = p * p + np.arange((r1 - r0) * (c1 - c0)).reshape(r1 - r0, c1 - c0)
    return base, GridPanel("high-res", cells.shape, box, cells.reshape(-1))


class LlavaNextRuntime(CompactPositions, HFRuntime):
    """LLaVA-NeXT's run-time rules for one engine dir (contract.FamilyRuntime)."""

    image_token = IMAGE_TOKEN

    def __init__(self, manifest):
        super().__init__(manifest)
        self.settings = AnyresSettings.from_dict(manifest.processor)
        path = manifest.files.get("image_newline")
        if path is None:
            raise ValueError("manifest has no files.image_newline (the LLaVA-NeXT newline vector); re-export")
        newline = np.load(path)
        if newline.ndim != 1 or newline.shape[0] != int(manifest.dims["hidden_size"]):
            raise ValueError(f"{path.name}: expected float32 [{manifest.dims['hidden_size']}], got {newline.shape}")
        self.newline = newline

    def prepare_image(self, image, options: dict) -> VisionInputs:
        """pixel_values [tiles,3,s,s] in the graph's float dtype (base image first), n, the two panels."""
        pixels, geo = prepare_tiles(image, self.settings)
        return VisionInputs({"pixel_values": pixels.astype(self.float_dtype)}, geo.num_candidates,
                            panels(geo, self.settings), {"geometry": geo})

    def image_span(self, outputs: dict, vision: VisionInputs, options: dict) -> ImageSpan:
        """image_features [tiles,p*p,d] -> packed rows [S,d]; candidates: the non-newline rows; always kept:
        the newline rows under newline_policy 'keep'."""
        geo = vision.facts["geometry"]
        rows = pack_features(outputs["image_features"], geo, self.newline)
        mask = geo.newline_mask()
        always = np.flatnonzero(mask) if options.get(NEWLINE_OPTION.name) == "keep" else np.zeros(0, np.int64)
        return ImageSpan(rows, np.flatnonzero(~mask).astype(np.int64), always.astype(np.int64))
