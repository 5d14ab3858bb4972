"""Small benchmark files in the supported schemas, written for the tests.

Parquet files follow the lmms-lab hub layout and column types (images as struct<bytes: binary, path: string>);
JSONL files name PNG files next to them.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np


def png_bytes(seed: int, size: int = 40) -> bytes:
    from PIL import Image

    arr = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def pope_rows(n: int) -> list[dict]:
    """POPE-like rows: alternating yes/no answers, unique question ids."""
    objects = ["dog", "car", "chair", "person", "cup", "tree"]
    return [{"id": str(i), "question_id": str(1000 + i), "question": f"Is there a {objects[i % 6]} in the image?",
             "answer": "yes" if i % 2 == 0 else "no", "image_source": f"img{i}", "category": "adversarial"}
            for i in range(n)]


def write_parquet(path: Path, rows: list[dict], image_seeds: list[int] | None = None, image_col: str = "image") -> Path:
    """rows + an embedded PNG per row (struct<bytes, path>, as the hub stores images)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [dict(r) for r in rows]
    if image_seeds is not None:
        for r, seed in zip(rows, image_seeds):
            r[image_col] = {"bytes": png_bytes(seed), "path": f"{seed}.png"}
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_jsonl(path: Path, rows: list[dict], image_seeds: list[int], size: int = 40) -> Path:
    """rows + an image path per row (png_bytes(seed, size) files in images/ next to the JSONL)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.parent / "images").mkdir(exist_ok=True)
    with open(path, "w") as fh:
        for r, seed in zip(rows, image_seeds):
            name = f"images/{seed}.png"
            (path.parent / name).write_bytes(png_bytes(seed, size))
            fh.write(json.dumps({**r, "image": name}) + "\n")
    return path
