"""The server's one error: answered in OpenAI's shape, or in Anthropic's on its Messages API."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type_ or {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                              404: "not_found_error", 413: "invalid_request_error", 415: "invalid_request_error",
                              429: "rate_limit_error"}.get(status, "server_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def anthropic_body(self) -> dict[str, Any]:
        """Anthropic's shape, for its Messages API: {"type": "error", "error": {"type", "message"}}."""
        return {"type": "error", "error": {"type": ANTHROPIC_ERRORS.get(self.status, "api_error"),
                                           "message": self.message}}


ANTHROPIC_ERRORS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 415: "invalid_request_error",
                    429: "rate_limit_error", 503: "overloaded_error", 504: "timeout_error"}


def bad_request(message: str, param: str | None = None, code: str | None = "invalid_value") -> ApiError:
    """A 400 naming the parameter at fault."""
    return ApiError(400, message, param, code)
