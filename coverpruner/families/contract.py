"""The family contract (v5): what export, engines and runtime ask a model family, typed.

A family (LLaVA-1.5, LLaVA-NeXT, Qwen2.5-VL, ...) is one package under families/ with a class satisfying
`Family`, registered by the `FAMILY = FamilyEntry(...)` its package's __init__ declares (the registry,
families/__init__.py, finds the packages itself); its `runtime(manifest)` returns a
`FamilyRuntime` bound to one engine dir. Nothing outside families/ tests which family it runs. Most
families build on the shared Hugging Face base, families/hf.py (`HFFamily`, `HFRuntime`); no family
imports another family. One request, as the runtime drives it (shapes for batch 1):

    image  --prepare_image-->  VisionInputs: feeds for vision.onnx, n, picture geometry, private facts
    video  --prepare_video-->  VisionInputs as an image's (facts["kind"] = "video"; families without video refuse)
    vision.onnx outputs  --image_span-->  ImageSpan: rows [S, d] of the image span, candidates [n] among them
    messages --conversation_layout([S_j])--> ConversationLayout: input_ids [L], image_spans [S_j] per image,
             instruction tokens per image (its message) and of the last user message (k images, k >= 0)
    native_positions  -> int64 [R, L]                      (R = position_rank: 1, or 3 for M-RoPE)
    probe over the native sequence, at visual_positions[candidates]  -> relevance [n]
    selector(V = rows[candidates], relevance)  -> keep [m] (indices into the candidates)
    kept rows = candidates[keep] U always_kept  (all S rows for budget "full")
    pruned sequence = text tokens + kept rows in native order; pruned_positions -> int64 [R, L']
    decoder extras (v4, DecoderSpec): ImageSpan.extras[name] [S, d] gathered with the same kept rows, zero at
        text rows, fed beside inputs_embeds at prefill (zeros at decode) and added after decoder layer k
    attention (v5, DecoderSpec.attention): sliding windows per layer and, in prefill, blocks of rows that attend
        to each other both ways (ImageSpan.blocks: one image crop's kept rows); AttentionSpec() = causal everywhere
    decode: the t-th generated token sits at decode_position(t) -> int64 [R]
    decoder state that is not KV (v5, DecoderSpec.kv_layers / states): layers without a KV cache carry named state
        tensors from call to call (a linear-attention layer's conv and recurrent state); the probe reads the first
        attention layer the family names (ProbeParts.layer, the hidden states entering it from ProbeParts.prefix)

Family modules import torch/transformers only inside export-time methods: the runtime imports them.

The export split (families never import export/; export/ asks the family):
  * the family hands over parts: `embed_tokens`, `probe_parts` (ProbeParts), `language_model`, `lm_head`, its
    `position_rank` and `dims`, and `probe_example_visual` (an example visual-column count);
    export/graph_specs.py wraps them into the embed, probe and decoder graphs (export/modules.py) itself;
  * the family's own graph, vision, is built by the family: `export_specs` returns {"vision": ExportSpec} with
    a torch wrapper that lives in families/ (families/hf_graphs.py's `VisionGraph` over `image_features`, or
    a package's own graphs module, e.g. families/qwen2_5_vl/graphs.py), imported lazily inside the method;
  * `manifest_fields` and `write_files` give the family's part of the engine dir.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class RequestOption:
    """A per-request option a family offers (e.g. LLaVA-NeXT's newline_policy).

    It reaches the family as ``options[name]`` in every FamilyRuntime call: from ``Pipeline.generate(...,
    name=value)`` / ``stream``, from ``coverpruner-run --<name with dashes> VALUE``, else from the manifest's
    ``options`` block (the default chosen at export), else ``default``.
    choices: allowed values (None: any value ``parse`` accepts). parse: CLI string or Python value -> value,
    raising ValueError with a one-line reason. metavar/help: for the CLI.
    """

    name: str
    help: str
    default: Any = None
    choices: tuple | None = None
    parse: Callable[[Any], Any] | None = None
    metavar: str | None = None

    def validate(self, value):
        """The option's value after ``parse``; ValueError (one line) when it is not allowed."""
        if value is None:
            return None
        if self.parse is not None:
            value = self.parse(value)
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"{self.name} must be one of {list(self.choices)}, got {value!r}")
        return value


