"""coverpruner-eval: the paper's benchmarks on an engine dir, scored as lmms-eval scores them.

    coverpruner-eval run ENGINE_DIR --task T --data PATH [--budgets full,128,64,32] [--methods ...]
                     [--limit N] [--out DIR] [--max-new-tokens N] [--images PATH] [--max-images N]
                     [--provider cpu]
    coverpruner-eval score --task T --data PATH --predictions FILE [--json]

Exit codes: 0 ok; 2 bad input (one line on stderr naming the file, row or column, or the option), also
after a complete run in which some rows were reported and skipped; 1 unexpected failure; 130 interrupted
(the answers so far are kept; run again to resume).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from coverpruner.evaluation.tasks import TASKS
from coverpruner.integers import cli_int
from coverpruner.selection import SELECTORS

TASK_NAMES = sorted(TASKS) + sorted(a for t in TASKS.values() for a in t.aliases)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="coverpruner-eval", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="answer a benchmark with an engine dir and score it")
    run.add_argument("engine_dir", metavar="ENGINE_DIR", help="engine dir written by coverpruner-export")
    _data_args(run)
    prune = run.add_argument_group("pruning")
    prune.add_argument("--budgets", default="full,128,64,32",
                       help="comma-separated visual-token budgets; 'full' = no pruning (default full,128,64,32)")
    prune.add_argument("--methods", default="coverpruner",
                       help=f"comma-separated selection methods ({', '.join(SELECTORS)}); e.g. "
                            "coverpruner,divprune,dart,cdpruner for the paper's side-by-side table")
    prune.add_argument("--tau", type=float, default=None, help="demand temperature (default: the manifest's)")
    gen = run.add_argument_group("generation (greedy)")
    gen.add_argument("--max-new-tokens", type=cli_int, default=None,
                     help="answer length limit (default: the lmms-eval task's, e.g. 16 for GQA, 128 for POPE)")
    gen.add_argument("--stop", action="append", default=None, metavar="TEXT",
                     help="end an answer where this string appears (repeatable; decoding stops there: the engine "
                          "loop matches it as it decodes); default: none, as lmms-eval's llava models")
    gen.add_argument("--limit", type=cli_int, default=None, help="only the first N usable rows")
    gen.add_argument("--max-images", type=cli_int, default=None,
                     help="multi-image tasks: most images per sample; a sample with more is skipped with a line "
                          "(default: the engine's defaults.max_images)")
    eng = run.add_argument_group("engine")
    eng.add_argument("--provider", default="cpu", help="cpu, cuda or tensorrt (default cpu)")
    eng.add_argument("--threads", type=cli_int, default=None, help="intra-op threads (default: ORT's choice)")
    out = run.add_argument_group("output")
    out.add_argument("--out", default="eval-results", help="output folder (default ./eval-results)")
    out.add_argument("--no-progress", action="store_true", help="no progress bar")

    score = sub.add_parser("score", help="score a predictions JSONL against the data (no model)")
    _data_args(score)
    score.add_argument("--predictions", required=True,
                       help='JSONL, one {"question_id": ..., "prediction": "..."} per line')
    score.add_argument("--json", action="store_true", help='print {"task": ..., "metrics": {...}} as JSON')
    return p


def _data_args(p) -> None:
    g = p.add_argument_group("data")
    g.add_argument("--task", required=True, choices=TASK_NAMES, metavar="TASK",
                   help=f"lmms-eval task: {', '.join(TASK_NAMES)}")
    g.add_argument("--data", required=True, type=Path,
                   help="parquet file or folder (the lmms-lab dataset from the hub), or a .jsonl with image paths")
    g.add_argument("--images", type=Path, default=None,
                   help="gqa only: the testdev_balanced_images parquet (default: found next to --data)")


def _positive(name: str, value) -> None:
    from coverpruner.runtime import OptionError

    if value is not None and value < 1:
        raise OptionError(f"{name} must be a positive integer, got {value}")


def check_out_dir(out: Path) -> None:
    """--out must be a folder (or creatable as one) that this user can write; checked before the run."""
    from coverpruner.runtime import OptionError

    probe = out
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise OptionError(f"--out {out}: {probe} is a file, expected a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise OptionError(f"--out {out}: {probe} is not writable")


def cmd_run(args) -> int:
    from coverpruner.evaluation.report import write_report
    from coverpruner.evaluation.runner import Runner, RunSettings, parse_budgets, parse_methods
    from coverpruner.evaluation.tasks import get_task
    from coverpruner.runtime import Pipeline

    from coverpruner.runtime.options import check_stop, check_tau

    task = get_task(args.task)
    _positive("--limit", args.limit)
    _positive("--max-new-tokens", args.max_new_tokens)
    _positive("--max-images", args.max_images)
    if args.tau is not None:
        check_tau(args.tau)  # before anything is written: run.json must never record a NaN tau
    stop = check_stop(args.stop) or None  # checked before anything is written, as tau
    check_out_dir(Path(args.out))
    settings = RunSettings(engine=Path(args.engine_dir), data=args.data, out=Path(args.out),
                           budgets=parse_budgets(args.budgets), methods=parse_methods(args.methods),
                           limit=args.limit, max_new_tokens=args.max_new_tokens, images=args.images, tau=args.tau,
                           progress=not args.no_progress, max_images=args.max_images, stop=stop)
    pipe = Pipeline.load(args.engine_dir, provider=args.provider, threads=args.threads)
    runner = Runner(pipe, task, settings)
    results = runner.run()
    summary = write_report(settings.out)
    for r in results:
        name, _ = task.headline
        print(f"{task.name} budget={r['budget']} method={r['method']}: {name}={r['metrics'][name]:.4f} "
              f"(n={r['n']})")
    print(f"wrote {settings.out / 'results.md'} and {settings.out / 'accuracy_vs_budget.png'} "
          f"({len(summary['rows'])} rows)")
    if runner.problems:
        print(f"coverpruner-eval: error: {len(runner.problems)} rows skipped (listed above); the results cover "
              f"the others", file=sys.stderr)
        return 2
    return 0


def cmd_score(args) -> int:
    from coverpruner.evaluation.data import DataError, load_samples
    from coverpruner.evaluation.files import read_jsonl
    from coverpruner.evaluation.scoring import score_samples
    from coverpruner.evaluation.tasks import get_task

    task = get_task(args.task)
    samples, problems = load_samples(task, args.data, need_image=False)
    for line in problems:
        print(f"coverpruner-eval: skipped: {line}", file=sys.stderr)
    path = Path(args.predictions)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        rows = read_jsonl(path)
    except ValueError as exc:
        raise DataError(str(exc)) from None
    preds = {}
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or "question_id" not in row or "prediction" not in row:
            raise DataError(f"{path} record {i + 1}: needs fields 'question_id' and 'prediction'")
        key = str(row["question_id"])
        if key in preds:  # which one should count? refuse rather than let the later row silently win
            raise DataError(f"{path} record {i + 1}: duplicate question_id {key!r}")
        preds[key] = "" if row["prediction"] is None else str(row["prediction"])
    result = score_samples(task, samples, preds)
    unknown = len(set(preds) - {s.key for s in samples})
    if args.json:
        print(json.dumps({"task": task.name, "metrics": result["metrics"], "n": result["n"],
                          "missing": result["missing"], "unknown": unknown}, indent=2))
    else:
        for k, v in result["metrics"].items():
            print(f"{task.name} {k}: {v:.4f}")
    if result["missing"] or unknown:
        print(f"coverpruner-eval: note: {result['missing']} samples without a prediction, {unknown} predictions "
              f"for unknown question_ids", file=sys.stderr)
    return 2 if problems else 0


def main(argv: list[str] | None = None) -> int:
    from coverpruner.runtime import CoverPrunerError

    args = build_parser().parse_args(argv)
    try:
        return cmd_run(args) if args.command == "run" else cmd_score(args)
    except CoverPrunerError as exc:
        print(f"coverpruner-eval: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("coverpruner-eval: interrupted; run the same command again to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
