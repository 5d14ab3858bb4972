"""Example inputs, tensor names and dynamic axes of every graph: `graph_specs` = the three every family shares
(embed, probe, decoder; `text_graph_specs`) + the family's own vision graph (`Family.export_specs`).

The only family-dependent parts of the shared three are the torch modules it hands over (embedding table, layer-0 probe parts, decoder
stack, lm_head) and the position rank R: position_ids are [B, S] for R = 1 and [R, B, S] for R = 3 (M-RoPE).
Example sizes are >= 2 on every dynamic axis so torch.export does not specialise them to 0/1. Import
requires torch.
"""

from __future__ import annotations

from coverpruner.engine_dir import (
    ATTENTION_BLOCKS,
    DECODER_INPUTS,
    EMBED_INPUTS,
    EMBED_OUTPUTS,
    LOGITS,
    PROBE_INPUTS,
    PROBE_OUTPUTS,
    past_names,
    present_names,
    state_names,
    state_output_names,
)
from coverpruner.families.contract import ExportSpec


def example_positions(rank: int, batch: int, start: int, length: int):
    """int64 position_ids example: [B, S] (rank 1) or [R, B, S] (rank > 1), values start..start+length-1."""
    import torch

    pos = torch.arange(start, start + length)[None].expand(batch, length)
    return (pos if rank == 1 else pos[None].expand(rank, batch, length)).contiguous()


def position_axes(rank: int, batch, seq) -> dict:
    """Dynamic axes of position_ids: {0: batch, 1: seq} for [B, S]; {1: batch, 2: seq} for [R, B, S]."""
    axes = {0: batch, 1: seq} if rank == 1 else {1: batch, 2: seq}
    return {k: v for k, v in axes.items() if v is not None}


def text_graph_specs(family, model, dims: dict, dtype, rank: int = 1, num_visual: int = 16,
                     extras=(), spec=None, probe_parts=None) -> dict[str, ExportSpec]:
    """ExportSpec of embed, probe and decoder for ``model`` (family adapter ``family``).

    dims: the manifest dims (hidden_size, num_layers, num_kv_heads, head_dim, vocab_size). dtype: torch float
    dtype of the graphs. rank: position rank R. num_visual: example visual-column count of the probe.
    extras: the decoder extras (contract.DecoderExtra), inputs float [B,S,d] after the past KV and states, on
    inputs_embeds' axes (so TensorRT profiles give them inputs_embeds' ranges). spec: the family's
    contract.DecoderSpec (v5; None: KV at every layer, causal): each state is an input [B, *shape] after the past
    KV, dynamic on the batch axis only; with attention blocks the decoder takes attention_blocks int64 [B,S] last
    (ATTENTION_BLOCKS), on inputs_embeds' first two axes. probe_parts: the probe's ProbeParts (default: the family's
    probe_parts; a proxy's from proxy_probe_parts).
    """
    import torch
    from torch.export import Dim

    from coverpruner.export.modules import DecoderGraph, EmbedGraph, ProbeGraph

    d = dims["hidden_size"]
    batch, seq = Dim("batch"), Dim("seq")
    specs = {}

    ids = torch.randint(0, dims["vocab_size"], (2, 7))
    specs["embed"] = ExportSpec(EmbedGraph(family.embed_tokens(model)).eval(), (ids,), list(EMBED_INPUTS),
                                list(EMBED_OUTPUTS), ({0: batch, 1: seq},))

    n, t = num_visual, 5
    length = n + 12
    args = (torch.randn(1, length, d, dtype=dtype), example_positions(rank, 1, 0, length), torch.arange(3, 3 + n),
            torch.arange(length - t - 2, length - 2))
    shapes = ({1: seq}, position_axes(rank, None, seq), {0: Dim("num_visual")}, {0: Dim("num_instruction")})
    parts = family.probe_parts(model) if probe_parts is None else probe_parts
    specs["probe"] = ExportSpec(ProbeGraph(parts).eval(), args, list(PROBE_INPUTS),
                                list(PROBE_OUTPUTS), shapes)

    hkv, hd = dims["num_kv_heads"], dims["head_dim"]
    kv_layers = spec.kv_layer_list(dims["num_layers"]) if spec is not None else tuple(range(dims["num_layers"]))
    states = tuple(spec.states) if spec is not None else ()
    # a decoder with states (v5) chunks its prefill (64 rows a chunk): the example spans two chunks so torch.export
    # keeps the chunk count symbolic (a count of 1 would be specialised)
    b, s, p = 2, (70 if states else 3), 4
    past = tuple(torch.randn(b, hkv, p, hd, dtype=dtype) for _ in range(2 * len(kv_layers)))
    args = (torch.randn(b, s, d, dtype=dtype), torch.ones(b, p + s, dtype=torch.long),
            example_positions(rank, b, p, s), past)
    past_dim = Dim("past_sequence", min=0)
    shapes = ({0: batch, 1: seq}, {0: batch, 1: Dim("total_sequence")}, position_axes(rank, batch, seq),
              tuple({0: batch, 2: past_dim} for _ in past))
    blocks = spec is not None and spec.attention.blocks
    more, more_shapes = [], []  # DecoderGraph's *more: the states tuple, the extras tuple (a v3 decoder has neither)
    if states:
        more.append(tuple(0.1 * torch.randn(b, *st.shape, dtype=dtype if st.dtype == "model" else torch.float32)
                          for st in states for _ in st.layers))
        more_shapes.append(tuple({0: batch} for st in states for _ in st.layers))
    if extras or blocks:
        rows = tuple(torch.randn(b, s, d, dtype=dtype) for _ in extras)
        if blocks:  # last in the tuple: rows 0..1 of entry 0 one block, entry 1's last two another, the rest text
            ids = torch.full((b, s), -1, dtype=torch.long)
            ids[0, :2], ids[1, -2:] = 0, 1
            rows += (ids,)
        more.append(rows)
        more_shapes.append(tuple({0: batch, 1: seq} for _ in rows))
    if more:  # torch.export takes one dynamic-shapes entry for all of a *args parameter
        args += tuple(more)
        shapes += (tuple(more_shapes),)
    module = DecoderGraph(family.language_model(model), family.lm_head(model), extras, spec).eval()
    specs["decoder"] = ExportSpec(module, args, [*DECODER_INPUTS, *past_names(kv_layers), *state_names(states),
                                                 *(e.name for e in extras), *([ATTENTION_BLOCKS] if blocks else [])],
                                  [LOGITS, *present_names(kv_layers), *state_output_names(states)], shapes)
    return specs


