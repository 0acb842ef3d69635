"""A chat longer than the engine takes, made to fit: the system messages kept, the oldest whole turns dropped.

A chat UI sends the whole history with every message (Open WebUI does); past `max_input_len` tokens the engine cannot
take it at all. As llama.cpp's server and Ollama do with their context window, the oldest turns go first, whole: a
turn is a user message and everything after it up to the next user message (the assistant's answer, its tool calls,
their results), so what remains still alternates as the chat template expects. The newest turn always stays; if it
alone does not fit, its longest message is cut in the middle (`cut_middle`: head and tail kept, as llama.cpp's server
keeps the start and the end of an over-long prompt), unless the server runs with --no-truncate (then a 400). The
caller says how many messages were dropped and how many tokens were cut (response headers and metrics), never
silently.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

S = TypeVar("S", str, list[int])     # what `middle` cuts: text, or token ids
Render = Callable[[list[dict[str, Any]]], tuple[str, list[int]]]


def turns(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """(the leading system messages, the rest split into turns, each starting at a user message where it can)."""
    head = 0
    while head < len(messages) and messages[head].get("role") == "system":
        head += 1
    out: list[list[dict[str, Any]]] = []
    for m in messages[head:]:
        if not out or m.get("role") == "user":
            out.append([m])
        else:
            out[-1].append(m)
    return messages[:head], out


def fit(messages: list[dict[str, Any]], render: Render, max_tokens: int) -> tuple[str, list[int], int]:
    """(text, ids, messages dropped) of the longest suffix of whole turns that renders to at most `max_tokens`
    ids, the system messages always kept; the full chat when it fits. Binary search over the turns dropped: a few
    renders, not one per turn. When not even the newest turn fits, its render is returned (the caller refuses it)."""
    text, ids = render(messages)
    if len(ids) <= max_tokens:
        return text, ids, 0
    system, parts = turns(messages)

    def kept(drop: int) -> list[dict[str, Any]]:
        return system + [m for t in parts[drop:] for m in t]

    lo, hi = 1, len(parts) - 1          # drop at least one turn, keep at least the newest
    best: tuple[str, list[int], int] | None = None
    while lo <= hi:
        mid = (lo + hi) // 2
        t, i = render(kept(mid))
        if len(i) <= max_tokens:
            best, hi = (t, i, mid), mid - 1
        else:
            lo = mid + 1
    if best is None:
        t, i = render(kept(len(parts) - 1))
        return t, i, len(messages) - len(kept(len(parts) - 1))
    t, i, drop = best
    return t, i, len(messages) - len(kept(drop))


Codec = tuple[Callable[[str], list[int]], Callable[[list[int]], str]]     # (encode without specials, decode)
ELLIPSIS = "\n[...]\n"


def middle(ids: S, remove: int) -> tuple[S, S]:
    """(head, tail) of `ids` (token ids, or text) without `remove` of its items from its middle."""
    keep = max(0, len(ids) - remove)
    head = (keep + 1) // 2
    return ids[:head], ids[len(ids) - (keep - head):len(ids)]


def cut_middle(messages: list[dict[str, Any]], render: Render, max_tokens: int,
               codec: Codec) -> tuple[str, list[int], int]:
    """(text, ids, tokens cut) of the chat with its longest text message cut in the middle until it renders to at
    most `max_tokens` ids (a few rounds: a template may render the cut text to a few more or fewer tokens). Where no
    message has enough text left to cut, the last render is returned (the caller refuses it)."""
    encode, decode = codec
    text, ids = render(messages)
    cut = 0
    for _ in range(4):
        over = len(ids) - max_tokens
        if over <= 0:
            break
        texts = [(len(m["content"]), i) for i, m in enumerate(messages) if isinstance(m.get("content"), str)]
        if not texts:
            break
        _, at = max(texts)
        tokens = encode(messages[at]["content"])
        remove = min(over + 8 + over // 50, len(tokens))      # a margin for the ellipsis and the re-tokenizing
        if remove <= 0:
            break
        head, tail = middle(tokens, remove)
        messages = [*messages[:at], {**messages[at], "content": decode(head) + ELLIPSIS + decode(tail)},
                    *messages[at + 1:]]
        cut += len(tokens) - len(head) - len(tail)
        text, ids = render(messages)
    return text, ids, cut


def _chars(m: dict[str, Any]) -> int:
    c = m.get("content")
    return len(c) if isinstance(c, str) else sum(len(p.get("text", "")) for p in c) if isinstance(c, list) else 0


def cut_text(text: str, remove: int) -> str:
    """`text` without `remove` characters from its middle (the ellipsis marks where)."""
    head, tail = middle(text, remove)
    return head + ELLIPSIS + tail


def shrink_chars(messages: list[dict[str, Any]], bound: int) -> tuple[list[dict[str, Any]], int, int]:
    """(messages, messages dropped, characters cut) of a chat brought to at most `bound` characters of text before
    it is tokenized (the tokenizer's work is bounded by characters): its oldest whole turns dropped first, as `fit`
    drops them, then its longest messages cut in the middle."""
    total = sum(_chars(m) for m in messages)
    if total <= bound:
        return messages, 0, 0
    system, parts = turns(messages)
    dropped = 0
    while len(parts) > 1 and total > bound:
        turn = parts.pop(0)
        dropped += len(turn)
        total -= sum(_chars(m) for m in turn)
    kept, cut = system + [m for t in parts for m in t], 0
    while total > bound:
        sizes = [(len(m["content"]), i) for i, m in enumerate(kept) if isinstance(m.get("content"), str)]
        size, at = max(sizes, default=(0, -1))
        if size <= len(ELLIPSIS):
            break           # nothing left to cut (the text is in image-bearing parts): the caller refuses it
        remove = min(total - bound + len(ELLIPSIS), size)
        kept[at] = {**kept[at], "content": cut_text(kept[at]["content"], remove)}
        after = len(kept[at]["content"])
        cut += size - after + len(ELLIPSIS)
        total -= size - after
    return kept, dropped, cut
