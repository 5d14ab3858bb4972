"""coverpruner.evaluation: benchmark accuracy per budget and method, scored as lmms-eval scores it.

Uses only the runtime's public API (``Pipeline.load``, ``Pipeline.generate``, ``GenerationResult``, the
runtime errors). ``coverpruner-eval run`` answers a benchmark from local data and writes predictions,
metrics, the paper's table and a plot; ``coverpruner-eval score`` scores a predictions file.
Needs the ``eval`` extra (pyarrow, matplotlib).
"""

from coverpruner.evaluation.tasks import TASKS, get_task

__all__ = ["TASKS", "get_task"]
