"""LLaVA-NeXT "anyres" images in numpy/PIL: tiles for the vision graph, and packing of its outputs.

Preprocessing equals transformers' LlavaNextImageProcessorPil (the backend transformers uses when
torchvision is absent; the torchvision backend `LlavaNextImageProcessor` resizes with torchvision's
antialiased bicubic on tensors, whose values differ from PIL's by a few grey levels, so an engine dir
matches the PIL backend exactly and the torchvision one only approximately):
  1. best resolution (H*, W*) among image_grid_pinpoints (max effective pixels, then least waste);
  2. resize (uint8, PIL, bicubic) keeping the aspect ratio to fit (H*, W*), zero-pad centred to (H*, W*);
  3. cut into tile x tile crops, row-major; prepend the whole image resized to tile x tile (the base);
  4. rescale (float64 multiply, then float32) and normalize (float32), as the PIL backend does.

Packing equals HF `LlavaNextModel.pack_image_features` ("spatial_unpad"): the base image's p*p rows,
then the (gh*p) x (gw*p) feature grid of the tiles with the padding rows/columns cut off (HF keeps
`cur - 2*((cur - new)//2)` of them) and one image_newline row after each remaining grid row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

from coverpruner.errors import ImageError, ManifestError
from coverpruner.families.clip import ImageSettings, preprocess_image
from coverpruner.families.hf import CLIP_MEAN, CLIP_STD
from coverpruner.images import load_rgb


@dataclass(frozen=True)
class AnyresSettings:
    """Image settings of one LLaVA-NeXT checkpoint.

    tile: side of a tile and of the base image in pixels (crop_size, = shortest_edge for llava-v1.6);
    patch: vision patch size (tokens per tile side = tile // patch); pinpoints: ((H, W), ...) pixels.
    """

    tile: int
    patch: int
    pinpoints: tuple[tuple[int, int], ...]
    resample: int = 3
    rescale_factor: float = 1 / 255
    image_mean: tuple = CLIP_MEAN
    image_std: tuple = CLIP_STD

    @classmethod
    def from_dict(cls, d: dict) -> "AnyresSettings":
        """From the manifest's flat `processor` block or an HF LlavaNextImageProcessor config dict
        (plus `patch_size`). ManifestError naming the field when a value is missing or unsupported."""
        try:
            crop = d.get("crop_size", d.get("tile"))
            tile = int(crop["height"] if isinstance(crop, dict) else crop)
            size = d.get("size", d.get("shortest_edge", tile))
            short = int(size.get("shortest_edge", size.get("height")) if isinstance(size, dict) else size)
            pins = tuple((int(h), int(w)) for h, w in d["image_grid_pinpoints"])
            patch = int(d["patch_size"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"LLaVA-NeXT processor settings: missing or invalid field ({exc!r})") from None
        if isinstance(crop, dict) and crop.get("width", tile) != tile:
            raise ManifestError(f"LLaVA-NeXT processor crop_size must be square, got {crop}")
        if short != tile:
            raise ManifestError(f"LLaVA-NeXT processor: size.shortest_edge ({short}) must equal crop_size ({tile})")
        if not pins or any(h % tile or w % tile or h <= 0 or w <= 0 for h, w in pins):
            raise ManifestError(f"image_grid_pinpoints must be positive multiples of the tile {tile}, got {pins}")
        if tile % patch:
            raise ManifestError(f"tile {tile} is not a multiple of patch_size {patch}")
        for flag in ("do_resize", "do_center_crop", "do_rescale", "do_normalize", "do_convert_rgb"):
            if d.get(flag) is False:
                raise ManifestError(f"LLaVA-NeXT processor: {flag}=false is not supported")
        kw = {}
        if d.get("resample") is not None:
            kw["resample"] = int(d["resample"])
        if d.get("rescale_factor") is not None:
            kw["rescale_factor"] = float(d["rescale_factor"])
        for key in ("image_mean", "image_std"):
            if d.get(key) is not None:
                kw[key] = tuple(float(x) for x in d[key])
        return cls(tile=tile, patch=patch, pinpoints=pins, **kw)

    def to_dict(self) -> dict:
        """The flat manifest `processor` block (JSON types)."""
        return {"tile": self.tile, "patch_size": self.patch, "image_grid_pinpoints": [list(p) for p in self.pinpoints],
                "resample": self.resample, "rescale_factor": self.rescale_factor,
                "image_mean": list(self.image_mean), "image_std": list(self.image_std)}

    @property
    def side(self) -> int:
        """Tokens per tile side p (the base image and each tile give p*p features)."""
        return self.tile // self.patch

    @property
    def max_tiles(self) -> int:
        """Most tiles the vision graph sees for one image: base + the largest grid."""
        return 1 + max(h // self.tile * (w // self.tile) for h, w in self.pinpoints)

    @property
    def max_rows(self) -> int:
        """Most rows an image span can have (no unpadding, a newline per grid row)."""
        p = self.side
        return max(p * p + (h // self.tile * p) * (w // self.tile * p + 1) for h, w in self.pinpoints)


def best_resolution(height: int, width: int, pinpoints) -> tuple[int, int]:
    """HF select_best_resolution: the (H, W) pinpoint keeping most image pixels, then wasting fewest.

    Same arithmetic (float scale, int truncation, strict comparisons in list order).
    """
    best, best_eff, best_waste = None, 0, float("inf")
    for h, w in pinpoints:
        scale = min(w / width, h / height)
        eff = min(int(width * scale) * int(height * scale), width * height)
        waste = w * h - eff
        if eff > best_eff or (eff == best_eff and waste < best_waste):
            best, best_eff, best_waste = (h, w), eff, waste
    return best


def fit_size(height: int, width: int, target: tuple[int, int]) -> tuple[int, int]:
    """HF get_patch_output_size: (h, w) of the image resized to fit `target` with its aspect ratio."""
    th, tw = target
    sw, sh = tw / width, th / height
    if sw < sh:
        return min(math.ceil(height * sw), th), tw
    return th, min(math.ceil(width * sh), tw)


@dataclass(frozen=True)
class AnyresGeometry:
    """Where every image-span row comes from, for one image.

    image_size: (H, W) of the original image; best: (H*, W*) pinpoint; grid: (gh, gw) tiles;
    resized: (h, w) of the image inside the padded canvas, pasted at `paste` = (top, left) pixels;
    p: tokens per tile side; rows_kept: [r0, r1) and cols_kept: [c0, c1) of the (gh*p) x (gw*p) feature
    grid that survive unpadding.
    """

    image_size: tuple[int, int]
    best: tuple[int, int]
    grid: tuple[int, int]
    resized: tuple[int, int]
    paste: tuple[int, int]
    p: int
    rows_kept: tuple[int, int]
    cols_kept: tuple[int, int]

    @property
    def num_tiles(self) -> int:
        return 1 + self.grid[0] * self.grid[1]

    @property
    def grid_shape(self) -> tuple[int, int]:
        """(rows, cols) of the unpadded feature grid (newline column not counted)."""
        return self.rows_kept[1] - self.rows_kept[0], self.cols_kept[1] - self.cols_kept[0]

    @property
    def num_candidates(self) -> int:
        """n: base p*p rows + unpadded grid rows*cols (image_newline rows are not candidates)."""
        r, c = self.grid_shape
        return self.p * self.p + r * c

    @property
    def num_rows(self) -> int:
        """Rows of the packed image span: candidates + one newline per grid row."""
        return self.num_candidates + self.grid_shape[0]

    def newline_mask(self) -> np.ndarray:
        """bool [num_rows]: True at the image_newline rows (last row of each grid line)."""
        r, c = self.grid_shape
        mask = np.zeros(self.num_rows, dtype=bool)
        mask[self.p * self.p + c + np.arange(r) * (c + 1)] = True
        return mask


def geometry(height: int, width: int, s: AnyresSettings) -> AnyresGeometry:
    """AnyresGeometry of an H x W image. Unpadding follows HF's unpad_image exactly: the scale from the
    side that fills the grid, `int(round(x, 7))`, and a symmetric cut of (cur - new)//2 on each side."""
    if height < 1 or width < 1:
        raise ImageError(f"image has no pixels ({width}x{height})")
    best = best_resolution(height, width, s.pinpoints)
    gh, gw = best[0] // s.tile, best[1] // s.tile
    rh, rw = fit_size(height, width, best)
    paste = ((best[0] - rh) // 2, (best[1] - rw) // 2)
    cur_h, cur_w = gh * s.side, gw * s.side
    rows, cols = (0, cur_h), (0, cur_w)
    if width / height > cur_w / cur_h:
        new_h = int(round(height * (cur_w / width), 7))
        pad = (cur_h - new_h) // 2
        rows = (pad, cur_h - pad)
    else:
        new_w = int(round(width * (cur_h / height), 7))
        pad = (cur_w - new_w) // 2
        cols = (pad, cur_w - pad)
    return AnyresGeometry((height, width), best, (gh, gw), (rh, rw), paste, s.side, rows, cols)


def _resize(hwc: np.ndarray, height: int, width: int, resample: int) -> np.ndarray:
    """uint8 [h,w,3] -> uint8 [height,width,3] with PIL (what transformers' PIL backend calls)."""
    return np.asarray(Image.fromarray(hwc).resize((width, height), resample=resample))


def prepare_tiles(image, s: AnyresSettings) -> tuple[np.ndarray, AnyresGeometry]:
    """Image (path / PIL / uint8 array) -> (pixel_values float32 [T,3,tile,tile], geometry).

    T = 1 + gh*gw: the base image first, then the tiles row-major (HF's order).
    """
    _, rgb = load_rgb(image)  # uint8 [H,W,3], alpha composited on white like HF's convert_to_rgb
    height, width = rgb.shape[:2]
    geo = geometry(height, width, s)
    rh, rw = geo.resized
    canvas = np.zeros((*geo.best, 3), dtype=np.uint8)  # zero padding, as np.pad(constant 0)
    top, left = geo.paste
    canvas[top:top + rh, left:left + rw] = _resize(rgb, rh, rw, s.resample)
    crops = [_resize(rgb, s.tile, s.tile, s.resample)]
    for i in range(0, geo.best[0], s.tile):
        for j in range(0, geo.best[1], s.tile):
            crops.append(canvas[i:i + s.tile, j:j + s.tile])
    # Rescale + normalize only (crops are already tile x tile): the same float steps as LLaVA-1.5.
    norm = ImageSettings(do_resize=False, do_center_crop=False, do_convert_rgb=False,
                         rescale_factor=s.rescale_factor, image_mean=s.image_mean, image_std=s.image_std)
    pixels = np.concatenate([preprocess_image(np.ascontiguousarray(c), norm) for c in crops])
    return pixels, geo


def pack_features(features: np.ndarray, geo: AnyresGeometry, newline: np.ndarray) -> np.ndarray:
    """Vision-graph outputs -> the packed image span, as HF pack_image_features.

    features: float [T, p*p, d] (T = geo.num_tiles, base first); newline: float [d] (image_newline).
    Returns float [geo.num_rows, d] in features.dtype: base rows, then each unpadded grid row followed
    by the newline vector.
    """
    t, pp, d = features.shape
    p = geo.p
    if t != geo.num_tiles or pp != p * p:
        raise ValueError(f"vision features {features.shape} do not fit {geo.num_tiles} tiles of {p}x{p}")
    gh, gw = geo.grid
    grid = features[1:].reshape(gh, gw, p, p, d).transpose(0, 2, 1, 3, 4).reshape(gh * p, gw * p, d)
    (r0, r1), (c0, c1) = geo.rows_kept, geo.cols_kept
    grid = grid[r0:r1, c0:c1]
    lines = np.broadcast_to(newline.astype(features.dtype), (grid.shape[0], 1, d))
    grid = np.concatenate([grid, lines], axis=1).reshape(-1, d)
    return np.concatenate([features[0], grid])