@dataclass(frozen=True)
class GridPanel:
    """One grid of visual tokens laid over the original image, for the selection picture.

    title: panel caption. shape: (rows, cols) of the grid. box: (left, top, right, bottom) the grid covers,
    in original-image pixel coordinates (may extend past the image where the model saw padding).
    cells: int64 [rows*cols], row-major: the candidate index each cell shows, -1 where the cell is no
    candidate (padding, or a row that is not a candidate).
    """

    title: str
    shape: tuple[int, int]
    box: tuple[float, float, float, float]
    cells: np.ndarray


@dataclass(frozen=True)
class VisionInputs:
    """One image, prepared for the vision graph.

    feeds: vision.onnx inputs by name (the family's names, dtypes and shapes: e.g. pixel_values float32
    [1, 3, H, W] for LLaVA-1.5, [tiles, 3, H, W] for LLaVA-NeXT; cast to the graph's float dtype by the
    family). num_candidates: n, the selection candidates of this image (per request).
    panels: geometry for the selection picture. facts: family-private per-request facts (original size,
    tile grid, grid_thw, ...) that image_span / native_positions read back.
    chunks: optional feeds of bounded parts of the same input (a video's temporal patches) whose outputs,
    concatenated along their first axis in order, are the outputs of ``feeds``; the runtime then runs these one
    after the other instead (peak memory of one part, not of the whole: the attention cost is quadratic in the
    patches of one run). ``feeds`` stays the input's identity (its hash keys the vision cache).
    """

    feeds: dict[str, np.ndarray]
    num_candidates: int
    panels: tuple[GridPanel, ...] = ()
    facts: dict = field(default_factory=dict)
    chunks: tuple[dict[str, np.ndarray], ...] = ()


@dataclass(frozen=True)
class ImageSpan:
    """The rows the image contributes to the native sequence.

    rows: float [S, d] (graph float dtype), in native order (LLaVA-NeXT: base image, then the unpadded grid
    with an image_newline row after each grid row). candidates: int64 [n], ascending indices into rows of
    the selection candidates (V = rows[candidates]). always_kept: int64 [k], ascending indices into rows kept
    whatever the selection (LLaVA-NeXT newline_policy 'keep': the newline rows); empty otherwise.
    temporal: for a video, int64 [n] nondecreasing, the temporal patch of each candidate (selection within temporal
    windows groups candidates by it); None for an image.
    extras: the family's decoder extras (contract v4, DecoderSpec.extras): {graph input name: float [S, d]} in the
    graph float dtype, the same rows in the same order as ``rows`` (e.g. DeepStack features); empty without.
    blocks: int64 [S] (contract v5, with AttentionSpec.blocks): rows with the same value form one block whose rows
    (after pruning: its kept rows) attend to each other both ways in prefill (Gemma 3: one value per crop); None:
    the rows attend causally.
    """

    rows: np.ndarray
    candidates: np.ndarray
    always_kept: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    temporal: np.ndarray | None = None
    extras: dict = field(default_factory=dict)
    blocks: np.ndarray | None = None

    @property
    def features(self) -> np.ndarray:
        """V: float [n, d], the candidate rows."""
        return self.rows[self.candidates]


@dataclass(frozen=True)
class ConversationLayout:
    """The un-pruned input sequence of a conversation with k images (batch 1); k = 0 for text only.

    input_ids: int64 [L], each image placeholder expanded to that image's S_j image-token ids.
    image_spans: per image j (message order, then part order), int64 [S_j] ascending sequence indices of its rows.
    image_message: int64 [k], the index of the message holding image j.
    instruction_turn: per image j, int64 [T_j] indices of the tokens overlapping the text parts of image j's
    message (empty when that message has no text: its weights are then uniform).
    instruction_latest: int64 [T], the same for the last user message. text: the rendered conversation.
    turn_end (contract v5): the number of tokens that end at or before the chat template's generation prompt (the
    messages, which a later turn of the same conversation renders and tokenizes the same way; the generation prompt
    a later turn may render otherwise, e.g. Qwen3.5's "<think>" opening, and a token straddling its start, e.g.
    LLaVA's "▁ASSISTANT:", may merge otherwise); None when unknown. A decoder state that cannot be cut back is
    snapshotted there.
    """

    input_ids: np.ndarray
    image_spans: tuple[np.ndarray, ...]
    image_message: np.ndarray
    instruction_turn: tuple[np.ndarray, ...]
    instruction_latest: np.ndarray
    text: str = ""
    turn_end: int | None = None

    @property
    def num_images(self) -> int:
        return len(self.image_spans)

    @property
    def visual_positions(self) -> np.ndarray:
        """int64 [sum S_j]: every image row's sequence index, ascending (image 0's span when k = 1)."""
        return (np.concatenate(self.image_spans) if self.image_spans else np.zeros(0, np.int64)).astype(np.int64)

    @property
    def instruction_positions(self) -> np.ndarray:
        """int64 [T]: image 0's instruction tokens (the one-image request's), else the last user message's."""
        return self.instruction_turn[0] if self.image_spans else self.instruction_latest

    def instruction(self, j: int, demand: str) -> np.ndarray:
        """int64 [T]: the instruction tokens of image j's demand ("turn": its message; "latest": the last user
        message)."""
        return self.instruction_turn[j] if demand == "turn" else self.instruction_latest


