"""Importing and running the runtime never loads torch or transformers (checked in a fresh interpreter)."""

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import importlib.abc, json, sys

    class Block(importlib.abc.MetaPathFinder):
        # an import of torch/transformers fails loudly instead of silently succeeding
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ("torch", "transformers"):
                raise ImportError("runtime imported " + name)
            return None

    sys.meta_path.insert(0, Block())
    from coverpruner.runtime import Pipeline
    from coverpruner.runtime.cli import main
    pipe = Pipeline.load(sys.argv[1])
    a = pipe.generate(sys.argv[2], "What is shown?", budget=16, method="coverpruner", max_new_tokens=4)
    b = pipe.generate(sys.argv[2], "What is shown?", budget="full", max_new_tokens=2)
    pieces = list(pipe.stream(sys.argv[2], "What is shown?", budget=8, method="attention", max_new_tokens=3))
    print(json.dumps({"tokens": len(a.token_ids) + len(b.token_ids), "pieces": len(pieces),
                      "loaded": sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers"))}))
""")


def test_runtime_runs_without_torch(tiny_export, demo_image):
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_export), str(demo_image)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["loaded"] == []
    assert report["tokens"] == 6
