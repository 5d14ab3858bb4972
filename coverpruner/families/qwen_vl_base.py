"""The adapter and run-time bases Qwen2.5-VL and Qwen3-VL share (numpy only; torch only inside the families'
export-time methods): ChatML with <|vision_start|>/<|vision_end|>, the image and video pad tokens, native M-RoPE
positions of rank 3 (families/qwen_vl.py), every merger output a candidate, a picture panel of the merged-patch
grid, the video request options and the special token ids. What differs (window tables vs DeepStack extras,
sampling, timestamps, image_size) the families add in their own packages.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from coverpruner.errors import OptionError
from coverpruner.integers import ascii_int, brief
from coverpruner.families.contract import (GridPanel, ImageSpan, ReasoningFormat, RequestOption, ToolCallFormat,
                                           VisionInputs)
from coverpruner.families.hf import HFFamily, HFRuntime
from coverpruner.families.qwen_vl import decode_position, preprocess_qwen_image, pruned_positions

IMAGE_TOKEN = "<|image_pad|>"
VIDEO_TOKEN = "<|video_pad|>"
#: Qwen's tool calls (Hermes-style, the tools sections of the Qwen2.5 / Qwen3 / Qwen3-VL chat templates): every call
#: '<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>', written after the answer's text and between calls
#: with a newline
TOOL_CALLS = ToolCallFormat(open="<tool_call>", before_name='\n{"name": "', before_arguments='", "arguments": ',
                            close="}\n</tool_call>", separator="\n")
#: Qwen3's thinking (the Thinking checkpoints' generation prompt opens it: "<|im_start|>assistant\n<think>\n")
REASONING = ReasoningFormat(open="<think>", close="</think>")


def int_at_least(value, name: str, minimum: int, what: str = "") -> int:
    """An int (or its ASCII digit string) >= minimum; ValueError "<name> must be an integer >= <minimum><what>,
    got ..."."""
    number = ascii_int(value) if isinstance(value, str) else value
    if not isinstance(number, (int, np.integer)) or isinstance(number, bool) or number < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}{what}, got {brief(value)}")
    return int(number)


def parse_image_size(value):
    """'WxH' or (W, H) -> (W, H) ints; ValueError (one line) otherwise. Whether the processor's rules allow the
    size is checked with the checkpoint's limits when the image is prepared."""
    if isinstance(value, str):
        sides = [ascii_int(p) for p in value.lower().split("x")]
        if len(sides) != 2 or None in sides:
            raise ValueError(f"image_size must be WIDTHxHEIGHT in pixels (e.g. 1008x1008), got {brief(value)}")
        return sides[0], sides[1]
    try:
        w, h = value
    except (TypeError, ValueError):
        raise ValueError(f"image_size must be (width, height) in pixels, got {brief(value)}") from None
    if not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in (w, h)):
        raise ValueError(f"image_size must be (width, height) in whole pixels, got {brief(value)}")
    return int(w), int(h)


#: the image resolution options of the dynamic-resolution families (one token per f x f px, f = patch x merge: 28
#: for Qwen2.5-VL, 32 for Qwen3-VL); checked against the checkpoint's limits when the image is prepared
#: (qwen_vl.pixel_bounds / check_image_size)
IMAGE_OPTIONS = (
    RequestOption(name="image_size", parse=parse_image_size, metavar="WxH",
                  help="resize each image to exactly W x H px, both multiples of f = patch x merge (28 px "
                       "Qwen2.5-VL, 32 px Qwen3-VL) within the checkpoint's pixel limits: (W/f)*(H/f) visual tokens "
                       "(e.g. 1008x1008 = 1,296 on Qwen2.5-VL, 1024x1024 = 1,024 on Qwen3-VL). Default: the "
                       "processor's smart resize."),
    RequestOption(name="min_pixels", parse=lambda v: int_at_least(v, "min_pixels", 1), metavar="N",
                  help="smart-resize each image to at least N pixels (HF's size.shortest_edge; at least f*f, one "
                       "visual token). Default: the checkpoint's."),
    RequestOption(name="max_pixels", parse=lambda v: int_at_least(v, "max_pixels", 1), metavar="N",
                  help="smart-resize each image to at most N pixels: at most N/(f*f) visual tokens (e.g. 262144 = 256 "
                       "on Qwen3-VL; HF's size.longest_edge), up to the checkpoint's own max_pixels. Default: the "
                       "checkpoint's."),
)


def parse_video_window(value):
    """K >= 1 temporal patches per selection window (int or digit string); ValueError (one line) otherwise."""
    return int_at_least(value, "video_window", 1, " (temporal patches per window)")


def parse_max_video_frames(value):
    """The most frames one video may have after sampling: an integer >= 2; ValueError (one line) otherwise."""
    return int_at_least(value, "max_video_frames", 2)


