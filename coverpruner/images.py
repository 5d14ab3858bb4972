"""Image loading shared by every family: path / PIL / uint8 array -> PIL image -> uint8 RGB array.

Every failure is an ImageError with one line naming the file and the problem: missing file, unreadable or
truncated data, a decompression bomb (PIL's limit, refused already where PIL only warns) or a decoder error.
"""

from __future__ import annotations

import os
import re
import struct
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from coverpruner.errors import ImageError

__all__ = ["load_image", "to_rgb", "load_rgb", "check_aspect_ratio", "MAX_ASPECT_RATIO"]

#: Longest side / shortest side accepted: Qwen2-VL's own processor's limit (it refuses ratios above 200), which
#: LLaVA-NeXT's tests use (a 10,000 x 50 image keeps no grid rows and still answers). The preprocessors scale
#: the short side up to the model's input (CLIP: 336 px), so a 20,000 x 1 image became a 336 x 6.7M
#: intermediate (5.5 GB, 8-14 s); 200:1 bounds it at 67,200 x 336 (22.6 MP, 68 MB as uint8 RGB).
MAX_ASPECT_RATIO = 200


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


def load_rgb(image, convert: bool = True) -> tuple[Image.Image, np.ndarray]:
    """(PIL image, uint8 [H,W,C]) of an image (path / PIL / uint8 array): load -> RGB (``convert``, as the
    processors' do_convert_rgb) or the pixels as stored; C is 1 for a single-channel image kept as stored.
    ImageError when the pixels cannot be decoded."""
    img = load_image(image)
    try:
        rgb = to_rgb(img) if convert else np.asarray(img)
    except (OSError, ValueError, EOFError, struct.error, MemoryError) as exc:
        raise ImageError(f"cannot decode image (PIL mode {img.mode}, size {img.size}): "
                         f"{type(exc).__name__}: {exc}") from None
    return img, (rgb[:, :, None] if rgb.ndim == 2 else rgb)
