"""The shared Hugging Face base of every family: what LLaVA-1.5, LLaVA-NeXT and Qwen2.5-VL have in common.

Export time (`HFFamily`): the chat template shipped with the checkpoint, loading the
``*ForConditionalGeneration`` model (eager attention, straight into the target dtype), where the token table,
the decoder stack, the LM head and layer 0's probe parts sit, the decoder dims and token ids, and the manifest
fields every family records. Run time (`HFRuntime`, numpy only): the facts read from the manifest and the
chat-template layout (jinja2 rendering with transformers' ``{% generation %}`` tag, placeholder expansion,
tokenization of a conversation into a ConversationLayout); `CompactPositions`, the LLaVA families' position
scheme. CLIP's mean/std (the default of every processor here) are written once, below.

What a family provides is typed in coverpruner.families.contract (Family, FamilyRuntime). Importing this module
does not import torch or transformers; the export-time methods import them inside their bodies.
"""

from __future__ import annotations

import functools

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from coverpruner.families.contract import (AttentionSpec, ChatFeatures, ConversationLayout, DecoderLayerWeights,
                                           DecoderSpec, DecoderWeights, ProbeParts, ReasoningFormat, ToolCallFormat)

# OpenAI CLIP's normalisation: the image_mean/image_std default of the CLIP, LLaVA-NeXT and Qwen2-VL processors
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

#: the name of the tool HFRuntime.chat_features renders to learn whether a chat template renders tools
_PROBE_TOOL = "coverpruner_probe_tool"

# one sentinel per text part of a conversation (the k-th text part renders as TEXT_SENTINEL.format(k));
# invisible separator chars: never in real text
TEXT_SENTINEL = "\u2063COVERPRUNER_TEXT{}\u2063"


