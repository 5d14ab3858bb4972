"""Request errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Every bad request becomes one ``APIError`` with an HTTP status (4xx for the client's mistakes, 503 when
the queue is full), a one-line message and the request field it is about (``param``), so clients and
evaluation harnesses see what to fix while the server keeps serving. A pipeline error
(coverpruner.errors.CoverPrunerError) carries its code and param from where it was raised; ``ERROR_STATUS``
is the one table that gives each code its HTTP status and OpenAI error type (``from_pipeline_error``).
"""

from __future__ import annotations

from coverpruner.errors import CoverPrunerError

#: CoverPrunerError code -> (HTTP status, OpenAI error type, the param reported when the error names none). Every
#: code in coverpruner.errors.CODES is here (tests/serving/test_error_codes.py raises each through the server).
ERROR_STATUS = {
    "invalid_request": (400, "invalid_request_error", None),
    "invalid_image": (400, "invalid_request_error", "messages"),
    "invalid_video": (400, "invalid_request_error", "messages"),
    "video_too_large": (400, "invalid_request_error", "messages"),
    "invalid_prompt": (400, "invalid_request_error", "messages"),
    "context_length_exceeded": (400, "invalid_request_error", "messages"),
    "too_many_images": (400, "invalid_request_error", "messages"),
    "too_many_parts": (400, "invalid_request_error", "messages"),
    "invalid_value": (400, "invalid_request_error", None),
    "grammar_too_complex": (400, "invalid_request_error", "response_format"),
    # one answer's logits were NaN: the decoder's fault, that request alone
    "sampling_failed": (500, "server_error", None),
    # the engine dir changed on disk or cannot run: the server's fault, not the request's
    "invalid_engine_dir": (500, "server_error", None),
}


class APIError(Exception):
    """status: HTTP status; type: OpenAI error type; param: offending field path (or None); code: short id."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _default_type(status)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _default_type(status: int) -> str:
    if status == 404:
        return "not_found_error"
    if status == 503:
        return "service_unavailable"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> APIError:
    """400 invalid_request_error naming ``param``."""
    return APIError(400, message, param, code)


def from_pipeline_error(exc: CoverPrunerError, field_names: dict | None = None) -> APIError:
    """A pipeline error -> APIError with the status, type and default param ERROR_STATUS gives its code. The
    error's own param (a GenerationOptions field or a message path) is reported in the API's terms: renamed by
    ``field_names`` (e.g. {"max_new_tokens": "max_tokens"}) where the body calls it otherwise."""
    msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    status, kind, default = ERROR_STATUS.get(exc.code, (500, "server_error", None))
    param = exc.param if exc.param is not None else default
    return APIError(status, msg, (field_names or {}).get(param, param), exc.code, kind)
