"""Independent conversation references on the HF PyTorch models (tests only; torch + transformers).

Issue 19's semantics, written from transformers' own processor, chat template and model, never from coverpruner:

    messages (OpenAI format) --normalize--> HF messages ({"type": "image"} parts) + the images in order
    --processor.apply_chat_template--> text (one placeholder per image)
    --processor(images, text)--> native ids [L], each image's span [S_j] (the j-th run of image tokens)
    text parts' character spans (found with sentinels, below) --tokenizer offsets--> instruction positions:
        demand="turn":   the text parts of the user message that holds image j
        demand="latest": the text parts of the last user message
    HF image features scattered into the embedded ids (in order, as HF's masked_scatter) -> embeds [1, L, d]
    native positions: LLaVA/NeXT 0..L-1; Qwen2.5-VL HF's get_rope_index (also re-derived literally here)
    layer-0 attention (eager, float32 softmax) from image j's instruction rows to its candidate columns,
        mean over heads and rows -> relevance r_j; literal float64 greedy (tests/literal_selection.py) -> keep_j
    pruned rows = text rows + every image's kept rows (+ always kept), native order; positions: LLaVA compact
        0..L'-1 and decode at L'+t; Qwen native[:, rows] and decode at max(native)+1+t in all three rows
    greedy decoding: an explicit loop over the HF model with those positions (not model.generate, so the
        self-tests comparing with model.generate check the loop too).

What differs between families (how transformers loads, prepares and embeds one, its position rule) comes from the
family's test package, tests/families/<name>/conversation.py (load, processor_inputs, image_features, POSITIONS,
and where needed native_positions, newline_rows, before_generate, single_image_reference, expanded_text (a placeholder
the processor expands into text and image tokens), prefill_kwargs (further arguments of the pruned prefill: token
types for block masks)): every family folder of
the test matrix is a conversation family, so a new family joins these tests by existing (and fails them until its
conversation.py exists). Nothing here names a family.
"""

from __future__ import annotations

import base64
import importlib
import io
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from tests.family_matrix import family_folders
from tests.literal_selection import coverage_reference, divprune_reference

#: every family of the test matrix (tests/families/<name>/matrix.py): each must bring a conversation.py
FAMILIES = tuple(family_folders())
_SENTINEL = "\u2063TXT{}\u2063"  # invisible separator: no template or text here contains it


# --- the model bundle ---------------------------------------------------------------------------------------------

@dataclass
class HFFamily:
    """One tiny checkpoint with its HF processor and eager float32 model (eager: output_attentions works)."""

    name: str
    ckpt: Path
    processor: object
    model: object
    hooks: ModuleType  # tests/families/<name>/conversation.py

    @property
    def image_token_id(self) -> int:
        return int(self.model.config.image_token_id)

    @property
    def eos(self) -> set[int]:
        eos = self.model.generation_config.eos_token_id
        return set(eos if isinstance(eos, (list, tuple)) else [eos])


def load_family(name: str, ckpt: Path) -> HFFamily:
    """The family's HF processor and eager float32 model, loaded by its conversation hooks."""
    hooks = importlib.import_module(f"tests.families.{name}.conversation")
    if getattr(hooks, "POSITIONS", None) not in ("compact", "native"):
        raise ValueError(f"tests/families/{name}/conversation.py: POSITIONS must be 'compact' or 'native'")
    processor, model = hooks.load(ckpt)
    return HFFamily(name, Path(ckpt), processor, model, hooks)


# --- messages -----------------------------------------------------------------------------------------------------

def _load_image(part: dict):
    from PIL import Image

    if part["type"] == "image_url":
        url = part["image_url"]["url"] if isinstance(part["image_url"], dict) else part["image_url"]
        if url.startswith("data:"):
            return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB")
        return Image.open(url.removeprefix("file://")).convert("RGB")
    image = part["image"]
    if isinstance(image, (str, Path)):
        return Image.open(image).convert("RGB")
    if isinstance(image, np.ndarray):
        return Image.fromarray(image).convert("RGB")
    return image.convert("RGB")


def normalize(messages: list[dict]) -> tuple[list[dict], list]:
    """OpenAI-format messages -> (HF messages whose content is a list of {"type": "text"} / {"type": "image"}
    parts, the PIL images in order). A string content becomes one text part: llava-hf's template iterates the
    content as a list and renders nothing for a bare string (checked in test_reference_facts)."""
    out, images = [], []
    for msg in messages:
        content = msg["content"]
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else []
        for part in [] if isinstance(content, str) else content:
            if part["type"] == "text":
                parts.append({"type": "text", "text": part["text"]})
            elif part["type"] in ("image", "image_url"):
                images.append(_load_image(part))
                parts.append({"type": "image"})
            else:
                raise ValueError(f"unknown content part type {part['type']!r}")
        out.append({"role": msg["role"], "content": parts})
    return out, images


