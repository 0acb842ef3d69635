"""A board's health gate after the swap, measured from the controller through the board's own HTTP endpoint (what its
clients see, not only the engine's session): the served model comes up within a time limit, answers the kit's
goldens as they say, stays up through a stability window, and its memory stays inside the plan. Every read has a
time limit; a board that stops answering fails the step it was in.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from pipeline import backends, contract
from pipeline.fleet.release import Release

REQUEST_S = 30.0
POLL_S = 0.5
MEMORY_TOLERANCE = 0.2      # as the device report's memory checks


@dataclass(frozen=True)
class GateLimits:
    start_s: float = 120.0      # the served model up (GET /health 200) within this
    stable_s: float = 30.0      # ... and staying up this long after its goldens
    api_key: str | None = None


@dataclass(frozen=True)
class Verdict:
    failure: str | None         # phases.FAILURES, or None: passed
    reason: str
    figures: dict


def _request(url: str, key: str | None, body: dict | None = None, timeout: float = REQUEST_S,
             limit: int = 1 << 20) -> tuple[int, bytes]:
    """(HTTP status, at most `limit` bytes of the body) of a GET, or of a POST of `body` as JSON; (0, b"") where
    nothing answered within `timeout`."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = None
    if body is not None:
        data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
    req = urllib.request.Request(url, data=data, headers=headers, method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read(limit)
    except urllib.error.HTTPError as e:
        return e.code, e.read(limit)
    except (OSError, ValueError):
        return 0, b""


def _get(url: str, key: str | None, timeout: float = REQUEST_S) -> tuple[int, bytes]:
    return _request(url, key, timeout=timeout)


def _post(url: str, body: dict, key: str | None) -> tuple[int, dict]:
    """(status, the JSON answer) of a POST; an answer that is not JSON counts as no answer."""
    status, raw = _request(url, key, body, limit=1 << 22)
    if status != 200:
        return status, {}
    try:
        return status, json.loads(raw)
    except ValueError:
        return 0, {}


def up_within(base: str, limits: GateLimits) -> float | None:
    """Seconds until GET /health answered 200, or None past the limit."""
    start = time.monotonic()
    while time.monotonic() - start < limits.start_s:
        if _get(base + "/health", None, timeout=min(REQUEST_S, limits.start_s))[0] == 200:
            return round(time.monotonic() - start, 2)
        time.sleep(POLL_S)
    return None


def goldens_agreement(base: str, goldens: contract.Goldens, model: str, key: str | None) -> tuple[float, str]:
    """The worst prompt's agreement (backends.agreement, on the text) of the served answers with the goldens, each
    asked as its clients ask: a chat (or a completion where the goldens were raw), greedy, as long as the golden."""
    worst, said = 1.0, ""
    for g in goldens.prompts:
        if goldens.chat_template:
            status, body = _post(base + "/v1/chat/completions", {
                "model": model, "temperature": 0, "max_tokens": len(g.output_ids),
                "messages": [{"role": "user", "content": g.prompt}]}, key)
            choice = (body.get("choices") or [{}])[0] if status == 200 else {}
            text = (choice.get("message") or {}).get("content") if isinstance(choice, dict) else None
        else:
            status, body = _post(base + "/v1/completions", {"model": model, "temperature": 0,
                                                             "max_tokens": len(g.output_ids), "prompt": g.prompt},
                                 key)
            choice = (body.get("choices") or [{}])[0] if status == 200 else {}
            text = choice.get("text") if isinstance(choice, dict) else None
        if status != 200 or not isinstance(text, str):
            return 0.0, f"{g.prompt[:40]!r} was not answered (HTTP {status})"
        score, _ = backends.agreement(g, contract.PromptResult(prompt=g.prompt, output_text=text), "text")
        if score < worst:
            worst, said = score, f"{g.prompt[:40]!r}: {text[:60]!r} where the goldens say {g.text[:60]!r}"
    return worst, said


def stays_up(base: str, limits: GateLimits) -> str | None:
    """None if GET /health answered 200 throughout the stability window, else what it answered."""
    end = time.monotonic() + limits.stable_s
    while time.monotonic() < end:
        status, _ = _get(base + "/health", None, timeout=min(REQUEST_S, limits.stable_s))
        if status != 200:
            return f"GET /health answered {status or 'nothing'} during the {limits.stable_s:g} s stability window"
        time.sleep(POLL_S)
    return None


def gate(base: str, release: Release, limits: GateLimits, memory_taken) -> Verdict:
    """The board's verdict: start, each model's goldens, stability, then memory (`memory_taken()`: bytes the served
    models took from the board, None where it could not be measured; a set's is held to the sum of its plans)."""
    figures: dict = {}
    up = up_within(base, limits)
    if up is None:
        return Verdict("start", f"the served model was not up within {limits.start_s:g} s (GET {base}/health)",
                       figures)
    figures["up_s"] = up
    worst = 1.0
    for b in release.bundles:
        agreement, said = goldens_agreement(base, b.goldens, b.model, limits.api_key)
        worst = min(worst, agreement)
        if len(release.bundles) > 1:
            figures.setdefault("agreement_by_model", {})[b.model] = round(agreement, 4)
        figures["agreement"] = round(worst, 4)
        if agreement < b.goldens.min_token_agreement:
            of = f" of {b.model}" if len(release.bundles) > 1 else ""
            return Verdict("goldens", f"agreement{of} with the goldens {agreement:.2%} < "
                           f"{b.goldens.min_token_agreement:.0%} through {base}/v1 ({said})", figures)
    down = stays_up(base, limits)
    if down:
        return Verdict("stability", down, figures)
    figures["stable_s"] = limits.stable_s
    taken = memory_taken()
    planned = release.planned_memory
    figures["memory_taken"], figures["memory_planned"] = taken, planned
    if planned and taken is not None and taken > planned * (1 + MEMORY_TOLERANCE):
        what = "the served model" if len(release.bundles) == 1 else "the served set"
        return Verdict("memory", f"{what} took {taken / 1e9:.2f} GB of the board's memory, more than the "
                       f"plan's {planned / 1e9:.2f} GB (+{MEMORY_TOLERANCE:.0%})", figures)
    memory = (f"memory {taken / 1e9:.2f} GB of {planned / 1e9:.2f} planned" if taken is not None and planned else
              "memory not measured (the board's `probe --json` gave no MemAvailable)" if taken is None else
              "memory not planned")
    return Verdict(None, f"up in {up} s, goldens {agreement:.0%}, stable {limits.stable_s:g} s, {memory}", figures)
