"""Progress for long single steps: a tqdm bar refreshed in the background while one call runs, so a step without
intermediate updates (exporting the decoder or the vision tower, loading an engine dir) still shows its elapsed
time instead of a frozen line."""

from __future__ import annotations

import contextlib
import threading

from tqdm.auto import tqdm


@contextlib.contextmanager
def ticking(bar: tqdm, every_s: float = 1.0):
    """Refresh ``bar`` every ``every_s`` seconds while the body runs (nothing when the bar is disabled)."""
    if bar.disable:
        yield bar
        return
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(every_s):
            bar.refresh()

    thread = threading.Thread(target=tick, daemon=True, name="progress-tick")
    thread.start()
    try:
        yield bar
    finally:
        stop.set()
        thread.join()


@contextlib.contextmanager
def spinner(desc: str, every_s: float = 1.0):
    """A one-line '<desc> [elapsed]' on stderr while the body runs; only on a terminal (tqdm's disable=None), so
    piped output and logs stay clean."""
    bar = tqdm(total=None, desc=desc, bar_format="{desc} [{elapsed}]", disable=None, leave=False)
    try:
        with ticking(bar, every_s):
            yield
    finally:
        bar.close()
