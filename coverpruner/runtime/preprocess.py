"""CLIP-style image preprocessing in numpy/PIL from saved processor settings.

Reproduces the steps (and their dtypes and rounding) of transformers' PIL image processors
(CLIPImageProcessorPil / LlavaImageProcessorPil): convert to RGB compositing alpha on white ->
optional pad-to-square with the mean colour -> resize the shortest edge with PIL -> center crop
(zero-padding if too small) -> rescale in float64 then cast to float32 -> normalize in float32.
The output equals the HF processor's ``pixel_values`` exactly for the same settings.
"""

from __future__ import annotations

import math
import os
import re
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from coverpruner.runtime.errors import ImageError, ManifestError

_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class ImageSettings:
    """Processor settings. ``shortest_edge`` None with ``height``/``width`` set means a fixed resize."""

    shortest_edge: int | None = 336
    height: int | None = None
    width: int | None = None
    crop_height: int = 336
    crop_width: int = 336
    resample: int = 3  # PIL.Image.BICUBIC
    do_convert_rgb: bool = True
    do_pad: bool = False
    do_resize: bool = True
    do_center_crop: bool = True
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple = _CLIP_MEAN
    image_std: tuple = _CLIP_STD

    @classmethod
    def from_dict(cls, d: dict) -> "ImageSettings":
        """Accept the manifest's flat ``processor`` block or an HF preprocessor_config.json dict."""
        kw = {}
        size = d.get("size")
        if isinstance(size, dict):
            if "shortest_edge" in size:
                kw["shortest_edge"] = int(size["shortest_edge"])
            elif "height" in size and "width" in size:
                kw.update(shortest_edge=None, height=int(size["height"]), width=int(size["width"]))
            else:
                raise ManifestError(f"processor size {size!r}: expected 'shortest_edge' or 'height'+'width'")
        elif isinstance(size, int):
            kw["shortest_edge"] = size
        if "shortest_edge" in d:
            kw["shortest_edge"] = int(d["shortest_edge"])
        crop = d.get("crop_size")
        if isinstance(crop, dict):
            kw.update(crop_height=int(crop["height"]), crop_width=int(crop["width"]))
        elif crop is not None:
            kw.update(crop_height=int(crop), crop_width=int(crop))
        for key in ("resample",):
            if key in d:
                kw[key] = int(d[key])
        for key in ("do_convert_rgb", "do_pad", "do_resize", "do_center_crop", "do_rescale", "do_normalize"):
            if d.get(key) is not None:
                kw[key] = bool(d[key])
        if d.get("rescale_factor") is not None:
            kw["rescale_factor"] = float(d["rescale_factor"])
        for key in ("image_mean", "image_std"):
            if d.get(key) is not None:
                v = d[key]
                kw[key] = tuple(float(x) for x in (v if isinstance(v, (list, tuple)) else [v] * 3))
        return cls(**kw)

    @property
    def output_size(self) -> tuple[int, int]:
        """(H, W) of pixel_values when center-cropping (the usual CLIP setting)."""
        if self.do_center_crop:
            return self.crop_height, self.crop_width
        return self.height or self.shortest_edge, self.width or self.shortest_edge


#: Longest side / shortest side accepted. The preprocessors scale the short side up to the model's input (CLIP:
#: 336 px), so a 20,000 x 1 image became a 336 x 6.7M intermediate (5.5 GB, 8-14 s); 50:1 bounds it at 5.6 MP.
#: Qwen2-VL's own processor refuses ratios above 200.
MAX_ASPECT_RATIO = 50


def check_aspect_ratio(size, what: str) -> None:
    """(width, height) -> ImageError when more elongated than MAX_ASPECT_RATIO : 1 (empty images are left to the
    decoder's own message)."""
    w, h = int(size[0]), int(size[1])
    if w >= 1 and h >= 1 and max(w, h) > MAX_ASPECT_RATIO * min(w, h):
        raise ImageError(f"{what} is {w} x {h} pixels (aspect ratio {max(w, h) / min(w, h):.0f}:1); the limit is "
                         f"{MAX_ASPECT_RATIO}:1")