@dataclass
class ProbeParts:
    """The probe layer's pieces the probe graph needs (torch modules / callables from the HF model).

    norm: the probe layer's input RMSNorm, [.., d] -> [.., d]; q_proj: [.., d] -> [.., H*hd] (or, with
    ``q_gate``, [.., H*2*hd]: per head hd query values then hd output-gate values, of which the probe keeps the
    query: the scores do not depend on the gate); k_proj: [.., d] -> [.., Hkv*hd];
    rotary(x, position_ids) -> (cos, sin) [1,L,rd] in x.dtype for the probe's position_ids ([1,L], or [R,1,L]
    for an M-RoPE family, which mixes its sections here; rd <= hd: a partial rotary turns the first rd dims);
    apply_rope(q, k, cos, sin) -> (q, k) for [1,heads,L,hd] tensors; scaling: 1/sqrt(hd).
    q_norm, k_norm: the attention variant with per-head RMSNorm (Qwen3, Qwen3-VL): modules [.., hd] -> [.., hd]
    applied to each head's query / key before rotary; None for plain attention.
    window: layer 0's sliding window W (contract v5: a query row sees the keys less than W rows before it, as
    AttentionSpec.windows[0]); None for full attention. (The instruction rows the probe reads are text rows, which no
    image block overlay unmasks: causal within the window is all they see.)
    layer, prefix (contract v5): the decoder layer whose attention the probe reads. 0 (prefix None): layer 0 on
    the embeddings. f > 0 (a decoder whose first layers have no attention matrix, e.g. Gated DeltaNet layers): the
    first full-attention layer; prefix(inputs_embeds [1,L,d], position_ids) -> the hidden states entering layer f
    [1,L,d], layers 0..f-1 run on the full native sequence at native positions (torch callable).
    project (contract v5, a family's proxy probe): project(normed hidden [1,L,d]) -> (queries [1,L,H*hd], keys
    [1,L,Hkv*hd]) of every row, in place of q_proj / k_proj (for projections that mix rows, e.g. a causal
    convolution); rotary None: no rotary (q_norm / k_norm, if given, still apply per head).
    kind: "exact" (the layer's own softmax attention) or "proxy" (a stand-in score), recorded as graphs.probe.kind.
    """

    norm: Any
    q_proj: Any
    k_proj: Any
    rotary: Any
    apply_rope: Any
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scaling: float
    q_norm: Any = None
    k_norm: Any = None
    window: int | None = None
    q_gate: bool = False
    layer: int = 0
    prefix: Any = None
    project: Any = None
    kind: str = "exact"


@dataclass
class GatedDeltaWeights:
    """A gated delta rule linear-attention layer (Gated DeltaNet: Qwen3-Next, Qwen3.5) as float32 arrays, HF Linear
    layout (weight [out, in]). Hk key heads of dk, Hv value heads of dv (Hv a multiple of Hk), C = 2*Hk*dk + Hv*dv.

    qkv: [C, d] (query, key, value channels in that order); conv: [C, K] causal depthwise kernel (SiLU after it, no
    bias); z: [Hv*dv, d] output gate; b: [Hv, d] (beta = sigmoid(x b^T)); a: [Hv, d], a_log, dt_bias: [Hv] (the
    per-token log decay g = -exp(a_log) * softplus(x a^T + dt_bias)); norm: [dv] scale of the gated RMSNorm
    (RMSNorm(o) * norm * silu(z) per value head, epsilon eps); out: [d, Hv*dv]. Queries and keys are L2-normalised
    per head (epsilon 1e-6) and queries scaled by 1/sqrt(dk) inside the rule."""

    qkv: np.ndarray
    conv: np.ndarray
    z: np.ndarray
    b: np.ndarray
    a: np.ndarray
    a_log: np.ndarray
    dt_bias: np.ndarray
    norm: np.ndarray
    out: np.ndarray
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int


