"""Draw which visual tokens were kept, over the original image: kept cells at full brightness with an
outline, pruned cells and everything the model did not see dimmed.

The geometry is the family's (GenerationResult.panels, contract.GridPanel): one panel per grid of
candidates (LLaVA-1.5: the center crop's patch grid; LLaVA-NeXT: the base image and the high-res grid),
each a (rows, cols) grid over a box in original-image pixels. Panels are drawn side by side.

A video (Qwen2.5-VL) is drawn by draw_video_selection: one panel per temporal patch, on the first of the two frames
that patch covers (or on both), from the grid alone (grid_thw, spatial merge).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from coverpruner.families.contract import GridPanel
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
    padded = left < 0 or top < 0 or right > w or bottom > h  # the grey bands: padding the model saw, no tokens
    ImageDraw.Draw(framed).text((4, out.height + 2), f"{caption}{int(kept_cells.sum())}/{int((cells >= 0).sum())} kept"
                                + ("; grey bands: padding (no tokens)" if padded else ""), fill=(0, 0, 0))
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
    """One picture for a conversation: per image or video (in order) its draw_selection / draw_video_selection,
    side by side, each titled "image j" / "video j". images: the request's images (path, PIL or uint8 array) and,
    for a video, the list of its sampled frames (the frames the model saw, in order: the result's grid alone does
    not say which frames the family sampled); results: GenerationResult.images (a video's has kind "video" and
    video["grid_thw"])."""
    if not results:
        raise ValueError("the request has no image; nothing to draw")
    views = []
    for j, (image, res) in enumerate(zip(images, results)):
        if getattr(res, "kind", "image") == "video":
            if not isinstance(image, (list, tuple)):
                raise ValueError(f"video {j}: the picture needs its sampled frames (a list), got "
                                 f"{type(image).__name__}")
            view = draw_video_selection(image, res.video["grid_thw"], res.kept_indices, min_side=min_side // 2,
                                        dim=dim)
            title = f"video {j}"
        else:
            view = draw_selection(image, res.kept_indices, res.panels, min_side, dim)
            title = f"image {j}"
        titled = Image.new("RGB", (view.width, view.height + _CAPTION_H), (255, 255, 255))
        titled.paste(view, (0, _CAPTION_H))
        ImageDraw.Draw(titled).text((4, 2), title, fill=(0, 0, 0))
        views.append(titled)
    return _side_by_side(views, gap=16)


def draw_methods(image, selections: dict, min_side: int = 448, dim: float = 0.25) -> Image.Image:
    """One picture comparing methods on one image: per method (in the dict's order) its draw_selection, side by
    side, each titled with the method's name. selections: {method: (kept_indices int [m], panels)} (e.g. from
    GenerationResult.kept_indices / .panels of one request per method)."""
    if not selections:
        raise ValueError("no selection to draw")
    views = []
    for method, (kept, panels) in selections.items():
        view = draw_selection(image, kept, panels, min_side, dim)
        titled = Image.new("RGB", (view.width, view.height + _CAPTION_H), (255, 255, 255))
        titled.paste(view, (0, _CAPTION_H))
        ImageDraw.Draw(titled).text((4, 2), f"{method}: {len(np.asarray(kept))} kept", fill=(0, 0, 0))
        views.append(titled)
    return _side_by_side(views, gap=16)


def save_methods(path, image, selections: dict) -> Path:
    """Write draw_methods(...) as a PNG at ``path`` (temp file + rename); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    draw_methods(image, selections).save(tmp, format="PNG")
    tmp.replace(path)
    return path


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


