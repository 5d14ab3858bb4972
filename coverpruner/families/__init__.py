"""Model family registry: family name / HF model_type / alias -> lazily imported adapter.

One table, `FAMILIES`: family name -> `FamilyEntry` (the adapter's "module:Class", the HF model types it
handles, its short aliases). Adding a family = one package with an adapter class satisfying `contract.Family`
+ one entry here + a tiny random preset. Adapters import torch/transformers only inside their export-time
methods, so the runtime can ask them for its rules without torch; the registry imports an adapter's module
only when that family is asked for.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from functools import lru_cache


@dataclass(frozen=True)
class FamilyEntry:
    """adapter: "module:Class" of the contract.Family; model_types: HF config.model_type values it handles;
    aliases: short name -> HF repo id (coverpruner-export --model)."""

    adapter: str
    model_types: tuple[str, ...] = ()
    aliases: dict[str, str] = field(default_factory=dict)


FAMILIES: dict[str, FamilyEntry] = {
    "llava": FamilyEntry("coverpruner.families.llava:LlavaFamily", ("llava",), {
        "llava-1.5-7b": "llava-hf/llava-1.5-7b-hf",
        "llava-1.5-13b": "llava-hf/llava-1.5-13b-hf",
    }),
    "llava_next": FamilyEntry("coverpruner.families.llava_next:LlavaNextFamily", ("llava_next",), {
        "llava-next-7b": "llava-hf/llava-v1.6-vicuna-7b-hf",
        "llava-next-13b": "llava-hf/llava-v1.6-vicuna-13b-hf",
    }),
    "qwen2_5_vl": FamilyEntry("coverpruner.families.qwen2_5_vl:Qwen25VLFamily", ("qwen2_5_vl",), {
        "qwen2.5-vl-7b": "Qwen/Qwen2.5-VL-7B-Instruct",
        "qwen2.5-vl-3b": "Qwen/Qwen2.5-VL-3B-Instruct",
    }),
}


def family_names() -> list[str]:
    return sorted(FAMILIES)


@lru_cache(maxsize=None)
def get_family(name: str):
    """The adapter instance for family `name` (e.g. "llava"). Raises KeyError naming the known families."""
    if name not in FAMILIES:
        raise KeyError(f"unknown model family {name!r}; known families: {family_names()}")
    module, cls = FAMILIES[name].adapter.split(":")
    return getattr(importlib.import_module(module), cls)()


def model_types() -> list[str]:
    return sorted({t for e in FAMILIES.values() for t in e.model_types})


def family_for_model_type(model_type: str):
    """The adapter for an HF `config.model_type` (the first entry that lists it). Raises KeyError naming the
    supported model types."""
    for name, entry in FAMILIES.items():
        if model_type in entry.model_types:
            return get_family(name)
    raise KeyError(f"model_type {model_type!r} is not supported; supported: {model_types()}")


def all_aliases() -> dict[str, str]:
    """Every family's aliases: {alias: HF repo id}, in registry order."""
    return {a: r for entry in FAMILIES.values() for a, r in entry.aliases.items()}


def resolve_alias(spec: str) -> str:
    """Map a short alias (e.g. "llava-1.5-7b") to its HF repo id; other strings are returned unchanged."""
    return all_aliases().get(spec, spec)


def request_options() -> dict:
    """Every registered family's request options: {option name: (RequestOption, [family names])}.

    coverpruner-run offers each as a flag (--newline-policy, ...) before it knows which family a directory
    holds; the Pipeline refuses an option its family does not have.
    """
    out: dict = {}
    for name in family_names():
        for opt in get_family(name).request_options:
            out.setdefault(opt.name, (opt, []))[1].append(name)
    return out