@dataclass
class DecoderLayerWeights:
    """One decoder layer's float32 numpy weights in HF Linear layout (weight [out, in]).

    input_norm, post_norm: [d] RMSNorm scales (post_norm: the norm before the MLP); q/k/v: [H*hd, d], [H_kv*hd, d],
    [H_kv*hd, d] (+ biases [out] or None); o: [d, H*hd]; gate, up: [ffn, d]; down: [d, ffn].
    attn_out_norm, mlp_out_norm: [d] RMSNorm scales applied to the attention output and to the MLP output before
    each residual add (Gemma's sandwich norms); None for the Llama layout. Every scale is the one multiplied in
    (a (1 + w) norm's is 1 + w).
    q_gate (contract v5): q is [H*2*hd, d], per head hd query rows then hd output-gate rows, and the attention output
    is multiplied by sigmoid(gate) before o (Qwen3-Next / Qwen3.5 full attention).
    linear (contract v5): a linear-attention layer (GatedDeltaWeights) in place of the attention; q, k, v, o and
    their biases are then None.
    """

    input_norm: np.ndarray
    post_norm: np.ndarray
    q: np.ndarray | None
    k: np.ndarray | None
    v: np.ndarray | None
    q_bias: np.ndarray | None
    k_bias: np.ndarray | None
    v_bias: np.ndarray | None
    o: np.ndarray | None
    gate: np.ndarray
    up: np.ndarray
    down: np.ndarray
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    attn_out_norm: np.ndarray | None = None
    mlp_out_norm: np.ndarray | None = None
    q_gate: bool = False
    linear: GatedDeltaWeights | None = None


@dataclass
class DecoderWeights:
    """The text decoder as arrays, for graphs written op by op (export/ortform): layers, final norm [d], lm_head
    [V, d], RMSNorm epsilon, head counts and head_dim (of the attention layers), and rotary {"theta": float,
    "mrope_section": [t, h, w] or None, "mrope_interleaved": bool} (engines/rotary.py: sections in blocks, or
    interleaved as Qwen3-VL's), plus optionally "dim" (the rotated dims when a partial rotary turns fewer than
    head_dim), "factor" (linear rope scaling: frequencies divided by it) and, for a decoder whose layers rotate
    differently (Gemma 3: local and global bases), "tables" [{"theta", "factor"}] (tables 1, 2, ...; table 0 is the
    base above) and "layer_tables" [per layer: its table].
    activation: the MLP's gate activation, "silu" or "gelu_tanh"; scale: the attention's score scale (None:
    1/sqrt(head_dim))."""

    layers: list[DecoderLayerWeights]
    norm: np.ndarray
    lm_head: np.ndarray
    eps: float
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary: dict
    activation: str = "silu"
    scale: float | None = None


@dataclass(frozen=True)
class ToolCallFormat:
    """How a family's model writes one tool call in its answer (contract, optional): the text ``open`` +
    ``before_name`` + the function's name + ``before_arguments`` + its arguments (a JSON object) + ``close``, e.g.
    Qwen's '<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>'. ``separator`` stands between the
    answer's text and its first call and between two calls (what the chat template writes there when it renders an
    assistant turn with tool_calls). ``open`` and ``close`` may each be one token of the vocabulary (Qwen's added
    <tool_call> / </tool_call>); the runtime finds that out from the tokenizer."""

    open: str
    before_name: str
    before_arguments: str
    close: str
    separator: str = ""


@dataclass(frozen=True)
class ReasoningFormat:
    """The markers around a reasoning model's thinking (contract, optional), e.g. Qwen3's <think> ... </think>.
    An answer whose prompt ends in ``open`` (the chat template opened the thinking) starts inside it; the text up to
    ``close`` is the reasoning, the text after it the answer."""

    open: str
    close: str


