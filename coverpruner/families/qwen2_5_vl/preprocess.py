"""Qwen2-VL image preprocessing in numpy/PIL (what Qwen2.5-VL checkpoints use), torch-free.

Reproduces transformers' `Qwen2VLImageProcessorPil` step for step (same dtypes, same rounding): convert to
RGB -> `smart_resize` (both sides multiples of patch*merge = 28 px, pixel count within [min_pixels,
max_pixels], aspect ratio kept as closely as possible) -> PIL resize (bicubic) -> rescale in float64 then
float32 -> normalize in float32 -> patchify to [N, C*T*P*P] = [N, 1176] in merge-block-major order (the 2x2
patches of one merged token are consecutive), with grid_thw = (1, H/14, W/14).

A request may fix the resolution, `image_size=(W, H)` (the paper runs 1008x1008 = 1,296 visual tokens):
the image is resized to exactly W x H, which is accepted only where the processor itself could have
produced that size (multiples of 28, pixels within the checkpoint's limits, aspect ratio < 200).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

from coverpruner.errors import ImageError
from coverpruner.families.hf import CLIP_MEAN, CLIP_STD
from coverpruner.images import load_rgb


@dataclass(frozen=True)
class QwenImageSettings:
    """The checkpoint's preprocessor_config.json (Qwen2VLImageProcessor) fields that matter."""

    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    resample: int = 3  # PIL.Image.BICUBIC
    do_convert_rgb: bool = True
    do_resize: bool = True
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple = CLIP_MEAN
    image_std: tuple = CLIP_STD

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_dict(cls, d: dict) -> "QwenImageSettings":
        """From preprocessor_config.json: `size={"shortest_edge": min_pixels, "longest_edge": max_pixels}`
        (the deprecated top-level min_pixels/max_pixels override it, as HF's constructor does)."""
        kw = {}
        size = d.get("size") or {}
        if "shortest_edge" in size:
            kw["min_pixels"] = int(size["shortest_edge"])
        if "longest_edge" in size:
            kw["max_pixels"] = int(size["longest_edge"])
        for key in ("min_pixels", "max_pixels", "patch_size", "temporal_patch_size", "merge_size", "resample"):
            if d.get(key) is not None:
                kw[key] = int(d[key])
        for key in ("do_convert_rgb", "do_resize", "do_rescale", "do_normalize"):
            if d.get(key) is not None:
                kw[key] = bool(d[key])
        if d.get("rescale_factor") is not None:
            kw["rescale_factor"] = float(d["rescale_factor"])
        for key in ("image_mean", "image_std"):
            if d.get(key) is not None:
                v = d[key]
                kw[key] = tuple(float(x) for x in (v if isinstance(v, (list, tuple)) else [v] * 3))
        return cls(**kw)

    def to_dict(self) -> dict:
        """The flat form stored in a manifest (round-trips through `from_dict`)."""
        return {"min_pixels": self.min_pixels, "max_pixels": self.max_pixels, "patch_size": self.patch_size,
                "temporal_patch_size": self.temporal_patch_size, "merge_size": self.merge_size,
                "resample": self.resample, "do_convert_rgb": self.do_convert_rgb, "do_resize": self.do_resize,
                "do_rescale": self.do_rescale, "rescale_factor": self.rescale_factor,
                "do_normalize": self.do_normalize, "image_mean": list(self.image_mean),
                "image_std": list(self.image_std)}


