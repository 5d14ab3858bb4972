"""Hand-made PNG files of any size (streamed through zlib, so a 30,000 x 30,000 image costs ~100 KB and no
pixel buffer here): the decompression bombs and extreme aspect ratios the hostile-input tests send."""

from __future__ import annotations

import struct
import zlib


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png(width: int, height: int, channels: int = 1, bit_depth: int = 8, row: bytes | None = None) -> bytes:
    """A PNG of ``height`` identical rows. channels 1 (grey) or 3 (RGB); bit_depth 1 or 8 (grey only for 1).
    row: the raw row bytes without the filter byte (default zeros)."""
    color_type = {1: 0, 3: 2}[channels]
    row_bytes = (width * channels * bit_depth + 7) // 8
    row = b"\x00" * row_bytes if row is None else row
    assert len(row) == row_bytes
    comp = zlib.compressobj(9)
    line = b"\x00" + row
    parts, rows_per = [], max(1, (1 << 20) // len(line))
    for start in range(0, height, rows_per):
        parts.append(comp.compress(line * min(rows_per, height - start)))
    parts.append(comp.flush())
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", b"".join(parts)) + _chunk(b"IEND", b"")
