"""Progress for long single steps: a tqdm bar refreshed in the background while one call runs, so a step without
intermediate updates (exporting the decoder or the vision tower, loading an engine dir) still shows its elapsed
time instead of a frozen line.

On a terminal that is a bar redrawn in place. Anywhere else (a log file, a pipe, CI) a redraw is a carriage
return that the log keeps: an export's bar, refreshed every second, became one line of thousands of redraws.
``stage_bar`` there gives ``StageLines`` instead: one plain line per stage as it starts and one at the end, with
elapsed seconds, and nothing in between.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time

from tqdm.auto import tqdm


class StageLines:
    """The non-terminal form of a stage bar (the part of tqdm's API the stage loops use): ``set_description``
    prints "<desc> (stage i/total, <elapsed> s)"; ``update`` counts; ``close`` prints the total time. ``disable``
    is true so that ``ticking`` refreshes nothing."""

    disable = True

    def __init__(self, total: int, desc: str, file=None):
        self.total, self.desc, self.n, self._file = total, desc, 0, file
        self._t0 = time.perf_counter()

    def _line(self, text: str) -> None:
        print(f"{text} ({time.perf_counter() - self._t0:.1f} s)", file=self._file or sys.stderr, flush=True)

    def set_description(self, desc: str) -> None:
        self._line(f"{desc}: stage {min(self.n + 1, self.total)}/{self.total}")

    def update(self, n: int = 1) -> None:
        self.n += n

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        self._line(f"{self.desc}: done, {self.n}/{self.total} stages")


def stage_bar(total: int, desc: str, unit: str = "stage", enabled: bool = True, file=None):
    """A progress bar over ``total`` stages: tqdm on a terminal, StageLines in a log, a disabled tqdm when not
    ``enabled``."""
    out = file or sys.stderr
    if enabled and not (hasattr(out, "isatty") and out.isatty()):
        return StageLines(total, desc, out)
    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, file=out)


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
