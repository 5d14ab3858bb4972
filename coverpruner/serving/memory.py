"""Give freed heap memory back to the OS after a large request.

Decoding and resizing a multi-megapixel image allocates and frees hundreds of MiB; glibc keeps freed blocks
in its arenas (one per thread that allocated), so the server's RSS stayed ~500 MB higher after large images.
``malloc_trim(0)`` returns the free pages of every arena, and ``map_large_blocks`` keeps the large blocks out of
the arenas in the first place. Both are no-ops where the C library has neither (musl, macOS, Windows).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc


#: glibc's mallopt parameter M_MMAP_THRESHOLD, and the size from which blocks are mapped on their own
_M_MMAP_THRESHOLD = -3
LARGE_BLOCK_BYTES = 4 * 2 ** 20


@functools.lru_cache(maxsize=1)
def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def _malloc_trim():
    return getattr(_libc(), "malloc_trim", None)


def map_large_blocks() -> None:
    """Blocks of LARGE_BLOCK_BYTES and more (a decoded image's strips, its resized copies, a request's native
    sequence) are mapped on their own and unmapped when freed. glibc's default raises its mmap threshold to the size
    of the largest block freed (up to 32 MiB) and then carves such blocks out of the thread's arena, where they
    fragment: with the engine's admission worker (a thread and an arena of its own) beside the decode workers, RSS
    stayed 40-100 MB higher after two 36-megapixel images despite malloc_trim; with the fixed threshold it returns to
    within ~10 MB (tests/serving/test_limits.py). Once per process; blocks below the threshold (a step's logits, a
    token's embedding) are untouched."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, LARGE_BLOCK_BYTES)


def release_freed_memory() -> None:
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def freeze_startup_heap() -> int:
    """Collect, then move every object alive now into the garbage collector's permanent generation (gc.freeze): a
    server's modules, classes and pipelines live as long as it does, and its full passes then walk only what the
    requests made. Issue 40: a served process's ~150,000 start-up objects made each full pass 0.1-0.17 s of held
    GIL (the event loop's /health waited), and one comes whenever a request's surviving objects grow by a quarter of
    the heap (8 answers of 2,000 tokens with their logprobs); frozen, the passes during that answer took 20-40 ms.
    For a server process's entry point (serving.cli), after its app is built; returns the frozen object count."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


#: the threshold that keeps the garbage collector from ever starting a full pass by itself (CPython counts
#: second-generation passes against it)
_NO_AUTOMATIC_FULL_PASS = 2**30


def leave_full_collections_to_the_engines() -> None:
    """Turn off the garbage collector's automatic full passes (the young generations stay automatic: they take
    well under a millisecond): a full pass holds the GIL for 20-120 ms in whichever thread allocates, the event loop's
    or an admission's, and every stream waits that long for its next token (measured: a 119 ms pass on the event
    loop during an admission, docs/performance.md "Taking turns on the cores"). The engines run the full passes
    instead, where nobody waits (runtime/engine.py ``Engine._collect``: inside a pause left to an admission, or at
    the latest FULL_GC_LATEST_S after the last). For a server process's entry point, after freeze_startup_heap."""
    first, second, _ = gc.get_threshold()
    gc.set_threshold(first, second, _NO_AUTOMATIC_FULL_PASS)
