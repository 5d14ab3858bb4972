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

from coverpruner.families.contract import ConversationLayout
from coverpruner.runtime.sampling import SamplingConfig


@dataclass(frozen=True)
class Request:
    """One validated request (Pipeline.request / chat_request build it; options are checked before any work).

    conversation: the normalised messages and their images (runtime.messages.Conversation): the one record of
    what was asked (generate's image + prompt are the conversation of one user message).
    budget: kept visual tokens per image, None = "full" (no pruning). demand: "turn" (an image's demand comes from
    its own message) or "latest" (from the last user message).
    method: a coverpruner.selection name. tau: coverage threshold. stop_ids: the EOS ids that end the answer
    (finish_reason "eos"; empty with ignore_eos). options: the family's request options, resolved (e.g.
    {"newline_policy": "drop"}). grammar: the checked response_format (runtime.grammar.Grammar) the answer is
    constrained to, or None. stop: strings that end the answer where they appear in its text; stop_token_ids:
    further ids that end it (both finish_reason "stop"; runtime/stop.py). n: answers (forked after one prefill).
    top_logprobs: None (no logprobs) or the alternatives reported with each token's log-probability (0..20).
    tool_plan: the calls its answer may make (runtime.tool_calls.ToolPlan) or None; reasoning: the family's
    ReasoningFormat when its prompt opened the thinking (the answer starts with reasoning), else None. Both are
    what runtime.answer_parts splits the answer's text by.
    """

    conversation: object
    budget: int | None = 64
    method: str = "coverpruner"
    tau: float = 0.3
    max_new_tokens: int = 128
    sampling: SamplingConfig = SamplingConfig()
    stop_ids: frozenset = frozenset()
    options: dict = field(default_factory=dict)
    demand: str = "turn"
    grammar: object = None
    stop: tuple = ()
    stop_token_ids: frozenset = frozenset()
    n: int = 1
    top_logprobs: int | None = None
    tool_plan: object = None
    reasoning: object = None

    @property
    def seed(self) -> int | None:
        """The one seed of the request: sampling and the random baseline selector."""
        return self.sampling.seed


@dataclass
class NativeSequence:
    """The full (unpruned) sequence of a conversation with k images (k >= 0), as the model itself would see it.

    visions: per image, the family's vision inputs (n_j, picture panels). spans: per image, its span (rows float
    [S_j,d], candidates int64 [n_j] into the rows, always_kept). layout: the ConversationLayout (input_ids int64
    [L], image_spans int64 [S_j] per image, instruction tokens per image and of the last user message).
    embeds: float [L,d] (graph float dtype): text embeddings with each image's rows at its span.
    positions: int64 [R,L], the family's native positions. image_hashes: per image, the digest of its vision
    feeds (runtime.prefix_cache.feeds_hash), extended by its decoder extras when it has any. extras: the decoder
    extras (contract v4) {graph input name: float [L,d]}, each image's ImageSpan.extras at its span, zeros at
    text rows ({} without extras); with contract v5's bidirectional blocks also engine_dir.ATTENTION_BLOCKS: int64 [L],
    each row's block (-1 at text rows; runtime/attention_blocks.py), gathered and fed like the extras. Everything per image is a list in image order (a generate request's one image
    is index 0).
    """

    visions: list
    spans: list
    layout: ConversationLayout
    embeds: np.ndarray
    positions: np.ndarray
    timings: dict = field(default_factory=dict)
    image_hashes: list = field(default_factory=list)
    extras: dict = field(default_factory=dict)

    @property
    def length(self) -> int:
        """L, the native sequence length (all image rows included)."""
        return len(self.layout.input_ids)

    @property
    def is_text(self) -> np.ndarray:
        """bool [L]: True at the text tokens, False at the image rows."""
        mask = np.ones(self.length, dtype=bool)
        mask[self.layout.visual_positions] = False
        return mask

    def extras_at(self, rows: np.ndarray) -> dict[str, np.ndarray] | None:
        """The decoder extras of the fed rows (int64 [S] native indices): {name: float [S, d]}; None without
        extras."""
        return {name: values[rows] for name, values in self.extras.items()} or None

    def candidates_of(self, j: int) -> np.ndarray:
        """int64 [n_j]: image j's candidates' sequence indices (the probe's visual columns)."""
        return self.layout.image_spans[j][self.spans[j].candidates]


@dataclass
class ImageSelection:
    """Which rows of one image the decoder sees.

    keep: int64 [m] candidate indices kept, ascending (all n for budget "full"). relevance: float32 [n] layer-0
    demand, or None when the method did not need it (or the image's message has no text: uniform weights).
    kept_rows: int64 [k] image-span rows kept, ascending (candidates[keep] plus the family's always-kept rows;
    all S for budget "full").
    """

    keep: np.ndarray
    relevance: np.ndarray | None
    kept_rows: np.ndarray


@dataclass
class Selection:
    """Per image (in order) its ImageSelection."""

    images: list
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
    cached: int = 0  # rows restored from the prefix cache instead of prefilled
    identity: np.ndarray | None = None  # int64 [L', C]: the rows' identities (runtime.prefix_cache.row_identity)

    @property
    def length(self) -> int:
        """L', the pruned sequence length (what the decoder's cache holds after prefill)."""
        return len(self.rows)
