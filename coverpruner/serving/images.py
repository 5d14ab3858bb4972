"""Turn an ``image_url`` of a chat message into a decoded PIL image, or a 400 naming the field.

Accepted: ``data:image/<png|jpeg|webp>;base64,...`` URLs always; a local path (``file://`` URL or a
plain path) only when the server runs with ``--allow-local-files``; ``http(s)://`` only with
``--allow-remote-images`` (fetched with a size limit and a timeout). Other schemes are refused.
"""

from __future__ import annotations

import base64
import binascii
import io
import urllib.request
from pathlib import Path
from urllib.parse import unquote, urlparse

from PIL import Image, UnidentifiedImageError

from coverpruner.serving.errors import bad_request

#: Image formats the server decodes (PIL format names).
FORMATS = ("PNG", "JPEG", "WEBP")
#: Largest encoded image accepted from any source (bytes).
MAX_IMAGE_BYTES = 32 * 1024 * 1024
REMOTE_TIMEOUT_S = 10.0


def load_image_url(url: str, param: str, allow_local_files: bool = False,
                   allow_remote_images: bool = False) -> Image.Image:
    """url -> fully decoded PIL image. Raises APIError(400) naming ``param`` on every refusal."""
    url = url.strip()
    scheme = urlparse(url).scheme.lower() if "://" in url or url.startswith("data:") else ""
    if scheme == "data":
        data = _data_url_bytes(url, param)
    elif scheme in ("http", "https"):
        if not allow_remote_images:
            raise bad_request(f"remote image URLs are disabled on this server (start it with "
                              f"--allow-remote-images); send the image as a data: URL", param,
                              "remote_images_disabled")
        data = _fetch(url, param)
    elif scheme in ("file", ""):
        if not allow_local_files:
            raise bad_request("local image paths are disabled on this server (start it with "
                              "--allow-local-files); send the image as a data: URL", param, "local_files_disabled")
        data = _read_local(unquote(urlparse(url).path) if scheme == "file" else url, param)
    else:
        raise bad_request(f"unsupported image URL scheme {scheme!r}; expected data:, http(s):// or a local path",
                          param, "invalid_image_url")
    return _decode(data, param)


def _data_url_bytes(url: str, param: str) -> bytes:
    header, sep, payload = url.partition(",")
    if not sep or not header.endswith(";base64"):
        raise bad_request("data: URL must look like data:image/png;base64,<base64 data>", param, "invalid_image_url")
    try:
        data = base64.b64decode(payload.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise bad_request(f"image data is not valid base64 ({exc})", param, "invalid_base64") from None
    if len(data) > MAX_IMAGE_BYTES:
        raise bad_request(f"image is {len(data)} bytes; the limit is {MAX_IMAGE_BYTES}", param, "image_too_large")
    return data


def _fetch(url: str, param: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=REMOTE_TIMEOUT_S) as resp:
            data = resp.read(MAX_IMAGE_BYTES + 1)
    except (OSError, ValueError) as exc:
        raise bad_request(f"cannot fetch image {url}: {exc}", param, "image_fetch_failed") from None
    if len(data) > MAX_IMAGE_BYTES:
        raise bad_request(f"image at {url} exceeds {MAX_IMAGE_BYTES} bytes", param, "image_too_large")
    return data


def _read_local(path: str, param: str) -> bytes:
    p = Path(path)
    if not p.is_file():
        raise bad_request(f"image file not found: {path}", param, "image_not_found")
    if p.stat().st_size > MAX_IMAGE_BYTES:
        raise bad_request(f"image file {path} exceeds {MAX_IMAGE_BYTES} bytes", param, "image_too_large")
    return p.read_bytes()


def _decode(data: bytes, param: str) -> Image.Image:
    try:
        img = Image.open(io.BytesIO(data))
        fmt = img.format
        if fmt not in FORMATS:
            raise bad_request(f"image format {fmt} is not supported; send one of {', '.join(FORMATS)}", param,
                              "unsupported_image_format")
        img.load()  # decode now: a truncated file fails here, not inside a worker
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise bad_request(f"data is not a decodable image ({type(exc).__name__}: {str(exc).splitlines()[0]})",
                          param, "invalid_image") from None
    return img