def video_options(model: str, default_max_frames: int) -> tuple[RequestOption, RequestOption]:
    """(video_window, max_video_frames) request options, their help naming ``model``."""
    window = RequestOption(
        name="video_window", parse=parse_video_window, metavar="K",
        help=f"{model} video: select within windows of K temporal patches (2K frames), the budget split across "
             "windows (coverpruner.selection.windowed). Default: one selection over the whole video.")
    max_frames = RequestOption(
        name="max_video_frames", parse=parse_max_video_frames, metavar="N", default=default_max_frames,
        help=f"{model} video: the most frames a video may give after sampling (default {default_max_frames}); "
             "more is refused in one line.")
    return window, max_frames


class QwenVLFamily(HFFamily):
    """What the Qwen adapters share: native 3-D positions, the image pad token, the checkpoint's special ids."""

    position_mode = "native"
    position_rank = 3
    image_token = IMAGE_TOKEN

    def preprocessor_config(self, model_dir: Path) -> dict:
        """The checkpoint's preprocessor_config.json; FileNotFoundError (one line) without it."""
        f = Path(model_dir) / "preprocessor_config.json"
        if not f.is_file():
            raise FileNotFoundError(f"{model_dir}: preprocessor_config.json is missing")
        return json.loads(f.read_text())

    def token_ids(self, config, model_dir: Path | None = None) -> dict:
        """Special ids; eos_token_id is generation_config.json's list when the checkpoint has one (the Instruct
        models stop on <|im_end|> and <|endoftext|>, as HF generate does), else the text config's."""
        t = config.text_config
        eos = self.generation_eos(config, model_dir)
        return {"image_token_id": int(config.image_token_id), "video_token_id": int(config.video_token_id),
                "vision_start_token_id": config.vision_start_token_id,
                "vision_end_token_id": config.vision_end_token_id, "bos_token_id": t.bos_token_id,
                "eos_token_id": eos, "pad_token_id": t.pad_token_id}


class QwenVLRuntime(HFRuntime):
    """What the Qwen run-time rules share (contract.FamilyRuntime): rank-3 native positions, every merger output a
    candidate (a video's carrying its temporal patch), the merged-grid picture panel. Subclasses set ``merge``,
    ``patch`` and ``settings`` (a qwen_vl.QwenImageSettings) in __init__ and name their decoder extras in
    ``extras``."""

    position_rank = 3
    image_token = IMAGE_TOKEN
    reserved_strings = ("<|vision_start|>", "<|vision_end|>")
    tool_call_format = TOOL_CALLS
    reasoning_format = REASONING
    extras: tuple[str, ...] = ()
    merge: int
    patch: int

    def image(self, image, options: dict):
        """qwen_vl.QwenImage of one image with the request's image_size / min_pixels / max_pixels (IMAGE_OPTIONS);
        OptionError naming the option for a size or bounds the checkpoint's processor could not give."""
        try:
            return preprocess_qwen_image(image, self.settings, image_size=options.get("image_size"),
                                         min_pixels=options.get("min_pixels"), max_pixels=options.get("max_pixels"))
        except ValueError as exc:  # only check_image_size raises it (a bad image is an ImageError)
            raise OptionError(str(exc).splitlines()[0], param="image_size") from None

    def visual_ids(self) -> list[int]:
        """The token ids of visual rows: the image pad and, when this engine dir takes video, the video pad."""
        return [self.image_token_id] + ([self.video_token_id] if self.video_token_id is not None else [])

    def grid_panel(self, grid_thw, resized, original, what: str) -> GridPanel:
        """The picture panel of one grid (its first temporal patch): merged-patch cells over the whole original
        image (the resize keeps everything); ``what`` names the resized picture ("resized image", "frames ...")."""
        rows, cols = grid_thw[1] // self.merge, grid_thw[2] // self.merge
        h, w = original
        cell = self.merge * self.patch
        return GridPanel(f"{cell}x{cell} px cells of the {resized[1]}x{resized[0]} {what}", (rows, cols),
                         (0.0, 0.0, float(w), float(h)), np.arange(rows * cols, dtype=np.int64))

    def image_span(self, outputs: dict, vision: VisionInputs, options: dict) -> ImageSpan:
        """image_features [n, d] (native order) -> rows [n, d], every row a candidate; each of ``extras`` [n, d]
        (the same rows in the same order) -> the span's extras; a video's candidates carry their temporal patch
        (rows are temporal patch by temporal patch)."""
        n = vision.num_candidates
        for name in ["image_features", *self.extras]:
            got = outputs[name]
            if got.ndim != 2 or got.shape[0] != n:
                raise ValueError(f"vision graph returned {name} {list(got.shape)}, expected [{n}, d]")
        temporal = None
        if vision.facts.get("kind") == "video":
            t = vision.facts["grid_thw"][0]
            temporal = np.repeat(np.arange(t, dtype=np.int64), n // t)
        return ImageSpan(outputs["image_features"], np.arange(n, dtype=np.int64), temporal=temporal,
                         extras={name: outputs[name] for name in self.extras})

    def pruned_positions(self, native: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """int64 [3, L']: kept rows keep their native positions (no re-packing)."""
        return pruned_positions(native, rows)

    def decode_position(self, native: np.ndarray, pruned: np.ndarray, step: int) -> np.ndarray:
        """int64 [3]: the step-th generated token at max(native) + 1 + step, where it sits without pruning."""
        return decode_position(native, step)