@dataclass(frozen=True)
class ChatFeatures:
    """What an engine dir's chat template offers beyond turns of text and images (contract, optional; FamilyRuntime's
    optional ``chat_features``, default ChatFeatures(): none of it). tool_calls: the family's ToolCallFormat when the
    template renders the request's tools into the prompt (None otherwise: a call can only be forced by a grammar,
    the tools unseen by the model); reasoning: the family's ReasoningFormat (None: the model does not think);
    variables: the names the template reads besides the conversation, which a request's chat_template_kwargs may
    set (e.g. enable_thinking, add_vision_id)."""

    tool_calls: ToolCallFormat | None = None
    reasoning: ReasoningFormat | None = None
    variables: frozenset = frozenset()


@dataclass(frozen=True)
class DecoderExtra:
    """One extra per-row decoder input (contract v4): features added to the hidden states that decoder layer
    ``after_layer`` (0-based) outputs, at the rows that carry them (DeepStack: after layer k, the k-th level of
    visual features at the visual rows).

    name: the decoder graph's input (float [B, S, d], zero where a row has none; "visual_extra.{k}" by
    convention) and the key of ImageSpan.extras that holds each image's [S_img, d] rows.
    """

    name: str
    after_layer: int


@dataclass(frozen=True)
class AttentionSpec:
    """The decoder's attention masks beyond causal (contract v5; the default: every layer causal over everything).

    windows: per decoder layer its sliding window W (a query row sees the keys less than W rows before it: key >
    query - W, transformers' sliding_window_overlay) or None for full attention; () = every layer full.
    blocks: in prefill, the rows of one block (ImageSpan.blocks; after pruning, its kept rows) also see each other
    both ways, inside the window: AND(window, OR(causal, same block)), as transformers builds Gemma 3's masks from
    token_type_ids. Decode rows are text: causal (and windowed). A block is never split between two decoder calls
    (the prefix cache restores whole blocks only).
    """

    windows: tuple[int | None, ...] = ()
    blocks: bool = False

    @property
    def plain(self) -> bool:
        """True when nothing beyond causal attention is declared (the v4 decoder)."""
        return not self.blocks and all(w is None for w in self.windows)


@dataclass(frozen=True)
class DecoderState:
    """Decoder state that is not a KV cache (contract v5): one tensor of ``shape`` per layer of ``layers``, carried
    from each decoder call to the next (a linear-attention layer's conv state: its last K-1 inputs, or its recurrent
    state). It has no sequence axis: a prefix of it cannot be cut back, only snapshotted whole.

    name: the state's kind; the graph's input past_key_values.{layer}.{name} and output present.{layer}.{name}, each
    [B, *shape]. dtype: "float32", or "model" for the decoder's float dtype."""

    name: str
    layers: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str = "float32"


@dataclass(frozen=True)
class DecoderSpec:
    """What a family's decoder takes besides embeddings, positions and KV (contract v4, v5). extras: the extra
    per-row inputs, in graph-input order (empty: the v3 decoder). attention (v5): sliding windows and bidirectional
    prefill blocks. kv_layers (v5): the layers with a KV cache (None: every layer); states (v5): the decoder states
    that are not KV (DecoderState), in graph-input order after the KV cache. Export records them in the manifest
    (graphs.decoder.extras / attention / kv_layers / states); engines and runtime read that record and the graph,
    never the family."""

    extras: tuple[DecoderExtra, ...] = ()
    attention: AttentionSpec = AttentionSpec()
    kv_layers: tuple[int, ...] | None = None
    states: tuple[DecoderState, ...] = ()

    def kv_layer_list(self, num_layers: int) -> tuple[int, ...]:
        """The KV-cache layers of a decoder of ``num_layers`` layers, ascending."""
        return tuple(range(num_layers)) if self.kv_layers is None else tuple(sorted(self.kv_layers))


@dataclass
class ExportSpec:
    """How to export one graph: the torch module, example inputs, tensor names and dynamic axes.

    args: example positional inputs (sizes >= 2 on every dynamic axis so torch.export keeps them symbolic).
    dynamic_shapes: one entry per arg, {axis: torch.export.Dim} (nested for tuple args), as torch.export
    takes them. The axis names become the symbolic axes of the manifest's graph specs.
    """

    module: Any
    args: tuple
    input_names: list[str]
    output_names: list[str]
    dynamic_shapes: tuple


