"""What Qwen2.5-VL and Qwen3-VL share, numpy/PIL only (torch-free): the Qwen2-VL image processor both checkpoints
configure, the patch layout of their vision towers, the frame handling of their video paths and HF's
``get_rope_index`` rule for native M-RoPE positions. The families pass what differs (patch 14 vs 16, factor 28 vs
32, mean/std, pixel limits, frame sampling, timestamps) through their settings and keep it in their own packages;
this module is shared like clip.py and hf.py and imports no family.

Image (transformers' ``Qwen2VLImageProcessorPil``, step for step, same dtypes and rounding): convert to RGB ->
``smart_resize`` (both sides multiples of factor = patch * merge, pixel count within [min_pixels, max_pixels], aspect
ratio kept as closely as possible) -> PIL resize (bicubic) -> rescale in float64 then float32 -> normalize in float32
-> patches [N, C*T*P*P] in merge-block-major order (the merge x merge patches of one merged token consecutive), the
frame repeated T = temporal_patch_size times, grid_thw = (1, H/P, W/P). A request may fix the resolution,
``image_size=(W, H)``, accepted only where the processor itself could produce that size, or bound it with its own
``min_pixels`` / ``max_pixels`` (HF's per-call ``size={"shortest_edge", "longest_edge"}``), within
[factor^2, the checkpoint's max_pixels]: one visual token per factor x factor pixels.

Positions (HF ``get_rope_index`` of both models for one sequence):
  * a run of text tokens continues one counter in all three components (t = h = w);
  * a visual grid's t x gh/merge x gw/merge merged tokens (temporal patch, row, col) get t = start + temporal_i,
    h = start + row, w = start + col, where start is the counter at the run and temporal_i is i for an image (whose
    t is 1) or trunc(i * interval) for a Qwen2.5-VL video (interval = tokens_per_second * second_per_grid_t in
    float32; HF multiplies an int64 arange by it and truncates with .long()); the counter then advances by
    max(gh, gw) / merge only (HF's rule), so a video's temporal positions may run past the text after it. (Qwen3-VL
    splits a video into one grid of t = 1 per temporal patch, each its own run between timestamp texts.)
So positions are int64 [3, L] with max < L. After pruning kept rows keep their NATIVE positions and the t-th
generated token sits at max(native) + 1 + t in all rows, where it would sit without pruning: pruned generation
equals the full model with the dropped visual columns masked out.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

from coverpruner.errors import ImageError, OptionError, VideoError
from coverpruner.families.hf import CLIP_MEAN, CLIP_STD
from coverpruner.images import load_rgb


def pixel_limits(d: dict) -> dict:
    """{"min_pixels", "max_pixels"} of an HF image or video processor config: `size={"shortest_edge": min_pixels,
    "longest_edge": max_pixels}`, the deprecated top-level min_pixels / max_pixels winning as in HF's constructors
    (also the flat form the manifests store)."""
    kw = {}
    size = d.get("size") or {}
    if "shortest_edge" in size:
        kw["min_pixels"] = int(size["shortest_edge"])
    if "longest_edge" in size:
        kw["max_pixels"] = int(size["longest_edge"])
    for key in ("min_pixels", "max_pixels"):
        if d.get(key) is not None:
            kw[key] = int(d[key])
    return kw


@dataclass(frozen=True)
class QwenImageSettings:
    """The checkpoint's preprocessor_config.json (Qwen2VLImageProcessor) fields that matter; the defaults are the
    processor's own (Qwen2.5-VL's checkpoints); a family with other defaults subclasses it (qwen3_preprocess.py)."""

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
        (the deprecated top-level min_pixels/max_pixels override it, as HF's constructor does), or from to_dict's
        flat form."""
        kw = pixel_limits(d)
        for key in ("patch_size", "temporal_patch_size", "merge_size", "resample"):
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
    """One preprocessed image (and the base of the families' video results, which add their timing fields).

    pixel_values: float32 [N, C*T*P*P] patches in merge-block-major order (N = t*gh*gw), temporal patch by temporal
    patch; grid_thw: (t, gh, gw) in patches (t = 1 for an image); resized: (H, W) in pixels of the resized image or
    frames; original: (H, W) of the input. The number of visual tokens is n = t*gh*gw / merge^2 (merge 2).
    """

    pixel_values: np.ndarray
    grid_thw: tuple[int, int, int]
    resized: tuple[int, int]
    original: tuple[int, int]

    @property
    def num_visual_tokens(self) -> int:
        t, h, w = self.grid_thw
        return t * h * w // 4


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int, frames: int = 1,
                 temporal: int = 1) -> tuple[int, int]:
    """(H, W) the Qwen2-VL processor resizes a height x width image to (the processor's own rule): sides multiples of
    ``factor``, the aspect ratio kept as closely as possible, t_bar * H * W within [min_pixels, max_pixels] where
    t_bar is ``frames`` rounded to a multiple of ``temporal`` (1 for an image; Qwen3-VL's video rule bounds the
    whole clip: qwen3_video.py).

    Raises ValueError for an aspect ratio above 200 (as HF does).
    """
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(frames / temporal) * temporal
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def pixel_bounds(s: QwenImageSettings, min_pixels=None, max_pixels=None) -> tuple[int, int]:
    """The [min_pixels, max_pixels] a request resizes within: its own values (None: the checkpoint's), each a
    whole number of pixels with factor^2 <= min <= max <= the checkpoint's max_pixels (more pixels would exceed
    the visual tokens the engine dir was built and sized for). OptionError (one line, param the option) otherwise."""
    lo = s.min_pixels if min_pixels is None else min_pixels
    hi = s.max_pixels if max_pixels is None else max_pixels
    unit = s.factor ** 2
    if not unit <= lo <= hi <= s.max_pixels:
        param = "min_pixels" if lo < unit or (min_pixels is not None and max_pixels is None) else "max_pixels"
        raise OptionError(f"min_pixels {lo} / max_pixels {hi}: need {unit} (one {s.factor}x{s.factor} px visual "
                          f"token) <= min_pixels <= max_pixels <= {s.max_pixels} (the checkpoint's max_pixels)",
                          param=param)
    return lo, hi


