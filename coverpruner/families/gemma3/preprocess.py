"""Gemma 3 image preprocessing (numpy + PIL): transformers' Gemma3ImageProcessorPil, step for step.

One image -> pixel_values float32 [1 + c, 3, s, s]: the whole image first, then its c pan-and-scan crops (c = 0
unless pan-and-scan is on and the image is elongated enough), each resized to s x s (no aspect-ratio keeping, PIL
bilinear), rescaled (float64 x 1/255 -> float32) and normalized with mean = std = 0.5, as CLIP's steps
(families/clip.py) with a fixed size and no center crop. Pan-and-scan (Gemma3ImageProcessorPil.pan_and_scan) cuts
the RGB image, before the resize, into 2..max_num_crops equal columns (landscape) or rows (portrait) when its aspect
ratio reaches min_ratio_to_activate, as many as round(aspect) but no crop narrower than min_crop_size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import numpy as np

from coverpruner.families.clip import ImageSettings, preprocess_image
from coverpruner.images import load_rgb


@dataclass(frozen=True)
class Gemma3ImageSettings:
    """The processor settings the runtime needs (manifest ``processor``; HF's preprocessor config keys): the
    per-crop steps as CLIP's settings (a fixed square size, no center crop) and pan-and-scan's."""

    clip: ImageSettings = ImageSettings(shortest_edge=None, height=896, width=896, crop_height=896, crop_width=896,
                                        resample=2, do_center_crop=False, image_mean=(0.5,) * 3, image_std=(0.5,) * 3)
    do_pan_and_scan: bool = False
    pan_and_scan_min_crop_size: int = 256
    pan_and_scan_max_num_crops: int = 4
    pan_and_scan_min_ratio_to_activate: float = 1.2

    @classmethod
    def from_dict(cls, d: dict) -> "Gemma3ImageSettings":
        """The manifest's ``processor`` block, or an HF Gemma3ImageProcessor config (its null pan-and-scan values
        take Gemma3Processor's defaults, as the processor does; no mean / std: 0.5, its defaults). ValueError (one
        line) for a size that is not a fixed square."""
        base = ImageSettings.from_dict({"image_mean": [0.5] * 3, "image_std": [0.5] * 3, "resample": 2,
                                        **{k: v for k, v in d.items() if v is not None}})
        if base.shortest_edge is not None or base.height != base.width:
            raise ValueError(f"Gemma 3 processor size {d.get('size')!r} is not a fixed square")
        kw = {"clip": replace(base, do_center_crop=False, crop_height=base.height, crop_width=base.width)}
        for f in fields(cls)[1:]:
            if d.get(f.name) is not None:
                kw[f.name] = type(getattr(cls, f.name))(d[f.name])
        return cls(**kw)

    @property
    def size(self) -> int:
        return self.clip.height

    def to_dict(self) -> dict:
        """The flat form stored in a manifest (round-trips through `from_dict`)."""
        c = self.clip
        return {"size": {"height": c.height, "width": c.width}, "resample": c.resample,
                "rescale_factor": c.rescale_factor, "image_mean": list(c.image_mean), "image_std": list(c.image_std),
                **{f.name: getattr(self, f.name) for f in fields(self)[1:]}}


def pan_and_scan_boxes(width: int, height: int, s: Gemma3ImageSettings) -> list[tuple[int, int, int, int]]:
    """(left, top, right, bottom) of each pan-and-scan crop in image pixels, row-major ([] when the image is not
    elongated enough or the crops would be too small); the last crop of a row or column ends at the image edge (HF
    slices ceil(size / count) pixels, cut short there)."""
    if width >= height:
        if width / height < s.pan_and_scan_min_ratio_to_activate:
            return []
        cols = min(int(math.floor(width / s.pan_and_scan_min_crop_size)), int(math.floor(width / height + 0.5)))
        cols, rows = min(s.pan_and_scan_max_num_crops, max(2, cols)), 1
    else:
        if height / width < s.pan_and_scan_min_ratio_to_activate:
            return []
        rows = min(int(math.floor(height / s.pan_and_scan_min_crop_size)), int(math.floor(height / width + 0.5)))
        rows, cols = min(s.pan_and_scan_max_num_crops, max(2, rows)), 1
    crop_w, crop_h = int(math.ceil(width / cols)), int(math.ceil(height / rows))
    if min(crop_w, crop_h) < s.pan_and_scan_min_crop_size:
        return []
    return [(c * crop_w, r * crop_h, min(width, (c + 1) * crop_w), min(height, (r + 1) * crop_h))
            for r in range(rows) for c in range(cols)]


def preprocess(image, s: Gemma3ImageSettings, pan_and_scan: bool) -> tuple[np.ndarray, tuple[int, int], list]:
    """Image (path / PIL / uint8 array) -> (pixel_values float32 [1 + c, 3, s, s], (width, height) of the RGB image,
    the c crop boxes in its pixels)."""
    _, rgb = load_rgb(image, True)
    height, width = rgb.shape[:2]
    boxes = pan_and_scan_boxes(width, height, s) if pan_and_scan else []
    parts = [rgb] + [np.ascontiguousarray(rgb[top:bottom, left:right]) for left, top, right, bottom in boxes]
    pixels = np.concatenate([preprocess_image(part, s.clip) for part in parts])  # CLIP's steps: bit-equal to HF's
    return pixels, (width, height), boxes
