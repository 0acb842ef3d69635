"""What every request passes before a route runs (serve/app.py wraps its app in it): Host and Origin, CORS for the
allowed origins, the JSON content type of a POST, the API key, and the request counter; as plain ASGI. The
generation routes are then called directly; every other request goes on to the FastAPI app."""

from __future__ import annotations

import hmac
from typing import Any

from pipeline.serve.errors import ApiError
from pipeline.serve.metrics import Metrics

# metric labels; /v1/models/{id} is "other"
ROUTES = ("/v1/models", "/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens",
          "/v1/responses", "/v1/audio/transcriptions", "/v1/audio/speech", "/v1/audio/voices", "/v1/audio/models")
# POST routes whose body is not JSON: a file upload's form (OpenAI's transcriptions)
UPLOADS = {"/v1/audio/transcriptions": b"multipart/form-data"}
ANTHROPIC = "/v1/messages"      # its routes answer errors in Anthropic's shape


def error_response(exc: ApiError, path: str = ""):
    """The error in the shape of the API the path belongs to: Anthropic's under /v1/messages, else OpenAI's."""
    from fastapi.responses import JSONResponse
    body = exc.anthropic_body() if path == ANTHROPIC or path.startswith(ANTHROPIC + "/") else exc.body()
    return JSONResponse(body, status_code=exc.status, headers=exc.headers)


class Gate:
    """What every request passes before a route runs, as plain ASGI (Starlette's @app.middleware("http") runs every
    response body through a memory stream and a task of its own, which costs each request and each SSE chunk):

    - `Host` must name this server where `allowed_hosts` is set (the loopback default: a web page that rebinds its
      own DNS name to 127.0.0.1 sends its own name, and is refused), and a browser's `Origin` is refused unless it
      is one of `cors_origins` (--cors-origin), which get CORS answers (the preflight, Access-Control-Allow-Origin):
      a page must not drive a model on the user's machine and read its answers unless the user said so;
    - a POST must say `Content-Type: application/json`: a page may send text/plain anywhere without asking first
      (a "simple" cross-origin request), never JSON;
    - the API key (`Authorization: Bearer KEY`, the scheme in any case, or Anthropic's `x-api-key: KEY`) on /v1/*,
      /models/* (a set's load and unload) and, unless public, /metrics: checked on the headers, before any body is
      read; a refused client's connection is closed;
    - the request counter, labelled by known route only (clients must not grow the label set).
    """

    def __init__(self, app: Any, api_key: str | None, metrics: Metrics, allowed_hosts: frozenset[str] | None = None,
                 cors_origins: frozenset[str] = frozenset(), public_metrics: bool = False,
                 posts: dict[str, Any] | None = None):
        """posts: ASGI handlers of POST routes called directly, past `app` (serve/app.py's generation routes)."""
        self.app, self.metrics, self.posts = app, metrics, posts or {}
        self.expected = None if api_key is None else api_key.encode()
        self.allowed_hosts, self.cors_origins, self.public_metrics = allowed_hosts, cors_origins, public_metrics

    def _key_ok(self, headers: dict[bytes, bytes]) -> bool:
        if self.expected is None:
            return True
        scheme, _, token = headers.get(b"authorization", b"").strip().partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.expected):
            return True
        return hmac.compare_digest(headers.get(b"x-api-key", b"").strip(), self.expected)

    def _host_refusal(self, headers: dict[bytes, bytes]) -> ApiError | None:
        if self.allowed_hosts is not None and host_name(headers.get(b"host", b"")) not in self.allowed_hosts:
            return ApiError(403, "this server answers only requests addressed to "
                            f"{', '.join(sorted(self.allowed_hosts))} (Host header); serve with --allowed-host NAME "
                            "to add a name", code="host_not_allowed", headers=CLOSE)
        return None

    def _refusal(self, scope: Any, headers: dict[bytes, bytes]) -> ApiError | None:
        host = self._host_refusal(headers)
        if host is not None:
            return host
        origin = headers.get(b"origin")
        if origin is not None and origin.decode("latin-1") not in self.cors_origins:
            return ApiError(403, "requests from web pages (an Origin header) are refused: a page must not drive this "
                            "server; call it from a program, or serve with --cors-origin ORIGIN",
                            code="origin_not_allowed", headers=CLOSE)
        path = scope.get("path", "")
        guarded = path.startswith(("/v1/", "/models/")) or (path == "/metrics" and not self.public_metrics)
        if guarded and not self._key_ok(headers):
            return ApiError(401, "a valid API key is required (Authorization: Bearer KEY, or x-api-key: KEY)",
                            code="invalid_api_key", headers=CLOSE)
        if scope.get("method") == "POST":
            ctype = headers.get(b"content-type", b"").split(b";", 1)[0].strip().lower()
            want = UPLOADS.get(path, b"application/json")
            if ctype != want:
                return ApiError(415, f"Content-Type must be {want.decode()}, not {ctype.decode('latin-1')[:60]!r}",
                                code="unsupported_media_type", headers=CLOSE)
        return None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        label = path if path in ROUTES else "other"
        headers = dict(scope.get("headers") or [])
        origin = headers.get(b"origin")
        cors = [(b"access-control-allow-origin", origin), (b"vary", b"Origin")] \
            if origin is not None and origin.decode("latin-1") in self.cors_origins else []
        if cors and scope.get("method") == "OPTIONS" and b"access-control-request-method" in headers \
                and self._host_refusal(headers) is None:      # a preflight carries no key; its Host still counts
            await send({"type": "http.response.start", "status": 204, "headers": [
                *cors, (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
                (b"access-control-allow-headers", b"Authorization, Content-Type, X-Api-Key, Anthropic-Version"),
                (b"access-control-max-age", b"600")]})
            await send({"type": "http.response.body", "body": b""})
            return
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            if path.startswith("/v1/"):
                self.metrics.requests.labels(label, str(refusal.status)).inc()
            await error_response(refusal, path)(scope, receive, send)
            return
        status = {"code": 500}      # an exception before the response started is a 500 to the client

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                if cors:
                    message = dict(message, headers=[*message.get("headers", []), *cors])
            await send(message)
        if not path.startswith("/v1/"):
            await self.app(scope, receive, sending)
            return
        route = self.posts.get(path) if scope.get("method") == "POST" else None
        try:
            await (route or self.app)(scope, receive, sending)
        finally:
            self.metrics.requests.labels(label, str(status["code"])).inc()


CLOSE = {"Connection": "close"}


def host_name(value: bytes) -> str:
    """The host of a Host header, lower-case, without its port ("[::1]:8000" -> "[::1]")."""
    text = value.decode("latin-1").strip().lower()
    if text.startswith("["):
        return text.split("]", 1)[0] + "]"
    return text.rsplit(":", 1)[0] if text.count(":") == 1 else text
