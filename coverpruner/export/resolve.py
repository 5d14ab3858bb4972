"""Find a checkpoint on this machine: local directory, alias, or HF repo id in the HF cache. Offline only.

Nothing is downloaded: when the weights are not here, `MissingModelError` says which repo is missing,
where we looked, and how to get it (`huggingface-cli download <id>` or a local directory).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from coverpruner.families import all_aliases, resolve_alias


class MissingModelError(RuntimeError):
    """The requested checkpoint is not available locally (CLI exit code 2)."""


def _weights_problem(d: Path) -> str | None:
    """None when `d` holds config.json and complete weights; otherwise what is missing."""
    if not (d / "config.json").is_file():
        return f"{d / 'config.json'} is missing"
    index = d / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
        missing = [s for s in shards if not (d / s).is_file()]
        return f"weight shards missing in {d}: {', '.join(missing)}" if missing else None
    if (d / "model.safetensors").is_file() or any(d.glob("*.safetensors")):
        return None
    if (d / "pytorch_model.bin").is_file() or (d / "pytorch_model.bin.index.json").is_file():
        return None
    return f"no weights (model.safetensors or model.safetensors.index.json) in {d}"


def _download_hint(repo_id: str) -> str:
    return (f"Get them with:\n    huggingface-cli download {repo_id}\n"
            f"(or `hf download {repo_id}`), then run again; or pass a local checkpoint directory with --model DIR.")


def resolve_model(spec: str, cache_dir: str | None = None) -> tuple[Path, str]:
    """Return (local directory, source model name) for an alias, HF repo id or local directory.

    Raises MissingModelError with a complete, human-readable message when it is not available offline.
    """
    local = Path(spec).expanduser()
    if local.is_dir():
        problem = _weights_problem(local)
        if problem:
            raise MissingModelError(f"--model {spec}: {problem}")
        return local.resolve(), str(local.resolve())
    repo_id = resolve_alias(spec)
    if spec.startswith((".", "/", "~", os.sep)) or spec.count("/") > 1:
        raise MissingModelError(f"--model {spec}: no such directory")

    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = cache_dir or constants.HF_HUB_CACHE
    alias_note = f" (from alias {spec!r})" if repo_id != spec else ""
    try:
        snapshot = Path(snapshot_download(repo_id, local_files_only=True, cache_dir=cache))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError) as exc:
        raise MissingModelError(
            f"The weights of {repo_id!r}{alias_note} are not on this machine: it is not in the Hugging Face cache "
            f"at {cache} (offline mode, nothing is downloaded). {_download_hint(repo_id)}") from exc
    except Exception as exc:  # e.g. an invalid repo id string
        raise MissingModelError(f"--model {spec}: not a local directory, alias or valid Hugging Face repo id "
                                f"({exc}). Known aliases: {', '.join(all_aliases())}.") from exc
    problem = _weights_problem(snapshot)
    if problem:
        raise MissingModelError(f"The cached snapshot of {repo_id!r}{alias_note} is incomplete: {problem}. "
                                f"{_download_hint(repo_id)}")
    return snapshot, repo_id
