"""Qwen3-VL image preprocessing in numpy/PIL, torch-free: transformers' Qwen2-VL image processor as the Qwen3-VL
checkpoints configure it (16-px patches, merge 2: one visual token per 32x32 px; mean = std = 0.5).

convert to RGB -> smart_resize (both sides multiples of 32 px, pixel count within [min_pixels, max_pixels], aspect
ratio kept as closely as possible) -> PIL bicubic resize -> rescale in float64 then float32 -> normalize in float32
-> patches [N, C*T*P*P] = [N, 1536] in merge-block-major order (the 2x2 patches of one merged token consecutive),
the frame repeated T = 2 times, grid_thw = (1, H/16, W/16).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

from coverpruner.errors import ImageError
from coverpruner.images import load_rgb


@dataclass(frozen=True)
class Qwen3ImageSettings:
    """The preprocessor_config.json fields that matter (defaults: the Qwen3-VL Instruct checkpoints')."""

    min_pixels: int = 65536
    max_pixels: int = 16777216
    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    resample: int = 3  # PIL.Image.BICUBIC
    rescale_factor: float = 1 / 255
    image_mean: tuple = (0.5, 0.5, 0.5)
    image_std: tuple = (0.5, 0.5, 0.5)

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_dict(cls, d: dict) -> "Qwen3ImageSettings":
        """From preprocessor_config.json (size {"shortest_edge": min_pixels, "longest_edge": max_pixels}, the
        deprecated top-level min_pixels / max_pixels winning as in HF) or from to_dict's flat form."""
        kw = {}
        size = d.get("size") or {}
        if "shortest_edge" in size:
            kw["min_pixels"] = int(size["shortest_edge"])
        if "longest_edge" in size:
            kw["max_pixels"] = int(size["longest_edge"])
        for key in ("min_pixels", "max_pixels", "patch_size", "temporal_patch_size", "merge_size", "resample"):
            if d.get(key) is not None:
                kw[key] = int(d[key])
        if d.get("rescale_factor") is not None:
            kw["rescale_factor"] = float(d["rescale_factor"])
        for key in ("image_mean", "image_std"):
            if d.get(key) is not None:
                v = d[key]
                kw[key] = tuple(float(x) for x in (v if isinstance(v, (list, tuple)) else [v] * 3))
        return cls(**kw)

    def to_dict(self) -> dict:
        return {"min_pixels": self.min_pixels, "max_pixels": self.max_pixels, "patch_size": self.patch_size,
                "temporal_patch_size": self.temporal_patch_size, "merge_size": self.merge_size,
                "resample": self.resample, "rescale_factor": self.rescale_factor,
                "image_mean": list(self.image_mean), "image_std": list(self.image_std)}


@dataclass(frozen=True)
class Qwen3Image:
    """pixel_values float32 [N, C*T*P*P] (N = gh*gw, merge-block-major); grid_thw (1, gh, gw) in 16-px patches;
    resized / original (H, W) in pixels. Visual tokens: gh*gw / merge^2."""

    pixel_values: np.ndarray
    grid_thw: tuple[int, int, int]
    resized: tuple[int, int]
    original: tuple[int, int]

    @property
    def num_visual_tokens(self) -> int:
        t, h, w = self.grid_thw
        return t * h * w // 4


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(H, W) the processor resizes a height x width image to. ValueError for an aspect ratio above 200."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def patchify(frames: np.ndarray, s: Qwen3ImageSettings) -> tuple[np.ndarray, tuple[int, int, int]]:
    """float32 [F, C, H, W] (F a multiple of T) -> (float32 [t*gh*gw, C*T*P*P], (t, gh, gw)): rows by (temporal
    patch, merged row, merged col, row and col inside the merge block), columns by (channel, frame, patch row,
    patch col)."""
    p, m, tp = s.patch_size, s.merge_size, s.temporal_patch_size
    f, c, height, width = frames.shape
    t, gh, gw = f // tp, height // p, width // p
    x = frames.reshape(t, tp, c, gh // m, m, p, gw // m, m, p).transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(x.reshape(t * gh * gw, c * tp * p * p), dtype=np.float32), (t, gh, gw)


def normalize(rgb: np.ndarray, s: Qwen3ImageSettings) -> np.ndarray:
    """uint8 [H, W, 3] -> float32 [3, H, W]: rescale in float64 then float32 (as HF), normalize in float32."""
    x = (np.moveaxis(rgb, -1, 0).astype(np.float64) * s.rescale_factor).astype(np.float32)
    return (x - np.asarray(s.image_mean, np.float32)[:, None, None]) / np.asarray(s.image_std, np.float32)[:, None, None]


def preprocess_image(image, s: Qwen3ImageSettings) -> Qwen3Image:
    """Image (path / PIL / uint8 array) -> Qwen3Image. ImageError (one line) for unreadable images and sizes the
    processor refuses."""
    _, rgb = load_rgb(image, True)
    h, w = rgb.shape[:2]
    try:
        nh, nw = smart_resize(h, w, s.factor, s.min_pixels, s.max_pixels)
    except ValueError as exc:
        raise ImageError(f"image {w}x{h}: {exc}") from None
    if (nh, nw) != (h, w):
        rgb = np.asarray(Image.fromarray(rgb).resize((nw, nh), resample=s.resample))
    x = normalize(rgb, s)
    patches, grid = patchify(np.repeat(x[None], s.temporal_patch_size, axis=0), s)
    return Qwen3Image(patches, grid, (nh, nw), (int(h), int(w)))
