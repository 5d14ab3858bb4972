"""Replace a directory all at once: build the new contents in a staging dir beside it, then swap it in.

coverpruner-export, --quantize and coverpruner-build write engine dirs of gigabytes over minutes; written in
place, a run killed part-way left a dir with the old manifest and missing or half-written graphs (issue 17).
Here the old dir stays as it was until the new one is complete:

    with StagedDir(target) as stage:      # stage = <parent>/.<name>.staging-<pid>-<random>, empty
        ... write files into stage ...    # stage.carry(name) hard-links an unchanged file of the old dir
    # on success: stage swapped in (Linux renameat2 RENAME_EXCHANGE: the name `target` is never absent,
    # else two renames, a window of microseconds); the old contents are deleted. On an exception: the stage
    # is deleted and the target is untouched. A SIGKILL leaves the target as it was plus a stage that the
    # next StagedDir of the same target deletes (its process is gone).

Carried files are hard links (no copy of gigabytes; a copy where the filesystem has no links). A writer must
never open a carried file for writing (that would write through the link into the old dir): carry a file
only once nothing more will be written under its name, as ``carry_rest`` does at the end.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import tempfile
from pathlib import Path

from coverpruner.integers import ascii_int

__all__ = ["StagedDir", "swap_dirs", "umask_mode"]

_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Atomically exchange two paths (Linux >= 3.15, glibc >= 2.28); False where that is not available."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0


def swap_dirs(stage: Path, target: Path) -> None:
    """Put the directory `stage` at `target`; the previous `target` (if any) is deleted."""
    if not target.exists():
        os.rename(stage, target)
        return
    if _exchange(stage, target):
        shutil.rmtree(stage, ignore_errors=True)  # now holds the old contents
        return
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    os.rename(target, old)
    os.rename(stage, target)
    shutil.rmtree(old, ignore_errors=True)


def umask_mode(mode: int) -> int:
    """``mode`` less the process's umask: what mkdir / open would have given (mkdtemp and mkstemp give 0700 / 0600)."""
    mask = os.umask(0o022)  # read it (the only portable way) and put it back at once
    os.umask(mask)
    return mode & ~mask


def _link_or_copy(src, dst) -> None:
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        shutil.copy2(src, dst, follow_symlinks=False)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_dead_stages(target: Path) -> None:
    """Delete the stages (and swapped-out old dirs) of `target` left by killed processes."""
    for prefix in (f".{target.name}.staging-", f".{target.name}.old-"):
        for p in target.parent.glob(prefix + "*"):
            pid = ascii_int(p.name[len(prefix):].split("-")[0])
            if pid is not None and not _pid_alive(pid):
                shutil.rmtree(p, ignore_errors=True)


class StagedDir:
    """Context manager: ``path`` (the stage) while writing; swapped in over ``target`` on a clean exit."""

    def __init__(self, target: str | os.PathLike):
        self.target = Path(target).resolve()  # a symlinked dir: stage beside the real one
        self.path: Path | None = None

    def __enter__(self) -> "StagedDir":
        self.target.parent.mkdir(parents=True, exist_ok=True)
        _remove_dead_stages(self.target)
        self.path = Path(tempfile.mkdtemp(prefix=f".{self.target.name}.staging-{os.getpid()}-",
                                          dir=self.target.parent))
        # mkdtemp makes 0700 (private scratch); the stage becomes the engine dir, which must be readable as a dir
        # made by mkdir is (0777 less the umask: 0755 by default, as the checkpoint's)
        os.chmod(self.path, umask_mode(0o777))
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            swap_dirs(self.path, self.target)
        else:
            shutil.rmtree(self.path, ignore_errors=True)

    def carry(self, name: str) -> None:
        """Hard-link (else copy) the old dir's file or folder `name` into the stage under the same name."""
        src, dst = self.target / name, self.path / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir() and not src.is_symlink():
            shutil.copytree(src, dst, copy_function=_link_or_copy, symlinks=True)
        else:
            _link_or_copy(src, dst)

    def carry_rest(self, skip=()) -> list[str]:
        """Carry every top-level file and folder of the old dir that the stage lacks and `skip` does not name (files the
        new contents no longer reference, e.g. a re-exported graph's stale .data); returns their names."""
        if not self.target.is_dir():
            return []
        skip = set(skip)
        carried = []
        for p in sorted(self.target.iterdir()):
            if p.name not in skip and not (self.path / p.name).exists():
                self.carry(p.name)
                carried.append(p.name)
        return carried
