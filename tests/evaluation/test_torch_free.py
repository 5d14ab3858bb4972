"""coverpruner-eval never loads torch or transformers (checked in a fresh interpreter), like the runtime."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.evaluation.datasets import pope_rows, write_jsonl

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import sys
    from coverpruner.evaluation.cli import main
    code = main(sys.argv[1:])
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers"))
    print("loaded:", heavy, file=sys.stderr)
    sys.exit(code or (3 if heavy else 0))
""")


def test_run_without_torch(tiny_export, tmp_path):
    data = write_jsonl(tmp_path / "pope.jsonl", pope_rows(2), [1, 2])
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, "run", str(tiny_export), "--task", "pope", "--data",
                           str(data), "--budgets", "full,8", "--methods", "coverpruner", "--max-new-tokens", "2",
                           "--out", str(tmp_path / "out"), "--no-progress", "--threads", "1"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rec = json.loads((tmp_path / "out" / "pope" / "metrics" / "8_coverpruner.json").read_text())
    assert rec["n"] == 2
