"""The Gate (serve/gate.py) as the outermost ASGI app: a POST to a generation route is handed to its direct
handler, past FastAPI; any other method or path goes on to the app; a refused request reaches neither; the
request counter counts both."""

from __future__ import annotations

import asyncio

from pipeline.serve.gate import Gate
from pipeline.serve.metrics import Metrics


def _call(gate: Gate, method: str, path: str, headers: list[tuple[bytes, bytes]]) -> list[dict]:
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        sent.append(message)
    scope = {"type": "http", "method": method, "path": path, "headers": headers}
    asyncio.run(gate(scope, receive, send))
    return sent


def test_a_generation_post_goes_to_its_handler_and_everything_else_to_the_app():
    reached: list[str] = []

    def answering(who: str, status: int):
        async def asgi(scope, receive, send):
            reached.append(f"{who} {scope['method']} {scope['path']}")
            await send({"type": "http.response.start", "status": status, "headers": []})
            await send({"type": "http.response.body", "body": b""})
        return asgi
    metrics = Metrics()
    gate = Gate(answering("app", 405), api_key="k", metrics=metrics,
                posts={"/v1/completions": answering("direct", 200)})
    json_key = [(b"content-type", b"application/json"), (b"authorization", b"Bearer k")]
    assert _call(gate, "POST", "/v1/completions", json_key)[0]["status"] == 200
    assert _call(gate, "GET", "/v1/completions", [(b"authorization", b"Bearer k")])[0]["status"] == 405
    assert _call(gate, "POST", "/v1/chat/completions", json_key)[0]["status"] == 405
    # no key: refused by the Gate before either handler runs
    assert _call(gate, "POST", "/v1/completions", json_key[:1])[0]["status"] == 401
    assert reached == ["direct POST /v1/completions", "app GET /v1/completions", "app POST /v1/chat/completions"]
    text = metrics.text().decode()
    assert 'jetson_llm_requests_total{endpoint="/v1/completions",status="200"} 1.0' in text
    assert 'jetson_llm_requests_total{endpoint="/v1/completions",status="401"} 1.0' in text
    assert 'jetson_llm_requests_total{endpoint="/v1/completions",status="405"} 1.0' in text
