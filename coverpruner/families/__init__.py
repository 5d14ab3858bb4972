"""Model family registry: family name / HF model_type / alias -> adapter, found on disk.

Each family is one package under families/ whose __init__ declares `FAMILY = FamilyEntry(...)` (the adapter's
"module:Class", the HF model types it handles, its short aliases; contract.FamilyEntry). The registry finds those
packages itself (pkgutil, sorted by name) the first time `FAMILIES` or a lookup is used, so adding a family
edits no list here. Family packages are numpy-only at import (torch/transformers only inside export-time
methods), so the runtime can ask them for their rules without torch.

`FAMILIES` is a plain dict (family name -> FamilyEntry) built on first access; tests may add entries to it.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache

from coverpruner.families.contract import FamilyEntry

__all__ = ["FamilyEntry", "all_aliases", "discover", "family_for_model_type", "family_names", "get_family",
           "model_types", "request_options", "resolve_alias"]


def discover() -> dict[str, FamilyEntry]:
    """{package name: its FAMILY entry} for every package under families/ that declares one, sorted by name."""
    found = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if not info.ispkg:
            continue
        entry = getattr(importlib.import_module(f"{__name__}.{info.name}"), "FAMILY", None)
        if isinstance(entry, FamilyEntry):
            found[info.name] = entry
    return found


def __getattr__(name: str):
    # FAMILIES is built on first access (PEP 562) and then is an ordinary module attribute.
    if name == "FAMILIES":
        globals()["FAMILIES"] = discover()
        return globals()["FAMILIES"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _families() -> dict[str, FamilyEntry]:
    return globals().get("FAMILIES") or __getattr__("FAMILIES")


def family_names() -> list[str]:
    return sorted(_families())


@lru_cache(maxsize=None)
def get_family(name: str):
    """The adapter instance for family `name` (e.g. "llava"). Raises KeyError naming the known families."""
    families = _families()
    if name not in families:
        raise KeyError(f"unknown model family {name!r}; known families: {family_names()}")
    module, cls = families[name].adapter.split(":")
    return getattr(importlib.import_module(module), cls)()


def model_types() -> list[str]:
    return sorted({t for e in _families().values() for t in e.model_types})


def family_for_model_type(model_type: str):
    """The adapter for an HF `config.model_type` (the first entry that lists it). Raises KeyError naming the
    supported model types."""
    for name, entry in _families().items():
        if model_type in entry.model_types:
            return get_family(name)
    raise KeyError(f"model_type {model_type!r} is not supported; supported: {model_types()}")


def all_aliases() -> dict[str, str]:
    """Every family's aliases: {alias: HF repo id}, in registry order."""
    return {a: r for entry in _families().values() for a, r in entry.aliases.items()}


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
