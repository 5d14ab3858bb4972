"""Give freed heap memory back to the OS after a large request.

Decoding and resizing a multi-megapixel image allocates and frees hundreds of MiB; glibc keeps freed blocks
in its arenas (one per thread that allocated), so the server's RSS stayed ~500 MB higher after large images.
``malloc_trim(0)`` returns the free pages of every arena. A no-op where the C library has no malloc_trim
(musl, macOS, Windows).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> None:
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