@runtime_checkable
class FamilyRuntime(Protocol):
    """A family's run-time rules for one engine dir (numpy only; no torch, no transformers).

    ``options`` is the dict of the family's request options, resolved (defaults filled in, validated).
    """

    #: R: 1 -> position_ids [B, S]; 3 -> position_ids [3, B, S] (M-RoPE t/h/w)
    position_rank: int

    def prepare_image(self, image, options: dict) -> VisionInputs:
        """Image (path, PIL image or uint8 array) -> vision inputs. ImageError / ValueError (one line) for
        images the family cannot take."""

    def prepare_video(self, video, options: dict) -> VisionInputs:
        """A coverpruner.video.VideoInput -> vision inputs (facts["kind"] == "video"), like prepare_image.
        VideoError / ValueError (one line) for a video the family cannot take; families without video refuse
        every video (the HF base's default)."""

    def video_cost(self, video, options: dict):
        """A coverpruner.video.VideoInput -> coverpruner.video.VideoCost (frames after sampling, their decoded
        size, visual tokens) from the file's header alone, no frame decoded (admission checks it against the
        context and --max-video-pixels before prepare_video); None when it cannot be known before decoding (a
        frame list). VideoError / ValueError (one line) as prepare_video."""

    def image_span(self, outputs: dict[str, np.ndarray], vision: VisionInputs, options: dict) -> ImageSpan:
        """The vision graph's outputs (by name, batch axis included) -> the image span of the sequence."""

    def conversation_layout(self, tokenizer, messages: list[dict], rows_per_image: list[int],
                            media: list[dict] | None = None, tools: list | None = None,
                            template_kwargs: dict | None = None) -> ConversationLayout:
        """Chat template + tokenization of a conversation. messages: [{"role": "system"|"user"|"assistant",
        "content": [{"type": "text", "text": str} | {"type": "image"} | {"type": "video"}, ...]}]
        (runtime/messages.py normalises OpenAI messages to this); the j-th image or video placeholder (counted
        together, in order) expands to ``rows_per_image[j]`` (S_j) tokens; media (each one's VisionInputs.facts,
        in order; the pipeline passes them) lets a family's placeholder text depend on the medium (Qwen3-VL
        stamps each temporal patch of a video with its time: text between the S_j rows).
        Chat features (given only when the request has them, families with chat_features): tools, the request's
        OpenAI function tools rendered by the template; template_kwargs, further template variables; and turns
        of a tool round trip: assistant messages with "tool_calls" ([{id, type, function: {name, arguments: a JSON
        object}}], content a string or absent) and "reasoning_content", and {"role": "tool", "content",
        "tool_call_id"} messages, which are rendered as the template renders them.
        ValueError (one line, naming messages[i].content[j]) for text the layout cannot take."""

    def native_positions(self, layout: ConversationLayout, visions: list[VisionInputs]) -> np.ndarray:
        """int64 [R, L]: the positions the model itself gives the full sequence (visions: the images in order,
        or the one image of a one-image layout)."""

    def pruned_positions(self, native: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """native int64 [R, L], rows int64 [L'] (ascending sequence indices kept) -> int64 [R, L'] positions of
        the pruned sequence (LLaVA: compact 0..L'-1; Qwen2.5-VL: native[:, rows])."""

    def decode_position(self, native: np.ndarray, pruned: np.ndarray, step: int) -> np.ndarray:
        """int64 [R]: position of the ``step``-th generated token (step 0 = the token prefill produced), given
        the native [R, L] and pruned [R, L'] positions. LLaVA: L' + step; Qwen2.5-VL: max(native) + 1 + step."""

    # chat features, optional (a runtime without them: ChatFeatures(), no answer starts in reasoning):
    #   chat_features: ChatFeatures                        what the chat template offers (tools, thinking, variables)
    #   opens_reasoning(messages, tools, template_kwargs)  -> bool: the conversation's prompt ends inside the
    #                                                      thinking (its answer starts with reasoning)


@dataclass(frozen=True)
class FamilyEntry:
    """How the registry (families/__init__.py) knows a family, declared as `FAMILY` in its package __init__.

    adapter: "module:Class" of the `Family`; model_types: HF config.model_type values it handles; aliases: short
    name -> HF repo id (coverpruner-export --model)."""

    adapter: str
    model_types: tuple[str, ...] = ()
    aliases: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class Family(Protocol):
    """A model family adapter (one package in families/, registered by the `FAMILY = FamilyEntry(...)` of its
    package __init__, which also holds its HF model types and aliases)."""

    name: str  # manifest "family" (= its registry key)
    support_files: tuple[str, ...]  # checkpoint files copied into the engine dir (tokenizer, processor, ...)
    request_options: tuple[RequestOption, ...]
    #: R: position_ids of embed/probe/decoder are [B, S] for R = 1 and [R, B, S] for R = 3 (M-RoPE)
    position_rank: int

    # -- run time (torch-free) -----------------------------------------------------------------
    def runtime(self, manifest) -> FamilyRuntime:
        """The run-time rules bound to one engine dir (coverpruner.engine_dir.Manifest). ValueError (one line)
        when the manifest lacks what the family needs."""

    # -- export time (torch, imported lazily) ----------------------------------------------------
    def load_model(self, model_dir, dtype: str = "float32"):
        """The HF model in eval mode, eager attention, loaded straight into ``dtype`` ('float32'|'float16')."""

    def dims(self, config) -> dict:
        """The manifest dims: at least hidden_size, num_layers, num_heads, num_kv_heads, head_dim, vocab_size."""

    def image_features(self, model, *vision_inputs):
        """The vision graph's computation (torch): vision inputs -> image_features (the projector's output)."""

    def embed_tokens(self, model):
        """nn.Embedding: input_ids int64 [B,S] -> inputs_embeds [B,S,d]."""

    def probe_parts(self, model) -> ProbeParts:
        """The probe layer's pieces for export/modules.ProbeGraph (layer 0's, or with ProbeParts.layer / prefix
        the first full-attention layer's of a decoder whose first layers have no attention matrix)."""

    # optional (contract v5): proxy_probe_parts(model) -> ProbeParts (kind "proxy") for `coverpruner-export --probe
    # proxy`, a cheaper stand-in score; families without it refuse that option in one line

    def language_model(self, model):
        """The decoder stack: inputs_embeds [B,S,d], position_ids [B,S] or [R,B,S] -> last_hidden_state."""

    def lm_head(self, model):
        """nn.Linear: hidden [.., d] -> logits [.., vocab]."""

    def decoder_weights(self, model) -> DecoderWeights:
        """The decoder's weights as float32 arrays (the ORT-form decoder is written from these); ValueError (one
        line) for a decoder the ORT form cannot express (e.g. a rope scaling it has no host rows for)."""

    def probe_example_visual(self, config) -> int:
        """Visual-column count of the probe graph's example inputs (any n >= 2; the axis stays dynamic)."""

    def decoder_spec(self, config) -> DecoderSpec:
        """The decoder's extra inputs (contract v4; the HF base: none), its attention masks (v5: the HF base reads
        the text config's layer_types / sliding_window; no blocks) and its non-KV state (v5: the layers with a KV
        cache and the DecoderStates of the others). Each extra's features come from the family's vision graph
        through ImageSpan.extras; export adds them after the named layers of `language_model(model).layers`
        (standard form) or of `decoder_weights` (ORT form). A decoder with states hands the standard form its cache
        through `decoder_cache`."""

    def manifest_fields(self, config, model_dir) -> dict:
        """The family's part of manifest.json: dims, visual {max_visual_tokens, position_rank, position_mode},
        token_ids, chat_template, layout, processor, options (request-option defaults), axes ({symbolic axis:
        [min, opt, max]} for TensorRT profiles of family-defined axes)."""

    def export_specs(self, model, config, dtype) -> dict[str, ExportSpec]:
        """{"vision": ExportSpec} (torch dtype ``dtype``): the family's own graph with its torch wrapper.
        embed/probe/decoder are built by export/graph_specs.py from the parts above."""

    def write_files(self, model, out_dir) -> dict[str, str]:
        """Extra arrays the runtime needs (e.g. LLaVA-NeXT's image_newline vector): writes them into out_dir
        and returns {key: file name}; the exporter hashes them into the manifest's ``files``."""
