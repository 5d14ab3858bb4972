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
from dataclasses import asdict, dataclass

import numpy as np

from coverpruner.families.clip import ImageSettings, preprocess_image
from coverpruner.images import load_rgb


@dataclass(frozen=True)
class Gemma3ImageSettings:
    """The processor settings the runtime needs (manifest ``processor``; HF's preprocessor config keys)."""

    size: int = 896
    resample: int = 2  # PIL.Image.BILINEAR
    rescale_factor: float = 1 / 255
    image_mean: tuple = (0.5, 0.5, 0.5)
    image_std: tuple = (0.5, 0.5, 0.5)
    do_pan_and_scan: bool = False
    pan_and_scan_min_crop_size: int = 256
    pan_and_scan_max_num_crops: int = 4
    pan_and_scan_min_ratio_to_activate: float = 1.2

    @classmethod
    def from_dict(cls, d: dict) -> "Gemma3ImageSettings":
        """The manifest's ``processor`` block, or an HF Gemma3ImageProcessor config (its null pan-and-scan values
        take Gemma3Processor's defaults, as the processor does). ValueError (one line) for a non-square size."""
        kw = {}
        size = d.get("size")
        if isinstance(size, dict):
            if size.get("height") != size.get("width"):
                raise ValueError(f"Gemma 3 processor size {size} is not square")
            kw["size"] = int(size["height"])
        elif size is not None:
            kw["size"] = int(size)
        for key, cast in (("resample", int), ("rescale_factor", float), ("do_pan_and_scan", bool),
                          ("pan_and_scan_min_crop_size", int), ("pan_and_scan_max_num_crops", int),
                          ("pan_and_scan_min_ratio_to_activate", float)):
            if d.get(key) is not None:
                kw[key] = cast(d[key])
        for key in ("image_mean", "image_std"):
            if d.get(key) is not None:
                v = d[key]
                kw[key] = tuple(float(x) for x in (v if isinstance(v, (list, tuple)) else [v] * 3))
        return cls(**kw)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["image_mean"], out["image_std"] = list(self.image_mean), list(self.image_std)
        return out

    @property
    def clip(self) -> ImageSettings:
        """CLIP's steps with a fixed size and no center crop: exactly Gemma3ImageProcessorPil's per-image steps."""
        return ImageSettings(shortest_edge=None, height=self.size, width=self.size, crop_height=self.size,
                             crop_width=self.size, resample=self.resample, do_center_crop=False,
                             rescale_factor=self.rescale_factor, image_mean=self.image_mean, image_std=self.image_std)


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
    pixels = np.concatenate([preprocess_image(part, s.clip) for part in parts])
    return pixels, (width, height), boxes
