"""The file hashes the engine dir uses.

sha256 is the manifest's portable hash: export writes it, the first load of a directory and the engine builder
check it. xxh3-128 is the fast local re-check: the first load records it (computed in the same read pass as
sha256) in the directory's verification cache, and every later load re-hashes every file's full contents with
it (in the background while the first request runs, see engine_dir.verify_files), so a file whose bytes
changed under an unchanged size and mtime is still caught. xxh3 runs at memory speed (tens of GB/s against
sha256's ~1-2 GB/s), so re-checking costs little more than reading the files (figures: docs/engine-dir.md).
"""

from __future__ import annotations

import hashlib
import os

import xxhash

_CHUNK = 1 << 22


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in ``chunk``-byte pieces (constant memory for multi-GiB weight files)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def xxh3_file(path: str | os.PathLike) -> str:
    """Hex xxh3-128 of a file's full contents (constant memory)."""
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def sha256_and_xxh3(path: str | os.PathLike) -> tuple[str, str]:
    """(hex sha256, hex xxh3-128) of a file in one read pass."""
    s, x = hashlib.sha256(), xxhash.xxh3_128()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            s.update(block)
            x.update(block)
    return s.hexdigest(), x.hexdigest()