def render_chat_template(chat_template: str, messages: list[dict], add_generation_prompt: bool = True,
                         tools: list | None = None, **kwargs) -> str:
    """Render an HF chat template with jinja2 the way transformers does (trim/lstrip blocks, sandbox, its
    ``tojson`` filter: json.dumps without HTML escaping or sorted keys, ``strftime_now``); ``tools`` (OpenAI function
    tools) and ``kwargs`` (chat_template_kwargs) are template variables as in transformers' apply_chat_template.

    The `{% generation %}` block tag (transformers' assistant-mask extension) is accepted and renders
    its body unchanged, so llava-hf templates work without transformers. kwargs also carry what transformers passes
    from the tokenizer (its special tokens, e.g. bos_token, which Gemma's template renders).
    """
    return _compiled_template(chat_template).render(**kwargs, messages=messages, tools=tools,
                                                    add_generation_prompt=add_generation_prompt)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    """transformers' tojson filter: Jinja's own escapes HTML characters and sorts keys (a tool's schema would not
    render as the model saw it in training)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    import datetime

    return datetime.datetime.now().strftime(fmt)


#: what a chat template reads that no request sets (the conversation, and the environment's own globals)
TEMPLATE_RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "documents", "raise_exception",
                               "bos_token", "strftime_now", "range", "dict", "namespace", "cycler", "joiner", "lipsum"})


def template_variables(chat_template: str) -> frozenset:
    """The names a chat template reads that a request may set (its undeclared variables, e.g. enable_thinking,
    add_vision_id), besides TEMPLATE_RESERVED."""
    from jinja2 import meta

    env = _compiled_template(chat_template).environment
    return frozenset(meta.find_undeclared_variables(env.parse(chat_template))) - TEMPLATE_RESERVED


@functools.lru_cache(maxsize=16)
def _compiled_template(chat_template: str):
    """The jinja2 Template of a chat template, compiled once per process (compiling took ~0.2 s per request; a
    compiled template renders from any thread)."""
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _Generation(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    def _raise(message):
        raise ValueError(f"chat template raised: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[_Generation,
                                                                                       "jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    env.filters["tojson"] = _tojson
    return env.from_string(chat_template)


def instruction_positions_from_offsets(offsets: list[tuple[int, int]], span: tuple[int, int]) -> np.ndarray:
    """Indices of tokens whose non-empty character span [a, b) overlaps `span` (design rule). int64 [T]."""
    return OffsetIndex(offsets).overlapping([span])


class OffsetIndex:
    """Tokens' character offsets, indexed once so that finding the tokens that overlap many spans costs
    O(tokens + spans x log tokens), not O(tokens x spans): a conversation of 100,000 text parts would otherwise
    take minutes. The non-empty offsets of one tokenized text start and end in non-decreasing order (checked;
    otherwise every span is a vectorised scan), so the tokens overlapping [start, end) are one index range."""

    def __init__(self, offsets: list[tuple[int, int]]):
        arr = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
        self._index = np.flatnonzero(arr[:, 1] > arr[:, 0]).astype(np.int64)  # non-empty tokens only
        self._a, self._b = arr[self._index, 0], arr[self._index, 1]
        self._sorted = bool(np.all(np.diff(self._a) >= 0) and np.all(np.diff(self._b) >= 0))

    def overlapping(self, spans) -> np.ndarray:
        """Sorted unique token indices (int64 [T]) whose non-empty offsets overlap any [start, end) of ``spans``."""
        se = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
        if self._sorted:  # a < end and b > start: one contiguous run of the sorted tokens per span
            lo = np.searchsorted(self._b, se[:, 0], side="right")
            hi = np.maximum(lo, np.searchsorted(self._a, se[:, 1], side="left"))
            counts = hi - lo
            # the runs [lo, hi) laid end to end: each run's first slot jumps to its lo, the others step by one
            steps = np.ones(int(counts.sum()), dtype=np.int64)
            nonempty = counts > 0
            starts = lo[nonempty]
            if starts.size:
                steps[0] = starts[0]
                prev_end = hi[nonempty][:-1] - 1
                steps[np.cumsum(counts[nonempty])[:-1]] = starts[1:] - prev_end
            hits = self._index[np.cumsum(steps)] if steps.size else np.zeros(0, np.int64)
        else:
            hits = np.concatenate([self._index[(self._a < e) & (self._b > s)] for s, e in se] or
                                  [np.zeros(0, np.int64)])
        return np.unique(hits).astype(np.int64)


@dataclass(frozen=True)
class RenderedConversation:
    """A conversation through the chat template, image placeholders expanded.

    text: what the tokenizer sees. text_spans: per message, the [start, end) character spans of its text parts.
    messages_end: the character where the generation prompt starts (the template rendered without it is the text
    up to there), None when the template renders the messages otherwise without it.
    """

    text: str
    text_spans: tuple[tuple[tuple[int, int], ...], ...]
    messages_end: int | None = None


#: roles whose text parts are located in the rendered prompt (instruction tokens come from user turns). An
#: assistant's or a tool's turn passes through as given: templates read those texts (Qwen3 splits an assistant turn
#: at </think>, a call after non-empty content is preceded by a newline), so they must see the real text, as
#: transformers' apply_chat_template gives it
LOCATED_ROLES = ("system", "user")


def _checked_text(text: str, where: str, bad: tuple[str, ...], image_token: str, video_token: str | None) -> None:
    for b in bad:
        if b in text:
            what = ("the image token" if b == image_token else "the video token" if b == video_token
                    else "the image markers")
            raise ValueError(f"{where}: the text must not contain {what} {b!r}; images are placed by the chat "
                             "template")


def render_conversation(chat_template: str, messages: list[dict], image_token: str, rows_per_image: list[int],
                        reserved: tuple[str, ...] = (), video_token: str | None = None,
                        expand=None, tools: list | None = None, template_kwargs: dict | None = None,
                        context: dict | None = None) -> RenderedConversation:
    """Render ``messages`` (each {"role", "content": [{"type": "text", "text"} | {"type": "image"}]}) with the
    chat template (add_generation_prompt), expand the j-th image placeholder to ``rows_per_image[j]`` copies of
    ``image_token`` and record each text part's character span (every text part of a system or user turn renders as
    a unique sentinel, then the texts are put back; assistant and tool turns pass through whole: LOCATED_ROLES).
    A {"type": "video"} part renders as the template's video placeholder,
    ``video_token``, expanded the same way (``rows_per_image`` counts images and videos together, in order);
    ValueError for a video part when the family has no video token. ValueError (one line, naming
    messages[i].content[j]) when a text holds ``image_token`` or a ``reserved`` string, or the template does not
    render each part exactly once. ``expand(j, token, rows)`` -> str, when given, is the text the j-th placeholder
    becomes instead of ``token * rows`` (Qwen3-VL's timestamped video frames). tools, template_kwargs: the
    template's ``tools`` and a request's variables; context: the tokenizer's special tokens the template reads
    (bos_token); both go to render_chat_template, context winning."""
    marked, texts, images, kinds = [], [], 0, []
    tokens = {"image": image_token, "video": video_token}
    bad = (image_token, *([video_token] if video_token else []), *reserved)
    for i, msg in enumerate(messages):
        if msg["role"] not in LOCATED_ROLES:
            content = msg.get("content")
            for j, part in enumerate([{"text": content}] if isinstance(content, str) else content or []):
                _checked_text(part.get("text", ""), f"messages[{i}].content" + ("" if isinstance(content, str)
                                                                               else f"[{j}]"),
                              bad, image_token, video_token)
            marked.append(msg)
            continue
        parts = []
        for j, part in enumerate(msg["content"]):
            if part["type"] == "text":
                _checked_text(part["text"], f"messages[{i}].content[{j}]", bad, image_token, video_token)
                parts.append({"type": "text", "text": TEXT_SENTINEL.format(len(texts))})
                texts.append((i, part["text"]))
            else:
                if part["type"] == "video" and video_token is None:
                    raise ValueError(f"messages[{i}].content[{j}]: this model family takes no video")
                parts.append({"type": part["type"]})
                kinds.append(part["type"])
                images += 1
        marked.append({"role": msg["role"], "content": parts})
    if images != len(rows_per_image):
        raise ValueError(f"the messages hold {images} images; {len(rows_per_image)} image spans were given")
    template_kwargs = {**(template_kwargs or {}), **(context or {})}
    rendered = render_chat_template(chat_template, marked, add_generation_prompt=True, tools=tools or None,
                                    **template_kwargs)
    messages_only = render_chat_template(chat_template, marked, add_generation_prompt=False, tools=tools or None,
                                         **template_kwargs)
    # the generation prompt is the rendered text's tail when the messages render alike without it
    prompt_tail = len(rendered) - len(messages_only) if rendered.startswith(messages_only) else None
    placeholders = "|".join(re.escape(t) for t in (image_token, video_token) if t)
    pieces = re.split("(" + placeholders + "|\u2063COVERPRUNER_TEXT\\d+\u2063)", rendered)
    out, spans, seen, image = [], [[] for _ in messages], set(), 0
    length = 0
    for piece in pieces:
        if piece in (image_token, video_token):
            if image >= len(rows_per_image) or tokens[kinds[image]] != piece:
                raise ValueError(f"chat template rendered its placeholders out of order or more than the {images} "
                                 "images and videos")
            rows = int(rows_per_image[image])
            piece = piece * rows if expand is None else expand(image, piece, rows)
            image += 1
        elif piece.startswith("\u2063COVERPRUNER_TEXT"):
            k = int(piece[len("\u2063COVERPRUNER_TEXT"):-1])
            if k in seen:
                raise ValueError(f"chat template rendered text part {k} twice")
            seen.add(k)
            i, piece = texts[k]
            spans[i].append((length, length + len(piece)))
        out.append(piece)
        length += len(piece)
    if image != images or len(seen) != len(texts):
        raise ValueError(f"chat template rendered {image} of {images} images and {len(seen)} of {len(texts)} "
                         "text parts")
    return RenderedConversation("".join(out), tuple(tuple(s) for s in spans),
                                None if prompt_tail is None else length - prompt_tail)


def tokenize_conversation(tokenizer, rendered: RenderedConversation, messages: list[dict], image_token_id: int,
                          rows_per_image: list[int], video_token_id: int | None = None,
                          add_special_tokens: bool = True) -> ConversationLayout:
    """Tokenize a rendered conversation (BOS from the tokenizer's post-processor, as HF does, unless
    ``add_special_tokens`` is False: a template that renders its own BOS, whose text transformers tokenizes without
    adding one) and locate each image's rows (the j-th run of ``rows_per_image[j]`` image tokens) and the
    instruction tokens (non-empty offsets overlapping the text parts of a message, image tokens never). Videos
    (``video_token_id``) count as images here: their spans are in the same list, in order. ValueError on a count
    mismatch."""
    enc = tokenizer.encode(rendered.text, add_special_tokens=add_special_tokens)
    ids = np.asarray(enc.ids, dtype=np.int64)
    media_ids = [image_token_id] + ([video_token_id] if video_token_id is not None else [])
    visual = np.flatnonzero(np.isin(ids, media_ids)).astype(np.int64)
    if visual.size != sum(rows_per_image):
        raise ValueError(f"tokenized conversation has {visual.size} image tokens (id {image_token_id}), expected "
                         f"{sum(rows_per_image)}")
    bounds = np.cumsum([0, *rows_per_image])
    image_spans = tuple(visual[a:b] for a, b in zip(bounds[:-1], bounds[1:]))

    offsets = OffsetIndex(enc.offsets)

    def instruction(i: int) -> np.ndarray:
        pos = offsets.overlapping(rendered.text_spans[i])
        return pos[~np.isin(pos, visual)]

    image_message = [i for i, m in enumerate(messages) if m["role"] in LOCATED_ROLES
                     for p in m["content"] if p["type"] in ("image", "video")]
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    latest = instruction(users[-1]) if users else np.zeros(0, np.int64)
    turn_end = None
    if rendered.messages_end is not None:  # the tokens wholly before the generation prompt (offsets ascend)
        ends = np.asarray([b for _, b in enc.offsets], dtype=np.int64)
        turn_end = int(np.searchsorted(ends, rendered.messages_end, side="right"))
    return ConversationLayout(ids, image_spans, np.asarray(image_message, dtype=np.int64),
                              tuple(instruction(i) for i in image_message), latest, rendered.text, turn_end)


class CompactPositions:
    """Position scheme of the LLaVA families (rank 1): native 0..L-1; a pruned sequence is re-packed
    0..L'-1; the t-th generated token sits at L' + t."""

    position_rank = 1

    def native_positions(self, layout: ConversationLayout, vision=None) -> np.ndarray:
        """int64 [1, L] = 0..L-1."""
        return np.arange(len(layout.input_ids), dtype=np.int64)[None, :]

    def pruned_positions(self, native: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """int64 [1, L'] = 0..L'-1 for the L' kept rows."""
        return np.arange(len(rows), dtype=np.int64)[None, :]

    def decode_position(self, native: np.ndarray, pruned: np.ndarray, step: int) -> np.ndarray:
        """int64 [1] = L' + step."""
        return np.array([pruned.shape[1] + step], dtype=np.int64)


def text_dims(text_config) -> dict:
    """The decoder dims every family records in the manifest, from an HF text config (attributes only)."""
    t = text_config
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    return {
        "hidden_size": t.hidden_size, "num_layers": t.num_hidden_layers, "num_heads": t.num_attention_heads,
        "num_kv_heads": t.num_key_value_heads, "head_dim": head_dim, "vocab_size": t.vocab_size,
        "max_position_embeddings": t.max_position_embeddings,
    }


def chat_template(model_dir: Path) -> str:
    """The chat template shipped with an HF checkpoint (chat_template.jinja, else a "chat_template" field of
    chat_template.json / processor_config.json / tokenizer_config.json). FileNotFoundError if none."""
    d = Path(model_dir)
    if (d / "chat_template.jinja").is_file():
        return (d / "chat_template.jinja").read_text()
    for name in ("chat_template.json", "processor_config.json", "tokenizer_config.json"):
        f = d / name
        if f.is_file():
            tpl = json.loads(f.read_text()).get("chat_template")
            if isinstance(tpl, str):
                return tpl
    raise FileNotFoundError(f"{d}: no chat template found (looked for chat_template.jinja, chat_template.json, "
                            "processor_config.json and tokenizer_config.json 'chat_template')")


def chat_layout(image_token: str, expand_image_token: str, bos: str, position_ids: str) -> dict:
    """The manifest's `layout` block: one user turn (image, then the prompt) through the chat template."""
    return {
        "image_token": image_token,
        "image_placement": "chat-template",  # one {"type": "image"} content item before the text
        "messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "{prompt}"}]}],
        "add_generation_prompt": True,
        "expand_image_token": expand_image_token,
        "bos": bos,
        "instruction_tokens": "offsets-overlap-prompt-span",
        "position_ids": position_ids,
    }


def attention_windows(text_config) -> tuple[int | None, ...]:
    """Per decoder layer its sliding window (contract.AttentionSpec.windows) from an HF text config: the config's
    sliding_window on its "sliding_attention" layer_types, None on the others; () for a config without layer_types
    or without a sliding layer (every layer full)."""
    types = getattr(text_config, "layer_types", None) or ()
    windows = tuple(int(text_config.sliding_window) if t == "sliding_attention" else None for t in types)
    return windows if any(w is not None for w in windows) else ()


def _norm_weight(attn, name: str):
    """float32 [hd] scale of the attention's per-head RMSNorm ``name`` (q_norm / k_norm), None without one."""
    norm = getattr(attn, name, None)
    return None if norm is None else norm.weight.detach().float().numpy().copy()


class HFFamily:
    """Export-time base of an adapter for an HF ``*ForConditionalGeneration`` checkpoint (contract.Family).

    A subclass sets `name`, `model_class` (the transformers class name), `image_token`, `position_rank`,
    `support_files`, `request_options` and writes its manifest fields, vision spec and run time.
    """

    model_class: str = ""
    image_token: str = ""
    position_rank = 1
    #: the rotary layout of an M-RoPE decoder: False = sections in blocks (Qwen2.5-VL), True = interleaved
    #: T/H/W frequencies (Qwen3-VL); recorded in DecoderWeights.rotary for the ORT form's host rows
    mrope_interleaved = False
    request_options = ()
    # Files copied next to the graphs so the runtime can tokenize / preprocess without the checkpoint.
    support_files = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                     "preprocessor_config.json", "processor_config.json", "chat_template.jinja",
                     "chat_template.json", "generation_config.json")

    # ------------------------------------------------------------------ checkpoint facts (no torch)
    def chat_template(self, model_dir: Path) -> str:
        return chat_template(model_dir)

    def token_ids(self, config, model_dir: Path | None = None) -> dict:
        t = config.text_config
        return {"image_token_id": int(config.image_token_id), "bos_token_id": t.bos_token_id,
                "eos_token_id": t.eos_token_id, "pad_token_id": t.pad_token_id}

    @staticmethod
    def generation_eos(config, model_dir: Path | None):
        """The ids HF generate stops on: generation_config.json's eos_token_id (instruct checkpoints list their
        end-of-turn token there) when the checkpoint has one, else the text config's."""
        eos = config.text_config.eos_token_id
        gen = Path(model_dir) / "generation_config.json" if model_dir is not None else None
        if gen is not None and gen.is_file():
            eos = json.loads(gen.read_text()).get("eos_token_id", eos)
        return eos

    def family_fields(self, config, model_dir: Path, *, dims: dict, visual: dict, layout: dict, processor: dict,
                      options: dict, axes: dict) -> dict:
        """contract.Family.manifest_fields from the family's own parts; token ids and the chat template are
        read the same way for every HF checkpoint."""
        return {"dims": dims, "visual": visual, "token_ids": self.token_ids(config, model_dir),
                "chat_template": self.chat_template(model_dir), "layout": layout, "processor": processor,
                "options": options, "axes": axes}

    # ------------------------------------------------------------------ export time (torch)
    def load_model(self, model_dir: Path, dtype: str = "float32"):
        """The `model_class` model in eval mode with eager attention (plain MatMul/Softmax in ONNX, and the
        float32 softmax upcast for fp16), loaded straight into `dtype` to bound RAM."""
        import torch
        import transformers

        cls = getattr(transformers, self.model_class)
        model = cls.from_pretrained(str(model_dir), dtype=getattr(torch, dtype), attn_implementation="eager",
                                    low_cpu_mem_usage=True)
        return model.eval()

    def embed_tokens(self, model):
        """nn.Embedding: input_ids int64 [B,S] -> inputs_embeds [B,S,d]."""
        return model.get_input_embeddings()

    def language_model(self, model):
        """The decoder stack (e.g. LlamaModel; Qwen2_5_VLTextModel takes position_ids [3, B, S]):
        inputs_embeds -> last_hidden_state (final norm applied)."""
        return model.model.language_model

    def lm_head(self, model):
        return model.lm_head

    def apply_rope(self):
        """HF's apply_rotary_pos_emb for this decoder (Llama's by default)."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        return apply_rotary_pos_emb

    def probe_parts(self, model) -> ProbeParts:
        """Layer 0's input norm, q/k projections, the decoder's rotary module, head counts and sliding window."""
        lm = self.language_model(model)
        attn = lm.layers[0].self_attn
        cfg = lm.config
        windows = attention_windows(cfg)
        return ProbeParts(
            norm=lm.layers[0].input_layernorm, q_proj=attn.q_proj, k_proj=attn.k_proj, rotary=lm.rotary_emb,
            apply_rope=self.apply_rope(), num_heads=cfg.num_attention_heads,
            num_kv_heads=cfg.num_key_value_heads, head_dim=attn.head_dim, scaling=attn.scaling,
            q_norm=getattr(attn, "q_norm", None), k_norm=getattr(attn, "k_norm", None),
            window=windows[0] if windows else None,
        )

    def decoder_spec(self, config) -> DecoderSpec:
        """No decoder extras (contract v4): embeddings, positions and KV only; the attention windows of the text
        config (v5, attention_windows), no bidirectional blocks."""
        return DecoderSpec(attention=AttentionSpec(windows=attention_windows(config.text_config)))

    def decoder_weights(self, model) -> DecoderWeights:
        """contract.Family.decoder_weights from the HF decoder stack (Llama / Qwen2 layer layout: self_attn.
        q/k/v/o_proj, mlp.gate/up/down_proj, input/post_attention_layernorm) and the text config's rope."""
        lm = self.language_model(model)
        cfg = lm.config
        rope = dict(getattr(cfg, "rope_parameters", None) or {})
        kind = rope.get("rope_type", "default")
        if kind != "default":  # host rows implement theta ** (-2i/d) (and M-RoPE sections) only
            raise ValueError(f"rope_type {kind!r} has no ORT-form rotary rows; export with --decoder-form standard")
        theta = rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
        section = rope.get("mrope_section")

        def arr(t):
            return None if t is None else t.detach().float().numpy().copy()

        layers = []
        for layer in lm.layers:
            a, m = layer.self_attn, layer.mlp
            layers.append(DecoderLayerWeights(
                input_norm=arr(layer.input_layernorm.weight), post_norm=arr(layer.post_attention_layernorm.weight),
                q=arr(a.q_proj.weight), k=arr(a.k_proj.weight), v=arr(a.v_proj.weight), q_bias=arr(a.q_proj.bias),
                k_bias=arr(a.k_proj.bias), v_bias=arr(a.v_proj.bias), o=arr(a.o_proj.weight),
                gate=arr(m.gate_proj.weight), up=arr(m.up_proj.weight), down=arr(m.down_proj.weight),
                q_norm=_norm_weight(a, "q_norm"), k_norm=_norm_weight(a, "k_norm")))
        return DecoderWeights(layers, arr(lm.norm.weight), arr(self.lm_head(model).weight), float(cfg.rms_norm_eps),
                              cfg.num_attention_heads, cfg.num_key_value_heads, lm.layers[0].self_attn.head_dim,
                              {"theta": float(theta), "mrope_section": list(section) if section else None,
                               "mrope_interleaved": bool(section) and bool(self.mrope_interleaved)})

    def write_files(self, model, out_dir: Path) -> dict[str, str]:
        return {}  # by default the graphs and the support files are all the runtime needs


class HFRuntime:
    """Run-time base (numpy only) bound to one engine dir: the manifest facts every family reads and the
    chat-template layout of one user turn with `image_token` expanded to the image's rows."""

    image_token: str = ""
    #: False for a chat template that renders the BOS itself (Gemma's "{{ bos_token }}"): no second one is added
    add_special_tokens: bool = True
    #: the chat template's video placeholder (None: the family takes no video)
    video_token: str | None = None
    video_token_id: int | None = None
    #: strings a text part must not hold besides the image token (e.g. Qwen2.5-VL's vision markers)
    reserved_strings: tuple[str, ...] = ()
    #: how the family's model writes a tool call (contract.ToolCallFormat; None: it writes none the runtime reads)
    #: and thinks (contract.ReasoningFormat; None: it does not). Whether an engine dir offers them is its chat
    #: template's fact: chat_features
    tool_call_format: ToolCallFormat | None = None
    reasoning_format: ReasoningFormat | None = None

    def __init__(self, manifest):
        self.chat_template = manifest.chat_template
        self.family_name = getattr(manifest, "family", type(self).__name__)
        self.image_token_id = int(manifest.token_ids["image_token_id"])
        #: rendered as the template's bos_token (transformers passes the tokenizer's special tokens to templates)
        self.bos_token_id = manifest.token_ids.get("bos_token_id")
        self.float_dtype = np.dtype(manifest.float_dtype)

    @functools.cached_property
    def chat_features(self) -> ChatFeatures:
        """contract.ChatFeatures of this engine dir: the family's tool-call format when its chat template renders
        a request's tools (checked by rendering a probe tool: a template without a tools section ignores it), the
        family's reasoning format, and the variables the template reads (template_variables)."""
        probe = {"type": "function", "function": {"name": _PROBE_TOOL, "description": "", "parameters": {
            "type": "object", "properties": {}}}}
        try:
            rendered = render_chat_template(self.chat_template, [{"role": "user", "content": [
                {"type": "text", "text": "?"}]}], tools=[probe])
        except Exception:  # noqa: BLE001 - a template that cannot take tools renders none
            rendered = ""
        tool_calls = self.tool_call_format if _PROBE_TOOL in rendered else None
        return ChatFeatures(tool_calls, self.reasoning_format, template_variables(self.chat_template))

    def opens_reasoning(self, messages: list[dict], tools: list | None = None,
                        template_kwargs: dict | None = None) -> bool:
        """Whether the prompt of ``messages`` (normalised, runtime/messages.py) ends inside the thinking: the
        rendered template ends with the reasoning format's open marker (Qwen3-VL Thinking's "<think>\\n"; a template
        that closes it, as Qwen3's with enable_thinking false, does not)."""
        if self.reasoning_format is None:
            return False
        rendered = render_chat_template(self.chat_template, messages, tools=tools or None, **(template_kwargs or {}))
        return rendered.rstrip().endswith(self.reasoning_format.open)

    def conversation_layout(self, tokenizer, messages: list[dict], rows_per_image: list[int],
                            media: list[dict] | None = None, tools: list | None = None,
                            template_kwargs: dict | None = None) -> ConversationLayout:
        """contract.FamilyRuntime.conversation_layout: the chat template over the whole conversation; the j-th
        placeholder becomes placeholder_text(token, rows, media[j]) (media: each image's / video's
        VisionInputs.facts, in order; None: the rows alone); tools and template_kwargs: the template's variables."""
        expand = None
        if media is not None:
            def expand(j, token, rows):
                return self.placeholder_text(token, rows, media[j])
        bos = self.bos_token_id
        context = {"bos_token": tokenizer.id_to_token(bos)} if isinstance(bos, int) else {}
        rendered = render_conversation(self.chat_template, messages, self.image_token, list(rows_per_image),
                                       self.reserved_strings, self.video_token, expand, tools, template_kwargs,
                                       context)
        return tokenize_conversation(tokenizer, rendered, messages, self.image_token_id, list(rows_per_image),
                                     self.video_token_id, self.add_special_tokens)

    def placeholder_text(self, token: str, rows: int, facts: dict) -> str:
        """The text one image / video placeholder becomes: ``rows`` copies of its token (a family whose layout
        depends on the medium, e.g. Qwen3-VL's video timestamps, overrides this)."""
        return token * rows

    def video_cost(self, video, options: dict):
        """contract.FamilyRuntime.video_cost: a family without video refuses it in one line (prepare_video)."""
        return self.prepare_video(video, options)

    def prepare_video(self, video, options: dict):
        """contract.FamilyRuntime.prepare_video: a family without video refuses it in one line."""
        raise ValueError(f"{getattr(video, 'where', 'video')}: model family {self.family_name!r} takes no video input "
                         "(Qwen2.5-VL does)")