def render(fam: HFFamily, hf_messages: list[dict]) -> tuple[str, list[list[tuple[int, int]]]]:
    """The chat template's text (add_generation_prompt) and, per system / user message, the character spans of its
    text parts inside it (assistant turns render as given: no spans). Spans are found by rendering with a unique
    sentinel per text part, then putting the texts back; the result is checked against a plain render."""
    marked, texts = [], []
    for i, msg in enumerate(hf_messages):
        if msg["role"] not in ("system", "user"):  # only instructions are located; a template may reshape an
            marked.append(msg)                      # answer's text (Qwen3.5 trims it, drops its reasoning)
            continue
        parts = []
        for part in msg["content"]:
            if part["type"] == "text":
                parts.append({"type": "text", "text": _SENTINEL.format(len(texts))})
                texts.append((i, part["text"]))
            else:
                parts.append(part)
        marked.append({"role": msg["role"], "content": parts})
    template = fam.processor.apply_chat_template(marked, add_generation_prompt=True, tokenize=False)
    spans: list[list[tuple[int, int]]] = [[] for _ in hf_messages]
    text, rest = "", template
    for k, (i, part_text) in enumerate(texts):
        before, sep, rest = rest.partition(_SENTINEL.format(k))
        assert sep, f"text part {k} was not rendered by the template"
        text += before
        spans[i].append((len(text), len(text) + len(part_text)))
        text += part_text
    text += rest
    plain = fam.processor.apply_chat_template(hf_messages, add_generation_prompt=True, tokenize=False)
    assert text == plain, "sentinel rendering differs from the plain rendering"
    return text, spans


# --- the native sequence ------------------------------------------------------------------------------------------

@dataclass
class Native:
    """One conversation laid out by HF.

    ids int64 [L]; inputs: the processor's output (for model.generate); embeds float32 [1, L, d] (HF merge);
    positions int64 [R, L] (the family's native_positions hook, else R = 1: 0..L-1; Qwen2.5-VL: R = 3,
    get_rope_index);
    spans: per image j, int64 [S_j] positions in ids; candidates: per image, int64 [n_j] indices into its span
    (NeXT: not the image_newline rows); newline: per image, bool [S_j] (NeXT's image_newline rows, kept with
    newline_policy="keep"); image_message: per image, the index of the message holding it; features: per image,
    its span rows float32 [S_j, d];
    message_spans: per message, its text parts' character spans in `text`; instr_turn: per image, int64 [T_j]
    positions of the tokens overlapping its message's text parts; instr_latest: int64 [T] same for the last user
    message.
    """

    text: str
    ids: torch.Tensor
    inputs: dict
    embeds: torch.Tensor
    positions: torch.Tensor
    spans: list[np.ndarray]
    candidates: list[np.ndarray]
    newline: list[np.ndarray]
    image_message: list[int]
    message_spans: list[list[tuple[int, int]]]
    instr_turn: list[np.ndarray]
    instr_latest: np.ndarray
    features: list[torch.Tensor] = field(default_factory=list)
    #: per image, its DeepStack levels (a family with a deepstack_features hook: Qwen3-VL), each [S_j, d]
    deepstack: list = field(default_factory=list)


def processor_inputs(fam: HFFamily, text: str, images: list) -> dict:
    return fam.hooks.processor_inputs(fam.processor, text, images)


def _image_runs(ids: list[int], image_id: int) -> list[np.ndarray]:
    runs, start = [], None
    for i, t in enumerate(ids + [None]):
        if t == image_id and start is None:
            start = i
        elif t != image_id and start is not None:
            runs.append(np.arange(start, i, dtype=np.int64))
            start = None
    return runs


def _expanded_index(fam: HFFamily, text: str, spans_of_runs: list[np.ndarray], ids: list[int]):
    """Tokenize `text` alone with offsets; check that expanding its j-th image token to S_j copies gives the
    processor's ids; return (offsets of the unexpanded tokens, map unexpanded index -> native index)."""
    enc = fam.processor.tokenizer(text, return_offsets_mapping=True)
    raw, offsets = enc["input_ids"], enc["offset_mapping"]
    expanded, where, j = [], [], 0
    for t in raw:
        where.append(len(expanded))
        if t == fam.image_token_id:
            expanded += [t] * len(spans_of_runs[j])
            j += 1
        else:
            expanded.append(t)
    assert expanded == ids, "the processor's ids are not the rendered text's tokens with each image expanded"
    return offsets, where, raw


