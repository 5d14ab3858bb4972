"""What every model family adapter provides, and the torch-free prompt-layout helpers they share.

A family adapter answers two kinds of questions:
  * export time (torch, lazily imported inside methods): where the vision tower, projector, layer 0 and
    decoder live in the HF model, and the model's dims / token ids / processor settings;
  * run time (no torch, no transformers): the chat template, how the image placeholder expands, which
    token positions are visual and which are the user's instruction, and how positions are assigned
    after pruning. The runtime reads these from the manifest and calls the same helpers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PROMPT_SENTINEL = "\u2063COVERPRUNER_PROMPT\u2063"  # invisible separator chars: never in real prompts


@dataclass(frozen=True)
class RenderedPrompt:
    """Chat-template output with image placeholders already expanded.

    text: the full prompt string fed to the tokenizer.
    prompt_span: [start, end) character span of the user's prompt text inside `text`.
    """

    text: str
    prompt_span: tuple[int, int]


@dataclass(frozen=True)
class NativeLayout:
    """The un-pruned input sequence of one request (batch 1).

    input_ids: int64 [L]; visual_positions: int64 [n] (sequence indices of the image tokens, ascending);
    instruction_positions: int64 [T] (sequence indices of the tokens overlapping the user's prompt text).
    """

    input_ids: np.ndarray
    visual_positions: np.ndarray
    instruction_positions: np.ndarray


def render_chat_template(chat_template: str, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """Render an HF chat template with jinja2 the way transformers does (trim/lstrip blocks, sandbox).

    The `{% generation %}` block tag (transformers' assistant-mask extension) is accepted and renders
    its body unchanged, so llava-hf templates work without transformers.
    """
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
    return env.from_string(chat_template).render(messages=messages, add_generation_prompt=add_generation_prompt)


def instruction_positions_from_offsets(offsets: list[tuple[int, int]], span: tuple[int, int]) -> np.ndarray:
    """Indices of tokens whose non-empty character span [a, b) overlaps `span` (design rule). int64 [T]."""
    start, end = span
    hits = [i for i, (a, b) in enumerate(offsets) if b > a and a < end and b > start]
    return np.asarray(hits, dtype=np.int64)
