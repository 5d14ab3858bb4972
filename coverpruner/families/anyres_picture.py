"""Selection picture for anyres (LLaVA-NeXT) images: which candidates were kept, on the original image.

Two panels side by side, both showing the original image: left the base-image tokens (the whole image
squeezed to p x p, so a token covers W/p x H/p pixels), right the high-res grid tokens (a token covers
one patch of the padded canvas, mapped back through the resize and the centred paste). Kept tokens stay
bright with an outline; the rest is dimmed. numpy/PIL only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from coverpruner.families.anyres import AnyresGeometry, AnyresSettings
from coverpruner.runtime.preprocess import _to_rgb, load_image

OUTLINE = (255, 215, 0)


def candidate_boxes(geo: AnyresGeometry, s: AnyresSettings) -> tuple[np.ndarray, np.ndarray]:
    """Image-pixel boxes of every candidate: (float64 [n,4] as x0, y0, x1, y1, bool [n] True for base tokens).

    Candidate order is the native one: base rows (row-major p x p), then the unpadded grid row-major.
    """
    height, width = geo.image_size
    p = geo.p
    r, c = np.divmod(np.arange(p * p), p)
    base = np.stack([c * width / p, r * height / p, (c + 1) * width / p, (r + 1) * height / p], 1)
    rows, cols = geo.grid_shape
    gr, gc = np.divmod(np.arange(rows * cols), max(cols, 1))
    y0 = (geo.rows_kept[0] + gr) * s.patch  # canvas pixels of the padded best resolution
    x0 = (geo.cols_kept[0] + gc) * s.patch
    sy, sx = height / geo.resized[0], width / geo.resized[1]
    top, left = geo.paste
    grid = np.stack([(x0 - left) * sx, (y0 - top) * sy, (x0 + s.patch - left) * sx, (y0 + s.patch - top) * sy], 1)
    grid = np.clip(grid, 0, [width, height, width, height])
    boxes = np.concatenate([base, grid]) if grid.size else base
    return boxes, np.arange(len(boxes)) < p * p


def _panel(rgb: np.ndarray, boxes: np.ndarray, kept: np.ndarray, scale: float, dim: float) -> Image.Image:
    view = Image.fromarray(rgb).resize((max(1, round(rgb.shape[1] * scale)), max(1, round(rgb.shape[0] * scale))))
    bright = np.asarray(view)
    out = (bright.astype(np.float32) * dim).astype(np.uint8)
    px = np.round(boxes * scale).astype(int)
    for x0, y0, x1, y1 in px[kept]:
        out[y0:y1, x0:x1] = bright[y0:y1, x0:x1]
    img = Image.fromarray(out)
    draw = ImageDraw.Draw(img)
    for x0, y0, x1, y1 in px[kept]:
        if x1 > x0 and y1 > y0:
            draw.rectangle([x0, y0, x1 - 1, y1 - 1], outline=OUTLINE)
    return img


def draw_anyres_selection(image, geo: AnyresGeometry, s: AnyresSettings, kept_candidates,
                          side: int = 448, dim: float = 0.25) -> Image.Image:
    """RGB picture [~side x 2*side]: base-token panel | high-res-token panel, kept candidates bright.

    kept_candidates: int [m] indices into the candidates (0..n-1, base first), as the selector returns them.
    """
    rgb = _to_rgb(load_image(image))
    if rgb.shape[:2] != geo.image_size:
        raise ValueError(f"image is {rgb.shape[1]}x{rgb.shape[0]} but the geometry was computed for "
                         f"{geo.image_size[1]}x{geo.image_size[0]}")
    boxes, is_base = candidate_boxes(geo, s)
    kept = np.zeros(len(boxes), dtype=bool)
    kept[np.asarray(kept_candidates, dtype=np.int64)] = True
    scale = side / max(geo.image_size)
    left = _panel(rgb, boxes[is_base], kept[is_base], scale, dim)
    right = _panel(rgb, boxes[~is_base], kept[~is_base], scale, dim)
    gap, label = 8, 14
    out = Image.new("RGB", (left.width + gap + right.width, left.height + label), (255, 255, 255))
    out.paste(left, (0, label))
    out.paste(right, (left.width + gap, label))
    draw = ImageDraw.Draw(out)
    draw.text((2, 1), f"base {int(kept[is_base].sum())}/{int(is_base.sum())}", fill=(0, 0, 0))
    draw.text((left.width + gap + 2, 1), f"high-res {int(kept[~is_base].sum())}/{int((~is_base).sum())}",
              fill=(0, 0, 0))
    return out


def save_anyres_selection(path, image, geo: AnyresGeometry, s: AnyresSettings, kept_candidates) -> Path:
    """Write draw_anyres_selection(...) as a PNG at `path`; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    draw_anyres_selection(image, geo, s, kept_candidates).save(path, format="PNG")
    return path