def load_image(image) -> Image.Image:
    """Open a path (str/PathLike) or pass a PIL image through; ImageError on missing/corrupt files."""
    if isinstance(image, Image.Image):
        check_aspect_ratio(image.size, "image")
        return image
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim not in (2, 3):
            raise ImageError(f"numpy image must be uint8 [H,W] or [H,W,C], got {image.dtype} {image.shape}")
        check_aspect_ratio(image.shape[1::-1], "image")
        return Image.fromarray(image)
    if not isinstance(image, (str, os.PathLike)):
        raise ImageError(f"image must be a path, a PIL image or a uint8 array, got {type(image).__name__}")
    path = Path(image)
    if not path.is_file():
        raise ImageError(f"image not found: {path}")
    try:
        with warnings.catch_warnings():
            # PIL only warns between MAX_IMAGE_PIXELS and twice that, then decodes gigabytes: refuse it as well
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(path)
            check_aspect_ratio(img.size, str(path))  # from the header, before decoding
            img.load()  # decode now so truncated files fail here, not deep inside resize
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        size = re.search(r"\((\d+) pixels\)", str(exc))
        pixels = f"{int(size.group(1)):,} pixels" if size else "too many pixels"
        raise ImageError(f"image {path} has {pixels}, over the decompression-bomb limit of {Image.MAX_IMAGE_PIXELS} "
                         "pixels (PIL.Image.MAX_IMAGE_PIXELS)") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError, struct.error, IndexError,
            KeyError, TypeError, MemoryError) as exc:
        # what PIL's decoders raise on malformed files (EOFError, struct.error, IndexError, ... from plugins)
        raise ImageError(f"cannot read image {path}: {type(exc).__name__}: {exc}") from None
    return img


def to_rgb(img: Image.Image) -> np.ndarray:
    """uint8 [H,W,3]; transparency is composited onto white like transformers' convert_to_rgb."""
    has_alpha = "A" in img.getbands() or img.info.get("transparency") is not None
    if has_alpha:
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        img = Image.alpha_composite(white, rgba)
    return np.asarray(img.convert("RGB"))


def _pad_to_square(chw: np.ndarray, color) -> np.ndarray:
    c, h, w = chw.shape
    if h == w:
        return chw
    side = max(h, w)
    out = np.empty((c, side, side), dtype=chw.dtype)
    out[:] = np.asarray(color, dtype=chw.dtype)[:, None, None]
    if w > h:
        top = (side - h) // 2
        out[:, top:top + h, :] = chw
    else:
        left = (side - w) // 2
        out[:, :, left:left + w] = chw
    return out


def resize_size(h: int, w: int, s: ImageSettings) -> tuple[int, int]:
    """(height, width) the CLIP resize step gives an h x w image (shortest edge, or the fixed size)."""
    if s.shortest_edge is None:
        return s.height, s.width
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = s.shortest_edge, int(s.shortest_edge * long / short)
    return (new_long, new_short) if w <= h else (new_short, new_long)


def _center_crop(chw: np.ndarray, ch: int, cw: int) -> np.ndarray:
    _, h, w = chw.shape
    top, left = (h - ch) // 2, (w - cw) // 2
    if top >= 0 and left >= 0 and top + ch <= h and left + cw <= w:
        return chw[:, top:top + ch, left:left + cw]
    # too small: zero-pad centred (ceil on the leading side), then crop
    nh, nw = max(ch, h), max(cw, w)
    padded = np.zeros((chw.shape[0], nh, nw), dtype=chw.dtype)
    tp, lp = math.ceil((nh - h) / 2), math.ceil((nw - w) / 2)
    padded[:, tp:tp + h, lp:lp + w] = chw
    top, left = top + tp, left + lp
    return padded[:, max(0, top):min(nh, top + ch), max(0, left):min(nw, left + cw)]


def preprocess_image(image, settings: ImageSettings) -> np.ndarray:
    """Image (path / PIL / uint8 array) -> pixel_values float32 [1, 3, H, W]."""
    img = load_image(image)
    try:
        rgb = to_rgb(img) if settings.do_convert_rgb else np.asarray(img)
    except (OSError, ValueError, EOFError, struct.error, MemoryError) as exc:
        raise ImageError(f"cannot decode image (PIL mode {img.mode}, size {img.size}): "
                         f"{type(exc).__name__}: {exc}") from None
    if rgb.ndim == 2:
        rgb = rgb[:, :, None]
    chw = np.ascontiguousarray(np.moveaxis(rgb, -1, 0))  # uint8 [C,H,W]
    if settings.do_pad:
        chw = _pad_to_square(chw, [int(x * 255) for x in settings.image_mean])
    if settings.do_resize:
        h, w = chw.shape[1:]
        nh, nw = resize_size(h, w, settings)
        hwc = chw[0] if chw.shape[0] == 1 else np.moveaxis(chw, 0, -1)
        resized = np.asarray(Image.fromarray(hwc).resize((nw, nh), resample=settings.resample))
        chw = resized[None] if resized.ndim == 2 else np.moveaxis(resized, -1, 0)
    if settings.do_center_crop:
        chw = _center_crop(chw, settings.crop_height, settings.crop_width)
    x = chw
    if settings.do_rescale:
        # float64 multiply then float32, exactly as transformers' rescale does
        x = (x.astype(np.float64) * settings.rescale_factor).astype(np.float32)
    if settings.do_normalize:
        if not np.issubdtype(x.dtype, np.floating):
            x = x.astype(np.float32)
        mean = np.asarray(settings.image_mean, dtype=x.dtype)[:, None, None]
        std = np.asarray(settings.image_std, dtype=x.dtype)[:, None, None]
        x = (x - mean) / std
    return np.ascontiguousarray(x, dtype=np.float32)[None]
