"""The engine-side modules the runtime may import never import torch (the runtime must stay torch-free)."""

from __future__ import annotations

import subprocess
import sys

MODULES = ["coverpruner.engines.tensorrt", "coverpruner.engines.trt_session", "coverpruner.engines.cudart",
           "coverpruner.engines.cuda_selector", "coverpruner.engines.build_cli",
           "coverpruner.export.selector_plugin"]


def test_engine_modules_do_not_import_torch():
    code = ("import sys\n" + "".join(f"import {m}\n" for m in MODULES)
            + "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]\n"
            + "print('torch modules:', bad)\nraise SystemExit(1 if bad else 0)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
