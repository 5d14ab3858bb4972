"""Draw which visual tokens were kept, over the original image: kept cells at full brightness with an
outline, pruned cells and everything the model did not see dimmed.

The geometry is the family's (GenerationResult.panels, contract.GridPanel): one panel per grid of
candidates (LLaVA-1.5: the center crop's patch grid; LLaVA-NeXT: the base image and the high-res grid),
each a (rows, cols) grid over a box in original-image pixels. Panels are drawn side by side.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from coverpruner.images import load_image, to_rgb

_OUTLINE = (255, 215, 0)
_PAD_COLOR = 96  # grey where a box extends past the image (padding the model saw)
_CAPTION_H = 14


def _draw_panel(rgb: np.ndarray, panel, kept: set, min_side: int, dim: float) -> Image.Image:
    h, w = rgb.shape[:2]
    left, top, right, bottom = (float(v) for v in panel.box)
    # canvas = image plus any part of the box outside it
    x0, y0 = min(0.0, left), min(0.0, top)
    cw, ch = math.ceil(max(w, right) - x0), math.ceil(max(h, bottom) - y0)
    scale = max(1.0, min_side / max(cw, ch))
    out_w, out_h = max(1, round(cw * scale)), max(1, round(ch * scale))
    canvas = np.full((ch, cw, 3), _PAD_COLOR, dtype=np.uint8)
    ox, oy = int(round(-x0)), int(round(-y0))
    canvas[oy:oy + h, ox:ox + w] = rgb
    view = np.asarray(Image.fromarray(canvas).resize((out_w, out_h), Image.BILINEAR)).astype(np.float32)

    rows, cols = panel.shape
    cells = np.asarray(panel.cells, dtype=np.int64).reshape(rows, cols)
    kept_cells = np.isin(cells, list(kept)) & (cells >= 0)
    # original-image coordinates of every output pixel centre -> its cell (or none outside the box)
    u = (np.arange(out_w) + 0.5) / scale + x0
    v = (np.arange(out_h) + 0.5) / scale + y0
    cx = np.floor((u - left) / (right - left) * cols).astype(int)
    cy = np.floor((v - top) / (bottom - top) * rows).astype(int)
    inside_x, inside_y = (cx >= 0) & (cx < cols), (cy >= 0) & (cy < rows)
    mask = np.zeros((out_h, out_w), dtype=bool)
    sub = kept_cells[np.clip(cy, 0, rows - 1)][:, np.clip(cx, 0, cols - 1)]
    mask[np.ix_(inside_y, inside_x)] = sub[np.ix_(inside_y, inside_x)]
    view[~mask] *= dim
    out = Image.fromarray(view.astype(np.uint8))
    draw = ImageDraw.Draw(out)
    cell_w, cell_h = (right - left) / cols, (bottom - top) / rows
    for r, c in zip(*np.nonzero(kept_cells)):
        px0 = round((left + c * cell_w - x0) * scale)
        py0 = round((top + r * cell_h - y0) * scale)
        px1 = round((left + (c + 1) * cell_w - x0) * scale) - 1
        py1 = round((top + (r + 1) * cell_h - y0) * scale) - 1
        draw.rectangle([px0, py0, max(px0, px1), max(py0, py1)], outline=_OUTLINE)
    # caption in a strip below the picture, so it covers no cell
    framed = Image.new("RGB", (out.width, out.height + _CAPTION_H), (255, 255, 255))
    framed.paste(out, (0, 0))
    caption = f"{panel.title}: " if panel.title else ""
    ImageDraw.Draw(framed).text((4, out.height + 2), f"{caption}{int(kept_cells.sum())}/{int((cells >= 0).sum())} kept",
                                fill=(0, 0, 0))
    return framed


def draw_selection(image, kept_indices, panels, min_side: int = 448, dim: float = 0.25) -> Image.Image:
    """RGB picture of the selection: one panel per family grid, side by side, each with a caption strip
    ("<title>: kept/cells kept") below it.

    image: the request's image (path, PIL or uint8 array); kept_indices: int [m] candidate indices;
    panels: the family's GridPanels (GenerationResult.panels). Returns a new PIL image.
    """
    if not panels:
        raise ValueError("the family gave no geometry for this request; nothing to draw")
    rgb = to_rgb(load_image(image))
    kept = {int(k) for k in np.asarray(kept_indices, dtype=np.int64)}
    views = [_draw_panel(rgb, p, kept, min_side, dim) for p in panels]
    return _side_by_side(views, gap=8)


def _side_by_side(views: list, gap: int) -> Image.Image:
    """The views pasted left to right on white, ``gap`` pixels apart, top-aligned."""
    out = Image.new("RGB", (sum(v.width for v in views) + gap * (len(views) - 1), max(v.height for v in views)),
                    (255, 255, 255))
    x = 0
    for v in views:
        out.paste(v, (x, 0))
        x += v.width + gap
    return out


def draw_conversation(images, results, min_side: int = 448, dim: float = 0.25) -> Image.Image:
    """One picture for a conversation: per image (in order) its draw_selection, side by side, each titled
    "image j". images: the request's images (path, PIL or uint8 array); results: GenerationResult.images."""
    if not results:
        raise ValueError("the request has no image; nothing to draw")
    views = []
    for j, (image, res) in enumerate(zip(images, results)):
        view = draw_selection(image, res.kept_indices, res.panels, min_side, dim)
        titled = Image.new("RGB", (view.width, view.height + _CAPTION_H), (255, 255, 255))
        titled.paste(view, (0, _CAPTION_H))
        ImageDraw.Draw(titled).text((4, 2), f"image {j}", fill=(0, 0, 0))
        views.append(titled)
    return _side_by_side(views, gap=16)


def save_conversation(path, images, results) -> Path:
    """Write draw_conversation(...) as a PNG at ``path`` (temp file + rename); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    draw_conversation(images, results).save(tmp, format="PNG")
    tmp.replace(path)
    return path


def save_selection(path, image, kept_indices, panels) -> Path:
    """Write draw_selection(...) as a PNG at ``path``; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    draw_selection(image, kept_indices, panels).save(path, format="PNG")
    return path