def _overlapping(offsets, where, raw, image_id: int, char_spans) -> np.ndarray:
    """Native positions of the tokens with a non-empty offset overlapping any of char_spans (image tokens never)."""
    pos = [where[i] for i, (a, b) in enumerate(offsets)
           if b > a and raw[i] != image_id and any(a < end and b > start for start, end in char_spans)]
    return np.asarray(pos, dtype=np.int64)


def image_features(fam: HFFamily, inputs: dict) -> list[torch.Tensor]:
    """Per image, its span rows [S_j, d] as HF computes them (the family's hook; NeXT: packed with image_newline
    rows)."""
    return list(fam.hooks.image_features(fam.model, inputs))


def _expanded_text_index(fam: HFFamily, text: str, images: list, ids: list[int], message_spans):
    """For a family whose image placeholder the processor replaces by text and image tokens (its hook
    expanded_text: Gemma 3): tokenize the processor's expanded text alone with offsets (checked to be the
    processor's ids) and move each message's text spans into it -> (offsets, identity map, ids, spans)."""
    expanded, edits = fam.hooks.expanded_text(fam.processor, text, images)
    enc = fam.processor.tokenizer(expanded, add_special_tokens=False, return_offsets_mapping=True)
    assert enc["input_ids"] == ids, "the processor's ids are not its expanded text's tokens"

    def moved(a: int, b: int) -> tuple[int, int]:
        d = sum(new - old for at, old, new in edits if at < a)
        return a + d, b + d
    spans = [[moved(a, b) for a, b in msg] for msg in message_spans]
    return enc["offset_mapping"], list(range(len(ids))), ids, spans


def native(fam: HFFamily, messages: list[dict]) -> Native:
    hf_messages, images = normalize(messages)
    text, message_spans = render(fam, hf_messages)
    inputs = processor_inputs(fam, text, images)
    ids = inputs["input_ids"][0]
    runs = _image_runs(ids.tolist(), fam.image_token_id)
    assert len(runs) == len(images), f"{len(runs)} image spans for {len(images)} images"
    if getattr(fam.hooks, "expanded_text", None) is not None:
        offsets, where, raw, message_spans = _expanded_text_index(fam, text, images, ids.tolist(), message_spans)
    else:
        offsets, where, raw = _expanded_index(fam, text, runs, ids.tolist())

    image_message = [i for i, msg in enumerate(hf_messages) for part in msg["content"] if part["type"] == "image"]
    instr_turn = [_overlapping(offsets, where, raw, fam.image_token_id, message_spans[i]) for i in image_message]
    last_user = max(i for i, msg in enumerate(hf_messages) if msg["role"] == "user")
    instr_latest = _overlapping(offsets, where, raw, fam.image_token_id, message_spans[last_user])

    with torch.no_grad():
        embeds = fam.model.get_input_embeddings()(ids[None]).clone()
    feats = image_features(fam, inputs) if images else []
    newline = []
    for span, f in zip(runs, feats):
        assert f.shape[0] == span.size, (f.shape, span.size)
        embeds[0, torch.from_numpy(span)] = f.to(embeds.dtype)
        newline_rows = getattr(fam.hooks, "newline_rows", None)  # rows that are no candidates (NeXT's newlines)
        newline.append(newline_rows(fam.model, f) if newline_rows else np.zeros(span.size, dtype=bool))
    candidates = [np.flatnonzero(~nl) for nl in newline]

    native_positions = getattr(fam.hooks, "native_positions", None)
    positions = native_positions(fam.model, inputs) if native_positions else torch.arange(ids.numel())[None]
    deepstack = getattr(fam.hooks, "deepstack_features", None)  # levels added after the first decoder layers
    levels = list(deepstack(fam.model, inputs)) if deepstack and images else []
    return Native(text, ids, inputs, embeds, positions, runs, candidates, newline, image_message, message_spans,
                  instr_turn, instr_latest, feats, levels)


# --- demand, selection, pruning, decoding -------------------------------------------------------------------------

