"""The NVIDIA driver release a user compares against NVIDIA's tables (e.g. "580.65.06"), not the CUDA API level
that cudaDriverGetVersion gives ("13.0"). Through NVML (libnvidia-ml.so.1, shipped with every desktop and
datacenter driver) by ctypes, no pynvml; else the kernel module's /proc/driver/nvidia/version; on a Jetson, which
has no NVML on JetPack 6, the L4T release of /etc/nv_tegra_release (JetPack's driver is part of L4T).
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

NVML_LIBRARIES = ("libnvidia-ml.so.1",)
PROC_VERSION = Path("/proc/driver/nvidia/version")
TEGRA_RELEASE = Path("/etc/nv_tegra_release")
_NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE = 80  # nvml.h


def nvml_driver_version(libraries=NVML_LIBRARIES) -> str:
    """nvmlSystemGetDriverVersion through the first NVML library that loads; raises OSError (not found) or
    RuntimeError (an NVML call failed, with nvmlErrorString's text)."""
    errors = []
    for name in libraries:
        try:
            nvml = ctypes.CDLL(str(name))
            break
        except OSError as exc:
            errors.append(str(exc))
    else:
        raise OSError("; ".join(errors))
    nvml.nvmlErrorString.restype = ctypes.c_char_p
    status = nvml.nvmlInit_v2()
    if status != 0:
        raise RuntimeError(f"nvmlInit_v2: {nvml.nvmlErrorString(status).decode()} ({status})")
    try:
        buf = ctypes.create_string_buffer(_NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE)
        status = nvml.nvmlSystemGetDriverVersion(buf, ctypes.c_uint(len(buf)))
        if status != 0:
            raise RuntimeError(f"nvmlSystemGetDriverVersion: {nvml.nvmlErrorString(status).decode()} ({status})")
        return buf.value.decode()
    finally:
        nvml.nvmlShutdown()


def driver_release(libraries=NVML_LIBRARIES, proc_version: Path = PROC_VERSION,
                   tegra_release: Path = TEGRA_RELEASE) -> str:
    """"580.65.06 (NVML)", "580.65.06 (/proc/driver/nvidia/version)", "L4T R36.4.0 (/etc/nv_tegra_release)", or
    "unknown (...)" with what each source said."""
    try:
        return f"{nvml_driver_version(libraries)} (NVML)"
    except (OSError, RuntimeError, AttributeError) as exc:
        why = [f"NVML: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"]
    for path, pattern, release in (
            (proc_version, r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9][0-9.]+)", lambda m: m.group(1)),
            (tegra_release, r"R(\d+)\s*\(release\),\s*REVISION:\s*([0-9.]+)",
             lambda m: f"L4T R{m.group(1)}.{m.group(2)}")):
        try:
            match = re.search(pattern, path.read_text())
        except OSError as exc:
            why.append(f"{path}: {exc.strerror or exc}")
            continue
        if match:
            return f"{release(match)} ({path})"
        why.append(f"{path}: no release in it")
    return "unknown (" + "; ".join(why) + ")"
