"""Request errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Every bad request becomes one ``APIError`` with an HTTP status (4xx for the client's mistakes, 503 when
the queue is full), a one-line message and the request field it is about (``param``), so clients and
evaluation harnesses see what to fix while the server keeps serving.
"""

from __future__ import annotations


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