def layer0_attention(fam: HFFamily, nat: Native) -> torch.Tensor:
    """HF's layer-0 attention probabilities [H, L, L] over the full native sequence at native positions."""
    lm = fam.model.model.language_model
    pos = _model_positions(nat.positions)
    with torch.no_grad():
        out = lm(inputs_embeds=nat.embeds, position_ids=pos, output_attentions=True)
    return out.attentions[0][0].float()


def relevance(fam: HFFamily, nat: Native, j: int, demand: str = "turn", att=None) -> np.ndarray | None:
    """float64 [n_j]: mean over heads and instruction rows of layer-0 attention at image j's candidate columns;
    None when the message has no text token (the weights are then uniform)."""
    instr = nat.instr_turn[j] if demand == "turn" else nat.instr_latest
    if instr.size == 0:
        return None
    att = layer0_attention(fam, nat) if att is None else att
    cols = nat.spans[j][nat.candidates[j]]
    return att[:, instr][:, :, cols].double().mean(dim=(0, 1)).numpy()


@dataclass
class Selection:
    """Per image: kept candidate indices (sorted, into candidates), relevance or None, kept span rows."""

    keep: list[np.ndarray]
    relevance: list[np.ndarray | None]
    rows: list[np.ndarray]


def select(fam: HFFamily, nat: Native, budget, method: str = "coverpruner", demand: str = "turn",
           tau: float = 0.3, newline_policy: str = "drop") -> Selection:
    """budget: an int per image, or "full" (every span row kept: the unpruned model)."""
    att = layer0_attention(fam, nat) if method == "coverpruner" and nat.spans else None
    keep, rel, rows = [], [], []
    for j, span in enumerate(nat.spans):
        cand = nat.candidates[j]
        r = relevance(fam, nat, j, demand, att) if method == "coverpruner" else None
        if budget == "full":
            k = np.arange(cand.size, dtype=np.int64)
            kept = np.arange(span.size, dtype=np.int64)
        else:
            feats = nat.features[j][torch.from_numpy(cand)].double().numpy()
            if method == "coverpruner":
                k = coverage_reference(feats, r, budget, tau)
            elif method == "divprune":
                k = divprune_reference(feats, budget)
            else:
                raise ValueError(f"no literal reference for method {method!r}")
            kept = cand[k]
            if newline_policy == "keep":
                kept = np.union1d(kept, np.flatnonzero(nat.newline[j]))
        keep.append(k)
        rel.append(r)
        rows.append(np.sort(kept))
    return Selection(keep, rel, rows)


def pruned_rows(nat: Native, sel: Selection) -> np.ndarray:
    """int64 [L']: the native rows kept, in native order (all text rows + each image's kept rows)."""
    drop = np.zeros(nat.ids.numel(), dtype=bool)
    for span, kept in zip(nat.spans, sel.rows):
        drop[span] = True
        drop[span[kept]] = False
    return np.flatnonzero(~drop)


def _model_positions(positions: torch.Tensor) -> torch.Tensor:
    """Positions [R, L] -> the HF model's position_ids: [1, L] for R = 1, [R, 1, L] for M-RoPE (R = 3)."""
    return positions if positions.shape[0] == 1 else positions[:, None]


def greedy(fam: HFFamily, embeds: torch.Tensor, positions: torch.Tensor, steps: int, mask=None,
           next_position: int | None = None, deepstack=None, prefill: dict | None = None) -> list[int]:
    """Greedy loop on the HF model: prefill embeds [1, L', d] at positions [R, L'] (R = 1 or 3), then the t-th new
    token at next_position + t (all rows). Stops after `steps` tokens or at EOS (included). deepstack: (visual mask
    bool [1, L'], levels [k, d] each) for a family with DeepStack, run through its `greedy_deepstack` hook.
    prefill: further keyword arguments of the prefill call only (the family's prefill_kwargs hook: Gemma 3's
    token_type_ids, from which transformers builds the kept image rows' block mask)."""
    if deepstack is not None:
        start = int(positions.max()) + 1 if next_position is None else next_position
        return fam.hooks.greedy_deepstack(fam.model, embeds, _model_positions(positions), mask, deepstack, steps,
                                          fam.eos, start)
    model = fam.model
    rank = positions.shape[0]
    mask = torch.ones(1, embeds.shape[1], dtype=torch.long) if mask is None else mask
    start = int(positions.max()) + 1 if next_position is None else next_position
    out = []
    with torch.no_grad():
        res = model(inputs_embeds=embeds, position_ids=_model_positions(positions), attention_mask=mask,
                    use_cache=True, **(prefill or {}))
        for t in range(steps):
            tok = int(res.logits[0, -1].argmax())
            out.append(tok)
            if tok in fam.eos or t == steps - 1:
                break
            mask = torch.cat([mask, torch.ones(1, 1, dtype=mask.dtype)], 1)
            pos = torch.full((rank, 1, 1) if rank > 1 else (1, 1), start + t, dtype=torch.long)
            res = model(inputs_embeds=model.get_input_embeddings()(torch.tensor([[tok]])), position_ids=pos,
                        attention_mask=mask, past_key_values=res.past_key_values, use_cache=True)
    return out


