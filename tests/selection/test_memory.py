"""The numpy backend's memory: one [n, n] utility buffer plus temporaries of at most blocked.BLOCK_BYTES each
(measured in a subprocess: VmHWM after the selection minus VmRSS before it, inputs already built; VmHWM, not
ru_maxrss, because Linux carries ru_maxrss across exec from the forking parent -- pytest's own RSS). The full-size
figure (n = 16,384, d = 3,584, m = 1,638: at most 1.3 GiB added) is benchmarks/bench_selector.py's."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = r"""
import json, sys
import numpy as np
from coverpruner.selection import coverage_select
n, d, m, dtype = 4096, 64, 410, {"float32": np.float32, "float64": np.float64}[sys.argv[1]]
rng = np.random.default_rng(0)
v = rng.standard_normal((n, d), dtype=np.float32)
r = rng.random(n).astype(np.float32)
def status_kib(key):
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key + ":"))
rss0 = status_kib("VmRSS") * 1024
keep = coverage_select(v, r, m, 0.3, backend=sys.argv[2], dtype=dtype)
peak = status_kib("VmHWM") * 1024
print(json.dumps({"added": peak - rss0, "kept": len(keep)}))
"""


@pytest.mark.parametrize("dtype,itemsize", [("float32", 4), ("float64", 8)])
@pytest.mark.parametrize("backend", ["numpy", "lazy"])
def test_selection_adds_one_utility_buffer_and_bounded_blocks(dtype, itemsize, backend):
    out = subprocess.run([sys.executable, "-c", PROBE, dtype, backend], capture_output=True, text=True,
                         cwd=ROOT, env={"PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1", "PATH": ""})
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    n = 4096
    buffer = n * n * itemsize  # 64 MiB float32, 128 MiB float64
    # + two 32 MiB row blocks (float64 block and its staging copy) + [n, K] fresh sums and small vectors
    assert got["kept"] == 410 and got["added"] <= buffer + 96 * 2**20, (got["added"] / 2**20, buffer / 2**20)
