"""The adapter and run-time bases of the families on the Qwen3-VL vision tower (numpy only; torch only inside
export-time methods): Qwen3-VL (families/qwen3_vl/, DeepStack levels as decoder extras) and Qwen3.5
(families/qwen3_5/, the same tower without DeepStack before a hybrid decoder).

What they share, on top of qwen_vl_base.py's Qwen bases: the checkpoint's image and video processor settings
(qwen3_preprocess.py: 16-px patches, 0.5 mean / std; qwen3_video.py: HF's Qwen3VLVideoProcessor sampling and the
timestamped layout), the vision graph's host tables (qwen3_vision.py) and its torch wrapper
(qwen3_vision_graph.py), the dims and manifest fields of the tower, and every run-time rule (prepare_image /
prepare_video, the timestamped placeholders, get_rope_index's native positions with a video's temporal patches as
separate runs). What differs is a parameter: the DeepStack levels the decoder uses (``deepstack_levels``: 0 for
Qwen3.5), the model's name in the video options' help, the decoder itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from coverpruner.families.contract import ExportSpec, VisionInputs
from coverpruner.families.hf import HFFamily, chat_layout, text_dims
from coverpruner.families.qwen3_preprocess import Qwen3ImageSettings
from coverpruner.families.qwen3_video import (DEFAULT_MAX_VIDEO_FRAMES, Qwen3VideoSettings, placeholder,
                                              preprocess_video, sampled_frames, video_cost)
from coverpruner.families.qwen3_vision import VISION_INPUTS, vision_inputs
from coverpruner.families.qwen_vl import native_positions
from coverpruner.families.qwen_vl_base import IMAGE_TOKEN, VIDEO_TOKEN, QwenVLFamily, QwenVLRuntime

__all__ = ["IMAGE_TOKEN", "Qwen3VisionFamily", "Qwen3VisionRuntime", "extra_names"]


def extra_names(levels: int) -> list[str]:
    """The decoder-extra names of ``levels`` DeepStack levels (graph outputs of vision.onnx, inputs of the
    decoder): visual_extra.0, visual_extra.1, ..."""
    return [f"visual_extra.{k}" for k in range(levels)]


class Qwen3VisionFamily(QwenVLFamily):
    """Export-time base of a family on the Qwen3-VL vision tower. A subclass sets name, model_class,
    request_options and, with DeepStack, ``deepstack_levels``."""

    mrope_interleaved = True
    support_files = HFFamily.support_files + ("video_preprocessor_config.json",)

    def deepstack_levels(self, config) -> int:
        """DeepStack levels the decoder uses (none on this base)."""
        return 0

    def processor_settings(self, model_dir: Path) -> dict:
        image = self.preprocessor_config(model_dir)
        v = Path(model_dir) / "video_preprocessor_config.json"  # HF's video processor reads the image one without it
        video = json.loads(v.read_text()) if v.is_file() else image
        return {**Qwen3ImageSettings.from_dict(image).to_dict(), "video": Qwen3VideoSettings.from_dict(video).to_dict()}

    def dims(self, config) -> dict:
        """The decoder's and the tower's sizes (deepstack_levels only when there are any: a dim is a positive
        size)."""
        t, v = config.text_config, config.vision_config
        levels = self.deepstack_levels(config)
        return {
            **text_dims(t), "mrope_section": list(t.rope_parameters["mrope_section"]),
            "patch_size": v.patch_size, "spatial_merge_size": v.spatial_merge_size,
            "temporal_patch_size": v.temporal_patch_size, "vision_hidden_size": v.hidden_size,
            "num_position_embeddings": v.num_position_embeddings, **({"deepstack_levels": levels} if levels else {}),
            "patch_dim": v.in_channels * v.temporal_patch_size * v.patch_size ** 2,
        }

    def image_features(self, model, *vision_inputs):
        from coverpruner.families.qwen3_vision_graph import Qwen3VisionGraph

        return Qwen3VisionGraph(model.model.visual, 0)(*vision_inputs)[0]

    def probe_example_visual(self, config) -> int:
        return 24  # the vision example's 8 x 12 patch grid merged 2 x 2

    def manifest_fields(self, config, model_dir: Path) -> dict:
        """Family axes: num_patches / num_visual, with 1024x1024 (1,024 tokens) as the optimum when allowed."""
        processor = self.processor_settings(model_dir)
        settings = Qwen3ImageSettings.from_dict(processor)
        n_max = settings.max_pixels // settings.factor ** 2
        n_opt = min(n_max, 1024)
        unit = settings.merge_size ** 2
        return self.family_fields(
            config, model_dir, dims=self.dims(config),
            visual={"max_visual_tokens": n_max, "position_rank": 3, "position_mode": "native"},
            layout=chat_layout(IMAGE_TOKEN, "grid_thw / merge^2", "none",
                               "mrope [3, L]: native; pruned rows keep native; decode at max+1+t"),
            processor=processor, options={},
            axes={"num_patches": [unit, unit * n_opt, unit * n_max], "num_visual": [1, n_opt, n_max]})

    def export_specs(self, model, config, dtype) -> dict[str, ExportSpec]:
        """vision: Qwen3VisionGraph (dynamic num_patches) -> image_features and visual_extra.k, each [n, d]."""
        import torch
        from torch.export import Dim

        from coverpruner.families.qwen3_vision_graph import Qwen3VisionGraph

        dims = self.dims(config)
        grid = (1, 8, 12)  # 96 patches, 24 tokens
        feeds = vision_inputs(np.zeros((96, dims["patch_dim"]), np.float32), grid, dims["spatial_merge_size"],
                              dims["num_position_embeddings"])
        args = (torch.randn(96, dims["patch_dim"], dtype=dtype),) + tuple(torch.from_numpy(feeds[k])
                                                                          for k in VISION_INPUTS[1:])
        patches = Dim("num_patches", min=4)
        shapes = ({0: patches}, {0: patches}, {0: patches}, {0: patches}, {0: patches})
        levels = dims.get("deepstack_levels", 0)
        return {"vision": ExportSpec(Qwen3VisionGraph(model.model.visual, levels).eval(), args, list(VISION_INPUTS),
                                     ["image_features", *extra_names(levels)], shapes)}


class Qwen3VisionRuntime(QwenVLRuntime):
    """contract.FamilyRuntime for an engine dir of a family on the Qwen3-VL tower: dynamic resolution at 32 px per
    visual token, host-side position-grid interpolation tables, every merger output a candidate (with its DeepStack
    rows as decoder extras when the dir has them), native M-RoPE positions (rank 3), videos as timestamped temporal
    patches (qwen3_video.py)."""

    def __init__(self, manifest):
        super().__init__(manifest)
        self.settings = Qwen3ImageSettings.from_dict(manifest.processor)
        dims = manifest.dims
        self.merge, self.patch = int(dims["spatial_merge_size"]), int(dims["patch_size"])
        self.num_position_embeddings = int(dims["num_position_embeddings"])
        self.extras = tuple(extra_names(int(dims.get("deepstack_levels", 0))))
        self.video_settings = Qwen3VideoSettings.from_dict(manifest.processor.get("video") or {})
        video_id = manifest.token_ids.get("video_token_id")
        if video_id is not None:
            self.video_token, self.video_token_id = VIDEO_TOKEN, int(video_id)

    def prepare_image(self, image, options: dict) -> VisionInputs:
        """Vision feeds (VISION_INPUTS; pixel_values [N, 1536] in the graph's float dtype), n = gh*gw/4, and one
        picture panel: the merged-patch grid (32x32 px cells of the resized image) over the whole image."""
        img = self.image(image, options)
        feeds = vision_inputs(img.pixel_values.astype(self.float_dtype, copy=False), img.grid_thw, self.merge,
                              self.num_position_embeddings)
        panel = self.grid_panel(img.grid_thw, img.resized, img.original, "resized image")
        return VisionInputs(feeds, img.num_visual_tokens, (panel,),
                            {"grid_thw": img.grid_thw, "resized": img.resized, "original": img.original})

    def _limit(self, options: dict) -> int:
        return options.get("max_video_frames") or DEFAULT_MAX_VIDEO_FRAMES

    def video_cost(self, video, options: dict):
        """contract.FamilyRuntime.video_cost: the header's geometry through qwen3_video.py's sampling and resize."""
        return video_cost(video, self.settings, self.video_settings, self._limit(options), where=video.where)

    def prepare_video(self, video, options: dict) -> VisionInputs:
        """A coverpruner.video.VideoInput -> vision feeds of its temporal patches (attention within each), n =
        t*gh*gw/4, one picture panel (the merged grid of temporal patch 0). Facts: kind "video", grid_thw,
        num_frames, second_per_grid_t (2 / fps), timestamps (seconds per temporal patch: the layout's text)."""
        vid = preprocess_video(video, self.settings, self.video_settings, self._limit(options), where=video.where)
        feeds = vision_inputs(vid.pixel_values.astype(self.float_dtype, copy=False), vid.grid_thw, self.merge,
                              self.num_position_embeddings)
        panel = self.grid_panel(vid.grid_thw, vid.resized, vid.original,
                                f"frames (temporal patch 0 of {vid.grid_thw[0]})")
        return VisionInputs(feeds, vid.num_visual_tokens, (panel,),
                            {"kind": "video", "grid_thw": vid.grid_thw, "resized": vid.resized,
                             "original": vid.original, "num_frames": vid.num_frames,
                             "second_per_grid_t": self.settings.temporal_patch_size / vid.fps,
                             "timestamps": vid.timestamps})

    def sampled_frames(self, video, options: dict) -> list:
        """A VideoInput -> its sampled frames (uint8 [H, W, 3] each, padded to an even count), for the picture."""
        return sampled_frames(video, self.video_settings, self._limit(options), video.where)

    def placeholder_text(self, token: str, rows: int, facts: dict) -> str:
        """An image: ``rows`` image tokens; a video: per temporal patch its timestamp and its vision span."""
        if facts.get("kind") != "video":
            return token * rows
        stamps = facts["timestamps"]
        return placeholder(stamps, rows // len(stamps), token)

    def native_positions(self, layout, visions) -> np.ndarray:
        """int64 [3, L]: get_rope_index's positions of the full native sequence (visions: the images and videos in
        order); a video of t temporal patches is t runs of grid (1, gh, gw), one per timestamped span."""
        visions = [visions] if isinstance(visions, VisionInputs) else list(visions)
        grids = [(1, g[1], g[2]) for v in visions for g in [v.facts["grid_thw"]] for _ in range(g[0])]
        return native_positions(layout.input_ids, self.visual_ids(), grids, self.merge)  # t = 1: temporal 0