#: what the probe graph scores (--probe): "exact", the attention of the family's probe layer; "proxy", the family's
#: cheaper stand-in (contract v5: Family.proxy_probe_parts; Qwen3.5: layer 0's Gated DeltaNet query / key)
PROBE_KINDS = ("exact", "proxy")


def check_probe(family, kind: str) -> None:
    """ValueError (one line) unless ``family`` has a probe of ``kind`` (PROBE_KINDS)."""
    if kind not in PROBE_KINDS:
        raise ValueError(f"--probe must be one of {list(PROBE_KINDS)}, got {kind!r}")
    if kind == "proxy" and getattr(family, "proxy_probe_parts", None) is None:
        raise ValueError(f"--probe proxy: model family {family.name!r} has no proxy probe (its probe layer's "
                         "attention is what it scores)")


def probe_parts_for(family, model, kind: str):
    """The ProbeParts of probe ``kind`` (PROBE_KINDS); ValueError (one line) for a family without a proxy."""
    check_probe(family, kind)
    return family.probe_parts(model) if kind == "exact" else family.proxy_probe_parts(model)


def graph_specs(family, model, config, dtype, probe: str = "exact") -> dict[str, ExportSpec]:
    """ExportSpec of vision, embed, probe and decoder: the family's parts wrapped here (position rank, dims and
    probe example from the family, contract.Family) plus the family's own vision spec. probe: PROBE_KINDS."""
    spec = family.decoder_spec(config)
    specs = text_graph_specs(family, model, family.dims(config), dtype, rank=family.position_rank,
                             num_visual=family.probe_example_visual(config), extras=spec.extras, spec=spec,
                             probe_parts=probe_parts_for(family, model, probe))
    return {**family.export_specs(model, config, dtype), **specs}
