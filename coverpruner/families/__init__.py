"""Model family registry: family name / HF model_type / alias -> lazily imported adapter.

Adding a family = one module with an adapter class satisfying `contract.Family` + one line in `_ADAPTERS`
(+ its model types) + a tiny random fixture. Adapters import torch/transformers only inside their
export-time methods, so the runtime can ask them for its rules without torch.
"""

from __future__ import annotations

import importlib
from functools import lru_cache

# family name -> "module:Class"
_ADAPTERS = {
    "llava": "coverpruner.families.llava:LlavaFamily",
    "llava_next": "coverpruner.families.llava_next:LlavaNextFamily",
    "qwen2_5_vl": "coverpruner.families.qwen2_5_vl:Qwen25VLFamily",
}
# HF config.model_type -> family name
_MODEL_TYPES = {
    "llava": "llava",
    "llava_next": "llava_next",
    "qwen2_5_vl": "qwen2_5_vl",
}


def family_names() -> list[str]:
    return sorted(_ADAPTERS)


@lru_cache(maxsize=None)
def get_family(name: str):
    """The adapter instance for family `name` (e.g. "llava"). Raises KeyError naming the known families."""
    if name not in _ADAPTERS:
        raise KeyError(f"unknown model family {name!r}; known families: {family_names()}")
    module, cls = _ADAPTERS[name].split(":")
    return getattr(importlib.import_module(module), cls)()


def family_for_model_type(model_type: str):
    """The adapter for an HF `config.model_type`. Raises KeyError naming the supported model types."""
    if model_type not in _MODEL_TYPES:
        raise KeyError(f"model_type {model_type!r} is not supported; supported: {sorted(_MODEL_TYPES)}")
    return get_family(_MODEL_TYPES[model_type])


def resolve_alias(spec: str) -> str:
    """Map a short alias (e.g. "llava-1.5-7b") to its HF repo id; other strings are returned unchanged."""
    for name in _ADAPTERS:
        aliases = get_family(name).aliases
        if spec in aliases:
            return aliases[spec]
    return spec


def all_aliases() -> dict[str, str]:
    return {a: r for name in _ADAPTERS for a, r in get_family(name).aliases.items()}


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