def check_image_size(image_size, s: QwenImageSettings) -> tuple[int, int]:
    """Validate a requested fixed resolution (W, H); returns (H, W). ValueError (one line) unless the
    processor's rules could produce it: W and H positive multiples of the factor, min_pixels <= W*H <= max_pixels,
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


def normalize(x: np.ndarray, s: QwenImageSettings) -> np.ndarray:
    """uint8 [..., C, H, W] -> float32 [..., C, H, W]: rescale in float64 then float32 (as HF's rescale), normalize in
    float32, each step where the settings ask for it."""
    if s.do_rescale:
        x = (x.astype(np.float64) * s.rescale_factor).astype(np.float32)
    x = x.astype(np.float32, copy=False)
    if s.do_normalize:
        mean, std = np.asarray(s.image_mean, np.float32), np.asarray(s.image_std, np.float32)
        x = (x - mean[:, None, None]) / std[:, None, None]
    return x


def patchify(frames: np.ndarray, s: QwenImageSettings) -> tuple[np.ndarray, tuple[int, int, int]]:
    """float32 [F, C, H, W] -> (float32 [t*gh*gw, C*T*P*P], (t, gh, gw)): frames padded with the last one to a
    multiple of T = temporal_patch_size; rows by (temporal patch, merged-token row, merged-token col, row and col
    inside the merge block), columns by (channel, frame in the temporal patch, patch row, patch col)."""
    p, m, tp = s.patch_size, s.merge_size, s.temporal_patch_size
    if pad := (-len(frames)) % tp:
        frames = np.concatenate([frames, np.repeat(frames[-1:], pad, axis=0)])
    f, c, height, width = frames.shape
    t, gh, gw = f // tp, height // p, width // p
    x = frames.reshape(t, tp, c, gh // m, m, p, gw // m, m, p).transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(x.reshape(t * gh * gw, c * tp * p * p), dtype=np.float32), (t, gh, gw)


def resize_rgb(rgb: np.ndarray, size: tuple[int, int], resample: int) -> np.ndarray:
    """uint8 [H, W, C] -> uint8 [h, w, C] for size = (h, w) with PIL (C = 1 kept as one channel); the array itself
    when it has that size already."""
    if rgb.shape[:2] == tuple(size):
        return rgb
    resized = np.asarray(Image.fromarray(rgb[:, :, 0] if rgb.shape[2] == 1 else rgb).resize((size[1], size[0]),
                                                                                           resample=resample))
    return resized[:, :, None] if resized.ndim == 2 else resized


def preprocess_qwen_image(image, s: QwenImageSettings, image_size=None, min_pixels=None,
                          max_pixels=None) -> QwenImage:
    """Image (path / PIL / uint8 array) -> QwenImage; `image_size=(W, H)` fixes the resolution, `min_pixels` /
    `max_pixels` bound it instead of the checkpoint's limits (see module doc).

    Raises ImageError for unreadable images, ValueError for an image_size the processor could not produce and
    OptionError for pixel bounds out of range (pixel_bounds).
    """
    if min_pixels is not None or max_pixels is not None:
        lo, hi = pixel_bounds(s, min_pixels, max_pixels)
        s = dataclasses.replace(s, min_pixels=lo, max_pixels=hi)
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
    rgb = resize_rgb(rgb, (nh, nw), s.resample)
    if nh % s.factor or nw % s.factor:
        raise ImageError(f"image {nw}x{nh} is not a multiple of {s.factor} px (do_resize is off)")
    x = normalize(np.ascontiguousarray(np.moveaxis(rgb, -1, 0)), s)  # [C, H, W]
    patches, grid = patchify(np.repeat(x[None], s.temporal_patch_size, axis=0), s)
    return QwenImage(patches, grid, (nh, nw), (int(original[0]), int(original[1])))


# ---------------------------------------------------------------------------------------------- video frames


def sample_indices(total: int, n: int) -> np.ndarray:
    """int64 [n]: round(linspace(0, total - 1, n)) (round half to even, as torch.round and numpy's round)."""
    return np.round(np.linspace(0, total - 1, n)).astype(np.int64)


def _prefixed(exc: VideoError, where: str) -> VideoError:
    message = str(exc)
    return VideoError(message if message.startswith(where) else f"{where}: {message}")


def probe_header(video, where: str):
    """coverpruner.video.probe_video of a VideoInput's file (no frame decoded); VideoError starting with ``where``."""
    from coverpruner.video import probe_video

    try:
        return probe_video(video.video)
    except VideoError as exc:
        raise _prefixed(exc, where) from None


def read_frames(video, pick, where: str):
    """coverpruner.video.read_video of a VideoInput's file with the sampler ``pick(total, video_fps) -> indices``:
    (uint8 RGB frames, the file's rate); VideoError starting with ``where``."""
    from coverpruner.video import read_video

    try:
        return read_video(video.video, pick)
    except VideoError as exc:
        raise _prefixed(exc, where) from None


def frame_list(video, limit: int, where: str) -> list[np.ndarray]:
    """A VideoInput's frame list -> uint8 [H, W, 3] each, taken whole. VideoError (one line) for an empty list,
    more than ``limit`` frames (max_video_frames) or an unreadable frame."""
    frames = list(video.video)
    if not frames:
        raise VideoError(f"{where}: the frame list is empty")
    if len(frames) > limit:
        raise VideoError(f"{where}: {len(frames)} frames; at most {limit} per video (max_video_frames)")
    rgb = []
    for k, frame in enumerate(frames):
        try:
            rgb.append(load_rgb(frame, True)[1])
        except ImageError as exc:
            raise VideoError(f"{where}: frame {k}: {exc}") from None
    return rgb


def frame_size(frames: list[np.ndarray], fps: float, where: str) -> tuple[int, int]:
    """(H, W) the frames share. VideoError (one line) for fps <= 0 or frames of different sizes."""
    if not fps > 0:
        raise VideoError(f"{where}: fps must be > 0, got {fps}")
    sizes = {f.shape[:2] for f in frames}
    if len(sizes) != 1:
        raise VideoError(f"{where}: frames must all be the same size, got {sorted(sizes)} (height, width)")
    return frames[0].shape[:2]


def video_tokens(frames: int, size: tuple[int, int], s: QwenImageSettings) -> int:
    """Visual tokens of ``frames`` frames (a multiple of T) resized to size = (H, W): (F / T) x (H / factor) x
    (W / factor)."""
    return (frames // s.temporal_patch_size) * (size[0] // s.factor) * (size[1] // s.factor)


# ---------------------------------------------------------------------------------------------- M-RoPE positions


def native_positions(input_ids: np.ndarray, visual_ids, grids_thw, merge: int, time_intervals=None) -> np.ndarray:
    """int64 [3, L] for int64 input_ids [L] whose visual tokens (ids in ``visual_ids``: one id, or several, e.g.
    the image and the video token) form one contiguous run per grid in grids_thw (one per image or video, in
    order). time_intervals: per grid, None for an image or tokens_per_second * second_per_grid_t (float32) for a
    Qwen2.5-VL video (module doc).

    Raises ValueError when the runs of visual tokens do not match the grids' token counts.
    """
    ids = np.asarray(input_ids).reshape(-1)
    is_visual = np.isin(ids, np.atleast_1d(np.asarray(visual_ids, dtype=np.int64)))
    grids = [tuple(int(v) for v in g) for g in np.asarray(grids_thw).reshape(-1, 3)]
    # Runs of equal modality, as itertools.groupby over mm_token_type_ids in HF.
    edges = np.flatnonzero(np.diff(is_visual.astype(np.int8))) + 1
    starts = np.concatenate([[0], edges]).astype(int)
    ends = np.concatenate([edges, [ids.size]]).astype(int)
    intervals = iter(time_intervals if time_intervals is not None else [None] * len(grids))
    parts, pos, grid_iter = [], 0, iter(grids)
    for a, b in zip(starts, ends):
        if a == b:  # an empty sequence
            continue
        if not is_visual[a]:
            parts.append(np.broadcast_to(np.arange(pos, pos + b - a), (3, b - a)))
            pos += b - a
            continue
        grid = next(grid_iter, None)
        if grid is None:
            raise ValueError("more runs of visual tokens than images")
        t, gh, gw = grid[0], grid[1] // merge, grid[2] // merge
        if t * gh * gw != b - a:
            raise ValueError(f"visual run of {b - a} tokens does not match grid {grid} ({t * gh * gw} tokens)")
        interval = next(intervals)
        temporal = np.arange(t, dtype=np.int64)
        if interval is not None:  # float32 product, truncated toward zero (torch's .long())
            temporal = (temporal.astype(np.float32) * np.float32(interval)).astype(np.int64)
        tt, hh, ww = np.meshgrid(temporal, np.arange(gh), np.arange(gw), indexing="ij")
        parts.append(np.stack([tt.reshape(-1), hh.reshape(-1), ww.reshape(-1)]) + pos)
        pos += max(gh, gw)
    if next(grid_iter, None) is not None:
        raise ValueError("fewer runs of visual tokens than images")
    return np.concatenate(parts, axis=1).astype(np.int64) if parts else np.zeros((3, 0), np.int64)


def pruned_positions(native: np.ndarray, kept_rows: np.ndarray) -> np.ndarray:
    """int64 [3, L']: the native positions of the kept sequence rows (ascending row indices [L'])."""
    return np.ascontiguousarray(np.asarray(native)[:, np.asarray(kept_rows, dtype=np.int64)])


def decode_position(native: np.ndarray, step: int) -> np.ndarray:
    """int64 [3]: position of the `step`-th generated token (0-based): max(native) + 1 + step, all rows."""
    return np.full(3, int(np.max(native)) + 1 + int(step), dtype=np.int64)
