"""Output files that are never half-written: atomic replace for whole files, whole-line appends for JSONL."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from coverpruner.staged_dir import umask_mode


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write ``data`` to a temporary file next to ``path``, fsync, then rename over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, umask_mode(0o666))  # mkstemp's 0600 would make the result private; open() would not
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, obj) -> None:
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def read_jsonl(path: Path, repair: bool = False) -> list[dict]:
    """The complete records of a JSONL file. A last line cut short (a run killed mid-write) is dropped;
    with ``repair`` the file is rewritten without it, so the next append starts on a fresh line.
    A broken line elsewhere is corruption: ValueError naming the line."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").split("\n")
    records, bad_tail = [], False
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError:
            if i == len(lines) - 1:  # no newline after it: the write never finished
                bad_tail = True
                continue
            raise ValueError(f"{path} line {i + 1}: not valid JSON") from None
    if repair and (bad_tail or (lines and lines[-1] != "")):
        write_atomic(path, "".join(json.dumps(r) + "\n" for r in records))
    return records


class JsonlAppender:
    """Appends one record per call as a single write of one whole line, flushed and fsynced."""

    def __init__(self, path: Path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(path, "a", encoding="utf-8")

    def append(self, record: dict) -> None:
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
