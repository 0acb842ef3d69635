"""multipart/form-data (RFC 7578), the body of OpenAI's file uploads (/v1/audio/transcriptions): one exact reader over
a body already read and bounded (reply.raw_body), itself bounded in parts, header bytes and field sizes, and strict:
anything that is not a well-formed form is a 400 naming what is wrong, never a guess.

    --BOUNDARY CRLF (header CRLF)* CRLF data CRLF --BOUNDARY ... CRLF --BOUNDARY-- [CRLF epilogue]

Each part names itself in Content-Disposition: form-data; name="..."[; filename="..."]. A name may repeat (OpenAI's
array fields, `timestamp_granularities[]`): every value is kept, in order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pipeline.serve.errors import ApiError

MAX_PARTS = 16
MAX_HEADER_BYTES = 4096         # one part's header block
MAX_FIELD_BYTES = 64 * 1024     # a part without a filename (a text field)
_PARAM = re.compile(r';\s*([A-Za-z0-9_*-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;\s]*)')


@dataclass(frozen=True)
class Part:
    name: str
    data: bytes
    filename: str | None = None
    content_type: str | None = None

    def text(self) -> str:
        try:
            return self.data.decode("utf-8")
        except UnicodeDecodeError:
            raise bad(f"the form field {self.name!r} is not UTF-8 text", self.name) from None


def bad(why: str, param: str | None = None) -> ApiError:
    return ApiError(400, why, param, "invalid_form")


def params(header: str) -> tuple[str, dict[str, str]]:
    """A header's value and its `; key=value` parameters (quoted values unquoted)."""
    value = header.split(";", 1)[0].strip().lower()
    out = {}
    for key, raw in _PARAM.findall(header[len(header.split(";", 1)[0]):]):
        out[key.lower()] = re.sub(r"\\(.)", r"\1", raw[1:-1]) if raw.startswith('"') else raw
    return value, out


def parse(body: bytes, content_type: str | None) -> dict[str, list[Part]]:
    """The form's parts by name, in order."""
    kind, p = params(content_type or "")
    if kind != "multipart/form-data":
        raise bad(f"the body must be multipart/form-data (it is {kind or 'not declared'})")
    boundary = p.get("boundary", "")
    if not 1 <= len(boundary) <= 70:
        raise bad("multipart/form-data without a boundary (1 to 70 characters)")
    delimiter = b"--" + boundary.encode("latin-1", "replace")
    if not body.startswith(delimiter + b"\r\n"):
        raise bad("the form does not begin with its boundary")
    out: dict[str, list[Part]] = {}
    at, count = len(delimiter) + 2, 0
    separator = b"\r\n" + delimiter
    while True:
        end = body.find(separator, at)
        if end < 0:
            raise bad("the form ends before its closing boundary (truncated?)")
        part = _part(body[at:end])
        count += 1
        if count > MAX_PARTS:
            raise bad(f"the form has more than {MAX_PARTS} parts")
        out.setdefault(part.name, []).append(part)
        rest = body[end + len(separator):end + len(separator) + 2]
        if rest == b"--":
            return out
        if rest != b"\r\n":
            raise bad("a boundary in the form is not followed by CRLF or --")
        at = end + len(separator) + 2


def _part(raw: bytes) -> Part:
    head_end = raw.find(b"\r\n\r\n")
    if head_end < 0 or head_end > MAX_HEADER_BYTES:
        raise bad("a form part has no header block ending in an empty line (or one past 4096 bytes)")
    headers: dict[str, str] = {}
    for line in raw[:head_end].split(b"\r\n"):
        name, colon, value = line.decode("latin-1").partition(":")
        if not colon:
            raise bad(f"a form part's header line {line[:40]!r} has no colon")
        headers[name.strip().lower()] = value.strip()
    disposition, p = params(headers.get("content-disposition", ""))
    if disposition != "form-data" or not p.get("name"):
        raise bad("a form part has no Content-Disposition: form-data; name=...")
    data = raw[head_end + 4:]
    filename = p.get("filename")
    if filename is None and len(data) > MAX_FIELD_BYTES:
        raise bad(f"the form field {p['name'][:40]!r} is more than {MAX_FIELD_BYTES} bytes", p["name"][:40])
    return Part(p["name"], data, filename, headers.get("content-type"))
