"""Draw which visual tokens were kept: kept patches at full brightness with an outline, pruned
patches dimmed, over the image as the vision tower saw it (after resize / center crop).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from coverpruner.runtime.preprocess import ImageSettings, load_image, preprocess_image


def model_view(image, settings: ImageSettings) -> Image.Image:
    """The RGB image the model sees (resize + crop, no rescale/normalize), as a PIL image."""
    raw = ImageSettings(**{**settings.__dict__, "do_rescale": False, "do_normalize": False})
    chw = preprocess_image(load_image(image), raw)[0]  # float32 [3,H,W] with 0..255 values
    return Image.fromarray(np.clip(chw, 0, 255).astype(np.uint8).transpose(1, 2, 0))


def draw_selection(image, kept_indices, num_visual_tokens: int, settings: ImageSettings,
                   min_side: int = 448, dim: float = 0.25) -> Image.Image:
    """RGB image with the sqrt(n) x sqrt(n) patch grid; pruned patches scaled by ``dim``.

    kept_indices: int [m] row-major patch indices in [0, n). Returns a new PIL image.
    """
    side = math.isqrt(num_visual_tokens)
    if side * side != num_visual_tokens:
        raise ValueError(f"cannot draw {num_visual_tokens} visual tokens as a square patch grid")
    view = model_view(image, settings)
    scale = max(1, math.ceil(min_side / max(view.size)))
    view = view.resize((view.width * scale, view.height * scale), Image.NEAREST)
    arr = np.asarray(view).astype(np.float32)
    kept = np.zeros(num_visual_tokens, dtype=bool)
    kept[np.asarray(kept_indices, dtype=np.int64)] = True
    ph, pw = view.height / side, view.width / side
    # per-pixel kept mask from the patch grid
    rows = np.minimum((np.arange(view.height) / ph).astype(int), side - 1)
    cols = np.minimum((np.arange(view.width) / pw).astype(int), side - 1)
    mask = kept.reshape(side, side)[rows][:, cols]
    arr[~mask] *= dim
    out = Image.fromarray(arr.astype(np.uint8))
    draw = ImageDraw.Draw(out)
    for k in np.flatnonzero(kept):
        r, c = divmod(int(k), side)
        x0, y0 = round(c * pw), round(r * ph)
        draw.rectangle([x0, y0, round((c + 1) * pw) - 1, round((r + 1) * ph) - 1], outline=(255, 215, 0))
    return out


def save_selection(path, image, kept_indices, num_visual_tokens: int, settings: ImageSettings) -> Path:
    """Write draw_selection(...) as a PNG at ``path``; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    draw_selection(image, kept_indices, num_visual_tokens, settings).save(path, format="PNG")
    return path
