"""engines/ is a layer below runtime/: importing every engines module loads no coverpruner.runtime module."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import coverpruner.engines as engines


def test_engines_do_not_import_runtime():
    modules = [f"coverpruner.engines.{m.name}" for m in pkgutil.iter_modules(engines.__path__)]
    assert "coverpruner.engines.interfaces" in modules and "coverpruner.engines.trt_pipeline" not in modules
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + "bad = sorted(m for m in sys.modules if m.startswith('coverpruner.runtime'))\n"
            + "print('runtime modules:', bad)\nraise SystemExit(1 if bad else 0)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
