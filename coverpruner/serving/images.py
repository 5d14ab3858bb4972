"""Turn an ``image_url`` of a chat message into a decoded PIL image, or a 400 naming the field.

Accepted: ``data:image/<png|jpeg|webp>;base64,...`` URLs always; a local path (``file://`` URL or a
plain path) only when the server runs with ``--allow-local-files``; ``http(s)://`` only with
``--allow-remote-images`` (fetched with a size limit, a limit on the whole fetch's time, and redirects only
to http(s) without a downgrade from https). Other schemes are refused.

``url_bytes`` (the scheme rules and byte limits alone) also reads video_url parts (serving.videos).

Before an image is decoded its header is read and its size checked: at most MAX_IMAGE_PIXELS pixels and an
aspect ratio of at most MAX_ASPECT_RATIO (the preprocessors scale the short side up to the model's input: a
20,000 x 1 image became a 336 x 6.7M intermediate, 5.5 GB).
"""

from __future__ import annotations

import base64
import binascii
import functools
import http.client
import io
import socket
import threading
import time
import urllib.request
from pathlib import Path
from urllib.parse import unquote, urlparse

from PIL import Image, UnidentifiedImageError

from coverpruner.serving.errors import APIError, bad_request

#: Image formats the server decodes (PIL format names).
FORMATS = ("PNG", "JPEG", "WEBP")
#: Largest encoded image accepted from any source (bytes).
MAX_IMAGE_BYTES = 32 * 1024 * 1024
#: Whole remote fetch (connect, redirects, every byte), seconds.
REMOTE_TIMEOUT_S = 10.0
#: Remote fetches in progress at once per process; more get 429 at once. Requests are parsed on the ASGI
#: server's thread pool (40 threads), so 42 slow fetches used to block every other request for their duration.
MAX_CONCURRENT_FETCHES = 8
_fetch_slots = threading.BoundedSemaphore(MAX_CONCURRENT_FETCHES)
#: Largest image accepted (pixels): 64 MP, above the 48-50 MP of today's phone cameras; decoded RGB <= 192 MiB.
MAX_IMAGE_PIXELS = 64_000_000
#: Longest side / shortest side, as coverpruner.images.MAX_ASPECT_RATIO (the runtime's own check): Qwen2-VL's
#: processor's limit, 200:1. LLaVA's CLIP resize scales the short side to 336 px, so 200:1 bounds its
#: intermediate at 67,200 x 336 (22.6 MP, 68 MB as uint8 RGB; 20,000 x 1 was 2.3 GP, 5.5 GB).
MAX_ASPECT_RATIO = 200


def load_image_url(url: str, param: str, allow_local_files: bool = False,
                   allow_remote_images: bool = False, timeout_s: float = REMOTE_TIMEOUT_S) -> Image.Image:
    """url -> fully decoded PIL image. Raises APIError(400) naming ``param`` on every refusal."""
    return _decode(url_bytes(url, param, allow_local_files, allow_remote_images, timeout_s), param)


def url_bytes(url: str, param: str, allow_local_files: bool, allow_remote: bool, timeout_s: float = REMOTE_TIMEOUT_S,
              limit: int = MAX_IMAGE_BYTES, what: str = "image") -> bytes:
    """The bytes an image or video URL names (data:, http(s):// when allowed, a local path when allowed), at most
    ``limit``; APIError(400) naming ``param`` on every refusal (429 when too many fetches are in progress)."""
    url = url.strip()
    scheme = urlparse(url).scheme.lower() if "://" in url or url.startswith("data:") else ""
    if scheme == "data":
        return _data_url_bytes(url, param, limit, what)
    if scheme in ("http", "https"):
        if not allow_remote:
            raise bad_request(f"remote {what} URLs are disabled on this server (start it with "
                              f"--allow-remote-images); send the {what} as a data: URL", param,
                              "remote_images_disabled")
        if not _fetch_slots.acquire(blocking=False):
            raise APIError(429, f"{MAX_CONCURRENT_FETCHES} remote fetches are in progress; retry later or send "
                                f"the {what} as a data: URL", param, "too_many_remote_fetches")
        try:
            return _fetch(url, param, timeout_s, limit, what)
        finally:
            _fetch_slots.release()
    if scheme in ("file", ""):
        if not allow_local_files:
            raise bad_request(f"local {what} paths are disabled on this server (start it with "
                              f"--allow-local-files); send the {what} as a data: URL", param, "local_files_disabled")
        return _read_local(unquote(urlparse(url).path) if scheme == "file" else url, param, limit, what)
    raise bad_request(f"unsupported {what} URL scheme {scheme!r}; expected data:, http(s):// or a local path",
                      param, f"invalid_{what}_url")


