"""Malformed and oversized image files, built byte by byte (a PNG header claiming 30,000 x 30,000 pixels costs
60 bytes, not 900 MB): name -> (bytes, text the one-line error must contain)."""

import struct
import zlib

from PIL import Image


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png(width: int, height: int, depth: int = 8, colour_type: int = 2, idat: bytes | None = None) -> bytes:
    header = struct.pack(">IIBBBBB", width, height, depth, colour_type, 0, 0, 0)
    body = _chunk(b"IDAT", idat) if idat is not None else b""
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + body + _chunk(b"IEND", b"")


def bad_images() -> dict[str, tuple[bytes, str]]:
    limit = f"decompression-bomb limit of {Image.MAX_IMAGE_PIXELS} pixels"
    return {
        "bomb_30000x30000": (png(30000, 30000, depth=1, colour_type=0), limit),  # over 2x: PIL's error
        "bomb_10000x10000": (png(10000, 10000, depth=1, colour_type=0), limit),  # 1x-2x: PIL only warns
        "no_pixel_data": (png(10, 10), "cannot read image"),
        "broken_pixel_data": (png(10, 10, idat=b"xx"), "cannot read image"),
        "truncated_pixel_data": (png(100, 100, idat=zlib.compress(b"\0" * 50)), "cannot read image"),
        "zero_size": (png(0, 0), "cannot read image"),
        "bad_colour_type": (png(10, 10, colour_type=5), "cannot read image"),
    }
