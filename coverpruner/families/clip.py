"""CLIP vision towers (LLaVA-1.5, LLaVA-NeXT): image preprocessing in numpy/PIL from saved processor settings,
the processor settings of a checkpoint, the region a crop keeps, and (torch, imported lazily) where the
image features sit in the HF model.

Reproduces the steps (and their dtypes and rounding) of transformers' PIL image processors
(CLIPImageProcessorPil / LlavaImageProcessorPil): convert to RGB compositing alpha on white ->
optional pad-to-square with the mean colour -> resize the shortest edge with PIL -> center crop
(zero-padding if too small) -> rescale in float64 then cast to float32 -> normalize in float32.
The output equals the HF processor's ``pixel_values`` exactly for the same settings.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from coverpruner.errors import ManifestError
from coverpruner.families.hf import CLIP_MEAN, CLIP_STD
from coverpruner.images import load_rgb


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
    image_mean: tuple = CLIP_MEAN
    image_std: tuple = CLIP_STD

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
    _, rgb = load_rgb(image, settings.do_convert_rgb)
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


def crop_box(width: int, height: int, settings: ImageSettings) -> tuple[float, float, float, float]:
    """(left, top, right, bottom) in original-image pixels of the region the CLIP preprocessing keeps:
    optional pad-to-square, shortest-edge resize, center crop (the steps of `preprocess_image`)."""
    ox = oy = 0.0
    fw, fh = width, height
    if settings.do_pad and width != height:
        side = max(width, height)
        ox, oy = (0.0, (side - height) // 2) if width > height else ((side - width) // 2, 0.0)
        fw = fh = side
    nh, nw = resize_size(fh, fw, settings) if settings.do_resize else (fh, fw)
    sx, sy = fw / nw, fh / nh
    if settings.do_center_crop:
        ch, cw = settings.crop_height, settings.crop_width
        top, left = (nh - ch) // 2, (nw - cw) // 2
    else:
        ch, cw, top, left = nh, nw, 0, 0
    return (left * sx - ox, top * sy - oy, (left + cw) * sx - ox, (top + ch) * sy - oy)


def read_processor_config(model_dir: Path) -> tuple[dict, int | None]:
    """(image processor settings, patch_size or None) of a checkpoint: preprocessor_config.json, else
    processor_config.json's "image_processor" (whose "patch_size" is returned too). FileNotFoundError if neither."""
    d = Path(model_dir)
    cfg, patch = None, None
    if (d / "processor_config.json").is_file():
        proc = json.loads((d / "processor_config.json").read_text())
        cfg, patch = proc.get("image_processor"), proc.get("patch_size")
    if (d / "preprocessor_config.json").is_file():
        cfg = json.loads((d / "preprocessor_config.json").read_text())
    if not cfg:
        raise FileNotFoundError(f"{d}: no image processor settings (preprocessor_config.json or "
                                "processor_config.json['image_processor'])")
    return cfg, patch


def tokens_per_crop(config) -> int:
    """Image rows one CLIP crop gives a LLaVA config: (side/patch)^2, + CLS with the "full" strategy."""
    v = config.vision_config
    n = (v.image_size // v.patch_size) ** 2 + 1  # CLIP prepends CLS
    return n - 1 if config.vision_feature_select_strategy == "default" else n


def image_features(model, pixel_values):
    """pixel_values float [B,3,H,W] -> projector outputs float [B,n,d] of a llava-hf model (CLIP hidden state at
    vision_feature_layer(s), CLS dropped by the "default" strategy, multi-modal projector).

    Same computation as `get_image_features`, written batch-first so it traces with a dynamic batch.
    """
    import torch

    cfg = model.config
    out = model.model.vision_tower(pixel_values, output_hidden_states=True, return_dict=True)
    layers = cfg.vision_feature_layer
    layers = [layers] if isinstance(layers, int) else list(layers)
    feats = [out.hidden_states[i] for i in layers]
    if cfg.vision_feature_select_strategy == "default":
        feats = [f[:, 1:] for f in feats]
    return model.model.multi_modal_projector(torch.cat(feats, dim=-1) if len(feats) > 1 else feats[0])


def vision_export_spec(family, model, config, dtype, axis: str):
    """The CLIP vision graph's ExportSpec: pixel_values float [axis,3,s,s] -> image_features float [axis,n,d]
    (VisionGraph over ``family.image_features``; ``axis`` names the dynamic first axis: "batch" for LLaVA-1.5,
    "tiles" for LLaVA-NeXT)."""
    import torch
    from torch.export import Dim

    from coverpruner.families.contract import ExportSpec
    from coverpruner.families.hf_graphs import VisionGraph

    s = config.vision_config.image_size
    return ExportSpec(VisionGraph(family, model).eval(), (torch.randn(2, 3, s, s, dtype=dtype),),
                      ["pixel_values"], ["image_features"], ({0: Dim(axis)},))