def pruned_positions(fam: HFFamily, nat: Native, rows: np.ndarray) -> tuple[torch.Tensor, int]:
    """(positions [R, L'], first decode position), by the family's POSITIONS rule: "compact" (LLaVA/NeXT) 0..L'-1
    and L'; "native" (Qwen2.5-VL) the kept rows' native positions and max(native) + 1 (the position the next token
    has without pruning)."""
    if fam.hooks.POSITIONS == "native":
        return nat.positions[:, torch.from_numpy(rows)], int(nat.positions.max()) + 1
    return torch.arange(rows.size)[None], int(rows.size)


@dataclass
class Answer:
    tokens: list[int]
    selection: Selection
    rows: np.ndarray


def chat(fam: HFFamily, messages: list[dict], budget="full", method: str = "coverpruner", demand: str = "turn",
         max_new_tokens: int = 8, tau: float = 0.3, newline_policy: str = "drop") -> Answer:
    """The reference answer of one request: new token ids, per-image selection, the pruned rows."""
    nat = native(fam, messages)
    sel = select(fam, nat, budget, method, demand, tau, newline_policy)
    rows = pruned_rows(nat, sel)
    positions, start = pruned_positions(fam, nat, rows)
    hook = getattr(fam.hooks, "prefill_kwargs", None)  # e.g. the pruned rows' token types (block masks)
    tokens = greedy(fam, nat.embeds[:, torch.from_numpy(rows)], positions, max_new_tokens, next_position=start,
                    deepstack=_deepstack(nat, rows, sel.rows),
                    prefill=hook(fam.model, nat.ids[torch.from_numpy(rows)]) if hook else None)
    return Answer(tokens, sel, rows)


def _deepstack(nat: Native, rows: np.ndarray, kept: list[np.ndarray]):
    """(visual mask bool [1, L'] over the sequence rows kept, per level its kept rows [k, d] gathered here, image by
    image), or None without DeepStack."""
    if not nat.deepstack:
        return None
    visual = np.concatenate([span[k] for span, k in zip(nat.spans, kept)])
    mask = torch.from_numpy(np.isin(rows, visual))[None]
    levels = [torch.cat([image[level][torch.from_numpy(k)] for image, k in zip(nat.deepstack, kept)])
              for level in range(len(nat.deepstack[0]))]
    return mask, levels


def masked_chat(fam: HFFamily, nat: Native, sel: Selection, max_new_tokens: int) -> list[int]:
    """A "native"-positions family (Qwen2.5-VL): the full native sequence with the dropped image rows masked out
    (attention_mask 0): with native positions pruning must equal this."""
    keep = pruned_rows(nat, sel)
    mask = torch.zeros(1, nat.ids.numel(), dtype=torch.long)
    mask[0, torch.from_numpy(keep)] = 1
    every = [np.arange(span.size) for span in nat.spans]  # DeepStack at every image row (dropped ones are masked)
    return greedy(fam, nat.embeds, nat.positions, max_new_tokens, mask=mask,
                  next_position=int(nat.positions.max()) + 1,
                  deepstack=_deepstack(nat, np.arange(nat.ids.numel()), every))


def hf_generate(fam: HFFamily, messages: list[dict], max_new_tokens: int = 8) -> list[int]:
    """transformers' own model.generate on the processor's inputs (unpruned): the new token ids."""
    hf_messages, images = normalize(messages)
    text = fam.processor.apply_chat_template(hf_messages, add_generation_prompt=True, tokenize=False)
    inputs = processor_inputs(fam, text, images)
    before = getattr(fam.hooks, "before_generate", None)
    if before is not None:  # e.g. Qwen2.5-VL's rope deltas, stateful in HF: a previous call's must not leak in
        before(fam.model)
    with torch.no_grad():
        out = fam.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, inputs["input_ids"].shape[1]:].tolist()