def video_panels(grid_thw, merge: int = 2, frame_size: tuple[int, int] | None = None) -> list:
    """One GridPanel per temporal patch of a video's grid: (rows, cols) = (h / merge, w / merge) merged-token
    cells over the whole frame, cells = the video's token indices t * rows * cols + raster index (the order of
    the vision tower's merged output). grid_thw: (t, h, w) in patches (video_grid_thw). box: the whole frame of
    frame_size (width, height) in pixels (default: the grid's own size, h x w); the frames are resized to the
    grid, never cropped, so the cells map onto any frame size proportionally."""
    t, h, w = (int(x) for x in np.asarray(grid_thw, dtype=np.int64).reshape(3))
    if min(t, h, w) < 1 or merge < 1 or h % merge or w % merge:
        raise ValueError(f"grid_thw must be 3 positive integers with h and w divisible by merge={merge}, "
                         f"got {(t, h, w)}")
    rows, cols = h // merge, w // merge
    per = rows * cols
    width, height = (w, h) if frame_size is None else frame_size
    return [GridPanel(f"t{k}", (rows, cols), (0.0, 0.0, float(width), float(height)),
                      np.arange(k * per, (k + 1) * per, dtype=np.int64)) for k in range(t)]


def draw_video_selection(frames, grid_thw, kept_indices, merge: int = 2, temporal_patch: int = 2,
                         both_frames: bool = False, columns: int = 4, min_side: int = 224,
                         dim: float = 0.25) -> Image.Image:
    """RGB picture of a video's selection: per temporal patch its first frame (both_frames: each of the
    ``temporal_patch`` frames it covers, side by side), the kept merged-token cells bright and outlined, the
    rest dimmed, each captioned "t<k> frame <i>: kept/cells kept"; ``columns`` temporal patches per row; a title strip
    "video: kept/total kept" on top.

    frames: the sampled frames the model saw, in order (paths, PIL images or uint8 [H, W, 3]); a last temporal
    patch with one frame (an odd count, padded by repeating it) is fine. grid_thw: (t, h, w) in patches;
    merge: spatial merge (2 for Qwen2.5-VL); kept_indices: int [m] indices into the video's t * h * w / merge^2
    tokens. Returns a new PIL image.
    """
    panels = video_panels(grid_thw, merge)
    t = len(panels)
    frames = list(frames)
    if not (t - 1) * temporal_patch < len(frames) <= t * temporal_patch:
        raise ValueError(f"grid_thw has {t} temporal patches of {temporal_patch} frames: expected "
                         f"{(t - 1) * temporal_patch + 1}..{t * temporal_patch} frames, got {len(frames)}")
    total = t * panels[0].cells.size
    kept_arr = np.asarray(kept_indices, dtype=np.int64).reshape(-1)
    if kept_arr.size and (kept_arr.min() < 0 or kept_arr.max() >= total):
        raise ValueError(f"kept_indices must lie in [0, {total}) (the video's tokens), got {kept_arr.min()}.."
                         f"{kept_arr.max()}")
    kept = {int(k) for k in kept_arr}
    views = []
    for k, panel in enumerate(panels):
        first = k * temporal_patch
        shown = range(first, min(first + temporal_patch, len(frames))) if both_frames else [first]
        pictures = []
        for i in shown:  # captioned with the temporal patch and the frame's index among the sampled frames
            rgb = to_rgb(load_image(frames[i]))
            box = (0.0, 0.0, float(rgb.shape[1]), float(rgb.shape[0]))
            pictures.append(_draw_panel(rgb, dataclasses.replace(panel, box=box, title=f"t{k} frame {i}"), kept,
                                        min_side, dim))
        views.append(_side_by_side(pictures, gap=2) if len(pictures) > 1 else pictures[0])
    rows = [_side_by_side(views[i:i + columns], gap=8) for i in range(0, t, max(1, columns))]
    width = max(r.width for r in rows)
    out = Image.new("RGB", (width, _CAPTION_H + sum(r.height for r in rows) + 8 * (len(rows) - 1)), (255, 255, 255))
    ImageDraw.Draw(out).text((4, 2), f"video: {len(kept)}/{total} kept", fill=(0, 0, 0))
    y = _CAPTION_H
    for r in rows:
        out.paste(r, (0, y))
        y += r.height + 8
    return out
