"""The one file hash the engine dir uses: export writes it, the runtime and the engine builder check it."""

from __future__ import annotations

import hashlib
import os


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in ``chunk``-byte pieces (constant memory for multi-GiB weight files)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