def _data_url_bytes(url: str, param: str, limit: int = MAX_IMAGE_BYTES, what: str = "image") -> bytes:
    header, sep, payload = url.partition(",")
    if not sep or not header.endswith(";base64"):
        example = "data:image/png;base64" if what == "image" else "data:video/mp4;base64"
        raise bad_request(f"data: URL must look like {example},<base64 data>", param, f"invalid_{what}_url")
    try:
        data = base64.b64decode(payload.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise bad_request(f"{what} data is not valid base64 ({exc})", param, "invalid_base64") from None
    if len(data) > limit:
        raise bad_request(f"{what} is {len(data)} bytes; the limit is {limit}", param, f"{what}_too_large")
    return data


class _SameSchemeRedirects(urllib.request.HTTPRedirectHandler):
    """Follow a redirect only to http(s), and never from https to http (urllib would follow one to ftp://)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        old, new = urlparse(req.full_url).scheme.lower(), urlparse(newurl).scheme.lower()
        if new not in ("http", "https") or (old == "https" and new == "http"):
            raise _RedirectRefused(f"redirect from {req.full_url} to {newurl} changes the scheme to {new!r}")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class _RedirectRefused(Exception):
    pass


class _Watchdog:
    """Shuts down every socket of one fetch when its total time is up. urllib's ``timeout`` bounds each socket
    operation, not the fetch: a server that drips its status line and headers a byte at a time kept a fetch (and
    one of the fetch slots) for 40-60 s. Shutting the socket down wakes the blocked read, which then fails."""

    def __init__(self, seconds: float):
        self.expired = False
        self._socks: list = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True

    def __enter__(self):
        self._timer.start()
        return self

    def __exit__(self, *exc):
        self._timer.cancel()

    def _fire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._socks:
                _shutdown(sock)

    def watch(self, sock) -> None:
        with self._lock:
            self._socks.append(sock)
            if self.expired:
                _shutdown(sock)


def _shutdown(sock) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed
        pass


def _watched(base: type) -> type:
    """``base`` (HTTPConnection or HTTPSConnection) that hands each socket it connects to a _Watchdog."""

    class Watched(base):
        def __init__(self, *args, watchdog: _Watchdog, **kwargs):
            super().__init__(*args, **kwargs)
            self._watchdog = watchdog

        def connect(self):
            super().connect()
            self._watchdog.watch(self.sock)

    return Watched


_WatchedHTTP, _WatchedHTTPS = _watched(http.client.HTTPConnection), _watched(http.client.HTTPSConnection)


class _WatchedHandler(urllib.request.HTTPHandler):
    def __init__(self, watchdog: _Watchdog):
        super().__init__()
        self._watchdog = watchdog

    def http_open(self, req):
        return self.do_open(functools.partial(_WatchedHTTP, watchdog=self._watchdog), req)


class _WatchedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, watchdog: _Watchdog):
        super().__init__()
        self._watchdog = watchdog

    def https_open(self, req):
        return self.do_open(functools.partial(_WatchedHTTPS, watchdog=self._watchdog), req,
                            context=self._context)


def _fetch(url: str, param: str, timeout_s: float, limit: int = MAX_IMAGE_BYTES, what: str = "image") -> bytes:
    """GET url within timeout_s in total, from connect to the last byte, headers and redirects included (a
    server dripping bytes cannot hold a worker longer), at most limit bytes; ``what`` ("image", "video") names
    the thing in errors and error codes."""
    late = bad_request(f"cannot fetch {what} {url}: not complete after {timeout_s:g} s", param,
                       f"{what}_fetch_failed")
    deadline = time.monotonic() + timeout_s
    chunks, size = [], 0
    with _Watchdog(timeout_s) as watchdog:
        opener = urllib.request.build_opener(_SameSchemeRedirects, _WatchedHandler(watchdog),
                                             _WatchedHTTPSHandler(watchdog))
        try:
            with opener.open(url, timeout=timeout_s) as resp:
                while True:
                    if time.monotonic() > deadline:
                        raise late
                    block = resp.read1(1 << 16)
                    if not block:
                        break
                    chunks.append(block)
                    size += len(block)
                    if size > limit:
                        raise bad_request(f"{what} at {url} exceeds {limit} bytes", param, f"{what}_too_large")
        except _RedirectRefused as exc:
            raise bad_request(f"cannot fetch {what}: {exc}", param, f"invalid_{what}_url") from None
        except (OSError, ValueError, http.client.HTTPException) as exc:
            if watchdog.expired:
                raise late from None
            raise bad_request(f"cannot fetch {what} {url}: {exc}", param, f"{what}_fetch_failed") from None
    if watchdog.expired:  # a read that raced the shutdown returns b"" (end of file), not an error
        raise late
    return b"".join(chunks)


def _read_local(path: str, param: str, limit: int = MAX_IMAGE_BYTES, what: str = "image") -> bytes:
    p = Path(path)
    if not p.is_file():
        raise bad_request(f"{what} file not found: {path}", param, f"{what}_not_found")
    if p.stat().st_size > limit:
        raise bad_request(f"{what} file {path} exceeds {limit} bytes", param, f"{what}_too_large")
    return p.read_bytes()


def _decode(data: bytes, param: str) -> Image.Image:
    try:
        img = Image.open(io.BytesIO(data))
        fmt = img.format
        if fmt not in FORMATS:
            raise bad_request(f"image format {fmt} is not supported; send one of {', '.join(FORMATS)}", param,
                              "unsupported_image_format")
        check_image_size(img.size, param)  # from the header, before any pixel is decoded
        img.load()  # decode now: a truncated file fails here, not inside a worker
    except Image.DecompressionBombError as exc:  # PIL's own guard, met when the header is read
        raise bad_request(f"image is too large ({str(exc).split(',')[0]}); the limit is {MAX_IMAGE_PIXELS} pixels",
                          param, "image_too_large") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise bad_request(f"data is not a decodable image ({type(exc).__name__}: {str(exc).splitlines()[0]})",
                          param, "invalid_image") from None
    return img


def check_image_size(size: tuple[int, int], param: str) -> None:
    """(width, height) within MAX_IMAGE_PIXELS and MAX_ASPECT_RATIO, else APIError(400)."""
    w, h = size
    if w < 1 or h < 1 or w * h > MAX_IMAGE_PIXELS:
        raise bad_request(f"image is {w} x {h} = {w * h} pixels; the limit is {MAX_IMAGE_PIXELS} pixels", param,
                          "image_too_large")
    if max(w, h) > MAX_ASPECT_RATIO * min(w, h):
        raise bad_request(f"image is {w} x {h} (aspect ratio {max(w, h) / min(w, h):.0f}:1); the limit is "
                          f"{MAX_ASPECT_RATIO}:1", param, "invalid_image")
