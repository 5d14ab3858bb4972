"""What one request returns: text, tokens, the kept visual tokens, demand and timings."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: Keys of ``GenerationResult.timings`` (seconds). ``preprocess`` = image preprocessing + chat
#: template + tokenization; ``decode`` = all decode steps after the first token (which prefill gives).
TIMING_KEYS = ("preprocess", "vision", "embed", "probe", "select", "prefill", "decode", "total")


@dataclass
class ImageResult:
    """One image or video of a request: n candidates, kept_indices int64 [m] ascending, relevance float32 [n] or
    None, its picture panels (runtime.visualize), kind "image" or "video", and for a video {"grid_thw": [t, h, w],
    "num_frames": int, "second_per_grid_t": float} (video; None for an image). A video's candidates are its
    merged tokens temporal patch by temporal patch (row-major within each)."""

    num_visual_tokens: int
    kept_indices: np.ndarray
    relevance: np.ndarray | None
    panels: tuple = ()
    kind: str = "image"
    video: dict | None = None

    @property
    def grid_thw(self) -> list[int] | None:
        """A video's [t, h, w] in 14-px patches (video_grid_thw); None for an image."""
        return None if self.video is None else self.video["grid_thw"]

    @property
    def num_frames(self) -> int | None:
        """A video's frames after sampling and padding; None for an image."""
        return None if self.video is None else self.video["num_frames"]

    @property
    def second_per_grid_t(self) -> float | None:
        """Seconds one temporal patch of a video spans (temporal_patch_size / fps); None for an image."""
        return None if self.video is None else self.video["second_per_grid_t"]

    def to_dict(self) -> dict:
        out = {"kind": self.kind, "num_visual_tokens": int(self.num_visual_tokens),
               "kept_indices": [int(i) for i in self.kept_indices],
               "relevance": None if self.relevance is None else [float(x) for x in self.relevance]}
        if self.video is not None:
            out.update(self.video)
        return out


@dataclass
class GenerationResult:
    """One answer.

    token_ids: generated ids (the EOS id included when generation stopped on it).
    timings: seconds per stage, keys TIMING_KEYS (``timings_ms``: the same in milliseconds, computed).
    images: per image or video of the request, in order, its ImageResult (n candidates, kept_indices,
    relevance, panels, ...): the one record of the selection. ``kept_indices`` / ``relevance`` /
    ``num_visual_tokens`` / ``panels`` are image 0's, read from it (empty / None / 0 / () without images).
    options: the family's request options as they were applied (e.g. {"newline_policy": "drop"}).
    cached_tokens: pruned-prefix rows restored from the prefix cache. demand: "turn" or "latest".
    finish_reason "stop": a stop string matched in the text (``text`` ends before it; ``token_ids`` end with the
    token that completed the match) or a stop token id came; ``stop_reason`` is that string or id (None otherwise).
    """

    text: str
    token_ids: list[int]
    timings: dict
    prompt_tokens: int  # native sequence length L (all visual tokens)
    prefill_tokens: int  # sequence length the decoder saw after pruning
    budget: int | None
    method: str
    finish_reason: str  # "eos", "stop", "grammar" (response_format complete), "length" (max_new_tokens), "context"
    options: dict = field(default_factory=dict)
    images: list = field(default_factory=list)
    cached_tokens: int = 0
    demand: str = "turn"
    stop_reason: str | int | None = None

    # The one-image view (a generate request's image; image 0 of a conversation): read from ``images``, never
    # stored beside it. coverpruner-run --json and the server's "coverpruner" object report it at the top level.
    @property
    def kept_indices(self) -> np.ndarray:
        """int64 [m]: image 0's candidate indices kept, ascending (all n for budget "full"); empty without images."""
        return self.images[0].kept_indices if self.images else np.zeros(0, np.int64)

    @property
    def relevance(self) -> np.ndarray | None:
        """float32 [n]: image 0's layer-0 demand, or None when no method needed it (or without images)."""
        return self.images[0].relevance if self.images else None

    @property
    def num_visual_tokens(self) -> int:
        """n, image 0's candidates (per request for families with dynamic resolution); 0 without images."""
        return self.images[0].num_visual_tokens if self.images else 0

    @property
    def panels(self) -> tuple:
        """Image 0's geometry of its candidates over the original image (runtime.visualize draws it)."""
        return self.images[0].panels if self.images else ()

    @property
    def timings_ms(self) -> dict:
        """``timings`` in milliseconds (computed from it: one record of each time)."""
        return {k: v * 1e3 for k, v in self.timings.items()}

    @property
    def decode_tokens_per_s(self) -> float:
        """Decode steps per second (tokens after the first); 0.0 when there were none."""
        steps = max(len(self.token_ids) - 1, 0)
        return steps / self.timings["decode"] if steps and self.timings["decode"] > 0 else 0.0

    def to_dict(self) -> dict:
        """JSON-ready dict (lists instead of arrays)."""
        return {
            "text": self.text,
            "token_ids": [int(t) for t in self.token_ids],
            "kept_indices": [int(i) for i in self.kept_indices],
            "relevance": None if self.relevance is None else [float(x) for x in self.relevance],
            "num_visual_tokens": self.num_visual_tokens,
            "kept_tokens": int(len(self.kept_indices)),
            "prompt_tokens": self.prompt_tokens,
            "prefill_tokens": self.prefill_tokens,
            "budget": self.budget,
            "method": self.method,
            "finish_reason": self.finish_reason,
            "options": dict(self.options),
            "images": [i.to_dict() for i in self.images],
            "cached_tokens": self.cached_tokens,
            "demand": self.demand,
            "stop_reason": self.stop_reason,
            "timings": {k: float(v) for k, v in self.timings.items()},
            "decode_tokens_per_s": self.decode_tokens_per_s,
        }