@dataclass(frozen=True)
class QwenImage:
    """One preprocessed image.

    pixel_values: float32 [N, C*T*P*P] patches in merge-block-major order (N = gh*gw);
    grid_thw: (1, gh, gw) in 14-px patches; resized: (H, W) in pixels of the resized image;
    original: (H, W) of the input image. The number of visual tokens is n = gh*gw / merge^2.
    """

    pixel_values: np.ndarray
    grid_thw: tuple[int, int, int]
    resized: tuple[int, int]
    original: tuple[int, int]

    @property
    def num_visual_tokens(self) -> int:
        t, h, w = self.grid_thw
        return t * h * w // 4


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(H, W) the Qwen2-VL processor resizes a height x width image to (the processor's own rule).

    Raises ValueError for an aspect ratio above 200 (as HF does).
    """
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def check_image_size(image_size, s: QwenImageSettings) -> tuple[int, int]:
    """Validate a requested fixed resolution (W, H); returns (H, W). ValueError (one line) unless the
    processor's rules could produce it: W and H positive multiples of 28, min_pixels <= W*H <= max_pixels,
    aspect ratio at most 200."""
    try:
        w, h = (int(v) for v in image_size)
        if (w, h) != tuple(image_size):
            raise ValueError
    except (TypeError, ValueError):
        raise ValueError(f"image_size must be (width, height) in pixels, got {image_size!r}") from None
    f = s.factor
    if w <= 0 or h <= 0 or w % f or h % f:
        raise ValueError(f"image_size {w}x{h}: width and height must be positive multiples of {f} px "
                         f"(patch {s.patch_size} x merge {s.merge_size})")
    if not s.min_pixels <= w * h <= s.max_pixels:
        raise ValueError(f"image_size {w}x{h} = {w * h} pixels is outside the checkpoint's limits "
                         f"[{s.min_pixels}, {s.max_pixels}]")
    if max(w, h) / min(w, h) > 200:
        raise ValueError(f"image_size {w}x{h}: aspect ratio must be at most 200")
    return h, w


def patchify(chw: np.ndarray, s: QwenImageSettings) -> tuple[np.ndarray, int, int]:
    """float32 [C,H,W] -> ([gh*gw, C*T*P*P] float32, gh, gw); rows are grouped by merged token (2x2 blocks
    row-major inside, blocks row-major over the image), the frame repeated T times like HF."""
    c, height, width = chw.shape
    p, m, t = s.patch_size, s.merge_size, s.temporal_patch_size
    gh, gw = height // p, width // p
    x = chw.reshape(c, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)  # (bh, bw, mh, mw, C, ph, pw)
    x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], t, p, p))
    return np.ascontiguousarray(x.reshape(gh * gw, c * t * p * p), dtype=np.float32), gh, gw


def preprocess_qwen_image(image, s: QwenImageSettings, image_size=None) -> QwenImage:
    """Image (path / PIL / uint8 array) -> QwenImage; `image_size=(W, H)` fixes the resolution (see module doc).

    Raises ImageError for unreadable images and ValueError for an image_size the processor could not produce.
    """
    fixed = check_image_size(image_size, s) if image_size is not None else None
    _, rgb = load_rgb(image, s.do_convert_rgb)
    original = rgb.shape[:2]
    h, w = original
    if fixed is not None:
        nh, nw = fixed
    elif s.do_resize:
        try:
            nh, nw = smart_resize(h, w, s.factor, s.min_pixels, s.max_pixels)
        except ValueError as exc:
            raise ImageError(f"image {w}x{h}: {exc}") from None
    else:
        nh, nw = h, w
    if (nh, nw) != (h, w):
        hwc = rgb[:, :, 0] if rgb.shape[2] == 1 else rgb
        resized = np.asarray(Image.fromarray(hwc).resize((nw, nh), resample=s.resample))
        rgb = resized[:, :, None] if resized.ndim == 2 else resized
    if nh % s.factor or nw % s.factor:
        raise ImageError(f"image {nw}x{nh} is not a multiple of {s.factor} px (do_resize is off)")
    x = np.ascontiguousarray(np.moveaxis(rgb, -1, 0))  # uint8 [C,H,W]
    if s.do_rescale:
        x = (x.astype(np.float64) * s.rescale_factor).astype(np.float32)  # float64 multiply, as HF's rescale
    if s.do_normalize:
        x = x.astype(np.float32, copy=False)
        x = (x - np.asarray(s.image_mean, np.float32)[:, None, None]) / np.asarray(s.image_std, np.float32)[:, None, None]
    patches, gh, gw = patchify(x.astype(np.float32, copy=False), s)
    return QwenImage(patches, (1, gh, gw), (nh, nw), (int(original[0]), int(original[1])))
