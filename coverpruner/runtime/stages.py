"""What one request carries from stage to stage: its options and each stage's typed result.

    Request --Pipeline.native_sequence--> NativeSequence --Pipeline.select--> Selection
            --Pipeline.prefill--> Prefill (first logits + DecodeState) --Pipeline.decode (per token)--> logits

Shapes for one request: n candidates, S image-span rows, d hidden size, L native length, L' pruned length,
R position rank (1, or 3 for M-RoPE), V vocabulary. Each result's ``timings`` holds the seconds of the
GenerationResult timing keys (runtime.result.TIMING_KEYS) that its stage measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from coverpruner.families.contract import ImageSpan, NativeLayout, VisionInputs
from coverpruner.runtime.sampling import SamplingConfig


@dataclass(frozen=True)
class Request:
    """One validated request (Pipeline.request builds it; options are checked before any work).

    image: path, PIL image or uint8 array [H,W,3]. budget: kept visual tokens, None = "full" (no pruning).
    method: a coverpruner.selection name. tau: coverage threshold. stop_ids: token ids that end the answer
    (empty with ignore_eos). options: the family's request options, resolved (e.g. {"newline_policy": "drop"}).
    """

    image: object
    prompt: str
    budget: int | None = 64
    method: str = "coverpruner"
    tau: float = 0.3
    max_new_tokens: int = 128
    sampling: SamplingConfig = SamplingConfig()
    stop_ids: frozenset = frozenset()
    options: dict = field(default_factory=dict)

    @property
    def seed(self) -> int | None:
        """The one seed of the request: sampling and the random baseline selector."""
        return self.sampling.seed


@dataclass
class NativeSequence:
    """The full (unpruned) sequence, as the model itself would see it.

    vision: the family's vision inputs (n, picture panels). span: the image span (rows float [S,d],
    candidates int64 [n] into the rows, always_kept int64 [k]). layout: input_ids int64 [L], visual_positions
    int64 [S], instruction_positions int64 [T]. embeds: float [L,d] (graph float dtype): text embeddings with
    the image rows at visual_positions. positions: int64 [R,L], the family's native positions.
    """

    vision: VisionInputs
    span: ImageSpan
    layout: NativeLayout
    embeds: np.ndarray
    positions: np.ndarray
    timings: dict = field(default_factory=dict)

    @property
    def length(self) -> int:
        """L, the native sequence length (all image rows included)."""
        return len(self.layout.input_ids)

    @property
    def num_candidates(self) -> int:
        """n, the image's selectable rows."""
        return len(self.span.candidates)

    @property
    def is_text(self) -> np.ndarray:
        """bool [L]: True at the text tokens, False at the image rows."""
        mask = np.ones(self.length, dtype=bool)
        mask[self.layout.visual_positions] = False
        return mask

    @property
    def candidate_positions(self) -> np.ndarray:
        """int64 [n]: the candidates' sequence indices (the probe's visual columns)."""
        return self.layout.visual_positions[self.span.candidates]


@dataclass
class Selection:
    """Which image rows the decoder sees.

    keep: int64 [m] candidate indices kept, ascending (all n for budget "full"). relevance: float32 [n] layer-0
    demand, or None when the method did not need it. kept_rows: int64 [k] image-span rows kept, ascending
    (candidates[keep] plus the family's always-kept rows; all S for budget "full").
    """

    keep: np.ndarray
    relevance: np.ndarray | None
    kept_rows: np.ndarray
    timings: dict = field(default_factory=dict)


@dataclass
class DecodeState:
    """Where the decode loop of one request stands.

    native: int64 [R,L] and pruned: int64 [R,L'] positions (the family's decode rule reads both). step: the
    index of the generated token the next decode call feeds (0 = the token prefill produced). max_tokens: the
    most tokens this request generates. limit: the finish_reason when it gets there: "length" (max_new_tokens)
    or "context" (the context window ends first).
    """

    native: np.ndarray
    pruned: np.ndarray
    max_tokens: int
    limit: str = "length"
    step: int = 0


@dataclass
class Prefill:
    """The pruned sequence after the decoder's prefill.

    rows: int64 [L'] sequence indices kept (text tokens + kept image rows), ascending. logits: float [V] of the
    last position (a copy; the decoder's own buffer is overwritten by the next call). state: the decode loop's
    start (step 0).
    """

    rows: np.ndarray
    logits: np.ndarray
    state: DecodeState
    timings: dict = field(default_factory=dict)

    @property
    def length(self) -> int:
        """L', the pruned sequence length (what the decoder's cache holds after prefill)."""
        return len(self.rows)
