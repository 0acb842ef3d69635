"""Images in chat requests: `image_url` parts read, checked and counted before any engine work.

An image arrives as a `data:` URL (what the openai client and Open WebUI send: base64 PNG, JPEG or WebP). A remote
`http(s)` URL is fetched only from a host `--allow-image-urls` names: boards often run offline, and a server that
fetches any URL it is handed is a way into the network it sits on. Every image is bounded before it is decoded
(bytes, then pixels: pipeline.images.open_image refuses bombs, truncated files and wrong magic bytes), and every
refusal is a 400 naming the part.

The language model sees each image as its placeholder token repeated once per image token. The count is the
family's token math (families/visual.py) on the image's size, with the processor's own bounds from the model's
preprocessor_config.json held to the engine's profile (max_image_tokens_per_image), exactly as the goldens' processor
was held (workstation/image_prompts.held_processor): so the server's token accounting (max_input_len, usage) is
what the engine will see, and the reference session checks it against the processor's own count on every image.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pipeline.contract import VisualLimits
from pipeline.families.audio import wrapped
from pipeline.families.visual import PatchMerger, VisualTower, held
from pipeline.images import MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS, ImageError, image_size, open_image
from pipeline.serve.errors import ApiError
from pipeline.serve.protocol import ImagePart

DATA_URL = re.compile(r"data:image/(png|jpeg|jpg|webp);base64,", re.IGNORECASE)
FETCH_TIMEOUT_S = 10.0      # connecting, and each read
FETCH_DEADLINE_S = 20.0     # the whole fetch: a host that trickles a byte a second is cut off here
# pixels decoded per request, all its images together: decoding is the CPU work a client can ask of the server before
# any admission by tokens (16 images at the per-image bound took seconds of every core from the other clients); this
# holds a request to the cost of one largest image
MAX_REQUEST_PIXELS = MAX_IMAGE_PIXELS
PROCESSOR_CONFIG = "preprocessor_config.json"
PROCESSOR_CONFIG_MAX = 64 * 1024


@dataclass(frozen=True)
class RequestImage:
    """An image read and checked: its bytes as sent, its size, and the tokens it takes in the sequence."""
    data: bytes
    width: int
    height: int
    tokens: int


@dataclass(frozen=True)
class ImageSide:
    """What a served vision-language model takes: the tower's token math held to the engine's image profile, the
    placeholder token its chat template places once per image, and where remote images may come from."""
    tower: VisualTower
    placeholder: str
    placeholder_id: int
    limits: VisualLimits
    allow_hosts: frozenset[str] = frozenset()
    noun: str = "image"
    part: str = "image_url"

    def tokens(self, width: int, height: int) -> int:
        return self.tower.image_tokens(height, width)


def with_processor_config(tower: VisualTower, cfg: dict[str, Any]) -> VisualTower:
    """The tower's bounds as the checkpoint's own processor sets them (preprocessor_config.json): Qwen's
    size.shortest_edge / longest_edge (pixel counts, transformers 5) or min_pixels / max_pixels; InternVL's
    min_patches / max_patches and crop_to_patches (the thumbnail)."""
    def count(*keys: tuple[str, ...]) -> int | None:
        for path in keys:
            v: Any = cfg
            for k in path:
                v = v.get(k) if isinstance(v, dict) else None
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
        return None
    if isinstance(tower, PatchMerger):
        lo = count(("size", "shortest_edge"), ("min_pixels",))
        hi = count(("size", "longest_edge"), ("max_pixels",))
        return replace(tower, min_pixels=lo or tower.min_pixels, max_pixels=hi or tower.max_pixels)
    lo, hi = count(("min_patches",)), count(("max_patches",))
    return replace(tower, min_tiles=lo or tower.min_tiles, max_tiles=hi or tower.max_tiles)


def image_side_of(plan, tokenizer_dir: Path, tokenizer) -> ImageSide | None:
    """The image side of a served model: its family's tower's token arithmetic at the plan's image profile (None where
    the plan has no visual engine)."""
    from pipeline.families import family
    fam = family(plan.model.architecture)
    if plan.visual is None or fam is None or fam.visual is None:
        return None
    return image_side(tokenizer_dir, fam.visual.tokens, plan.visual.limits,
                      tokenizer.get_vocab(with_added_tokens=True))


def image_side(tokenizer_dir: Path, tower: VisualTower, limits: VisualLimits, vocab: dict[str, int],
               allow_hosts: frozenset[str] = frozenset()) -> ImageSide:
    """The image side of a served model whose processor config sits in tokenizer_dir (the kit carries it beside the
    tokenizer; the workstation reads the fetched checkpoint)."""
    from pipeline.errors import PipelineError
    from pipeline.files import read_regular
    path = Path(tokenizer_dir) / PROCESSOR_CONFIG
    try:
        cfg = json.loads(read_regular(path, PROCESSOR_CONFIG_MAX)) if path.is_file() else {}
    except (PipelineError, ValueError, UnicodeDecodeError, RecursionError):
        raise PipelineError(f"{path}: not a readable processor config", "rebuild the kit") from None
    if tower.placeholder not in vocab:
        raise PipelineError(f"{tokenizer_dir}: the tokenizer has no {tower.placeholder} token, which the model's "
                            "chat template places for an image", "serve the vision-language model's own tokenizer")
    return ImageSide(held(with_processor_config(tower, cfg if isinstance(cfg, dict) else {}),
                          limits.max_image_tokens_per_image),
                     tower.placeholder, vocab[tower.placeholder], limits, allow_hosts)


def image_bytes(part: ImagePart, allow_hosts: frozenset[str]) -> bytes:
    """The bytes a part's URL holds: a data URL decoded (its length bounded first), or a remote image fetched from an
    allowed host; an ApiError naming the part otherwise."""
    url = part.url
    m = DATA_URL.match(url)
    if m:
        if len(url) - m.end() > (MAX_IMAGE_BYTES + 2) // 3 * 4:
            raise _bad(part, f"holds more than {MAX_IMAGE_BYTES} bytes", "image_too_large")
        try:
            return base64.b64decode(url[m.end():], validate=True)
        except (binascii.Error, ValueError):
            raise _bad(part, "is not valid base64 after 'data:image/...;base64,'") from None
    if url.startswith("data:"):
        raise _bad(part, "is a data URL of another kind: send data:image/png, image/jpeg or image/webp;base64,...")
    if url.lower().startswith(("http://", "https://")):
        return _fetch(part, allow_hosts)
    raise _bad(part, "must be a data:image/...;base64 URL (or an http(s) URL of a host --allow-image-urls names)")


def read_images(parts: tuple[ImagePart, ...] | list[ImagePart], side: ImageSide) -> list[RequestImage]:
    """A request's images read in order, each held by its header to what is left of the request's pixel budget
    before it is decoded (a 400 naming the part that passes it)."""
    out: list[RequestImage] = []
    for part in parts:
        out.append(read_image(part, side, MAX_REQUEST_PIXELS - sum(i.width * i.height for i in out)))
    return out


def read_image(part: ImagePart, side: ImageSide, budget: int = MAX_REQUEST_PIXELS) -> RequestImage:
    """The part's image read, checked (bounded before decoding: its bytes, its pixels, the request's pixel budget
    left) and counted in the engine's tokens."""
    data = image_bytes(part, side.allow_hosts)
    try:
        width, height = image_size(data)
        if width * height > budget and width * height <= MAX_IMAGE_PIXELS:
            raise _bad(part, f"is {width} x {height} pixels, and {MAX_REQUEST_PIXELS - budget} were decoded for the "
                       f"request's images before it: at most {MAX_REQUEST_PIXELS} pixels are decoded per request "
                       "(send fewer or smaller images)", "image_too_large")
        width, height = open_image(data).size
        tokens = side.tokens(width, height)
    except ImageError as exc:
        raise _bad(part, str(exc), "invalid_image") from None
    except ValueError as exc:       # the token math: an aspect ratio no processor takes
        raise _bad(part, str(exc), "invalid_image") from None
    return RequestImage(data, width, height, tokens)


def expand(ids: list[int], side: Any, images: list[Any]) -> list[int]:
    """The rendered ids with the i-th placeholder repeated images[i].tokens times (as the processor does). The chat
    template places one placeholder per image part; a chat cut to fit keeps the newest images, so the placeholders
    left are the last ones. The same for a speech model's recordings (`side` a recordings.AudioSide, `images` its
    RequestRecordings: a side names its placeholder, its noun and the part that brings one)."""
    at = [i for i, t in enumerate(ids) if t == side.placeholder_id]
    if len(at) > len(images):
        raise ApiError(400, f"the prompt holds {len(at)} {side.placeholder} tokens for {len(images)} {side.noun}s: "
                       f"send {side.noun}s as {side.part} parts, not as their placeholder text", "messages",
                       "invalid_value")
    kept = images[len(images) - len(at):]
    wrap = getattr(side, "wrap_ids", None)     # what the runtime puts around a recording's tokens (Gemma 4's)
    out: list[int] = []
    last = 0
    for pos, image in zip(at, kept, strict=True):
        out += ids[last:pos] + wrapped(ids, pos, image.tokens, wrap)
        last = pos + 1
    return out + ids[last:]


def check_profile(side: ImageSide, images: list[RequestImage]) -> None:
    """The request's images within the visual engine's profile (visual_build's --maxImageTokens for all images of a
    request); each image alone is held to the per-image maximum by its resize."""
    total = sum(i.tokens for i in images)
    if total > side.limits.max_image_tokens:
        raise ApiError(400, f"the request's {len(images)} images take {total} image tokens; the visual engine takes "
                       f"at most max_image_tokens = {side.limits.max_image_tokens} per request", "messages",
                       "context_length_exceeded")


def _bad(part: ImagePart, why: str, code: str = "invalid_image_url") -> ApiError:
    return ApiError(400, f"{part.param}: the image {why}", part.param, code)


def _read_by(r: Any, conn: Any, deadline: float, part: ImagePart) -> bytes:
    """The body, at most MAX_IMAGE_BYTES + 1 bytes, read by the deadline (each read waits at most what is left)."""
    data = bytearray()
    while len(data) <= MAX_IMAGE_BYTES:
        left = deadline - time.monotonic()
        late = _bad(part, f"was not fetched within {FETCH_DEADLINE_S:g} s ({len(data)} bytes came)",
                    "image_fetch_timeout")
        if left <= 0:
            raise late
        if conn.sock is not None:
            conn.sock.settimeout(min(FETCH_TIMEOUT_S, left))
        try:
            chunk = r.read1(min(65536, MAX_IMAGE_BYTES + 1 - len(data)))
        except TimeoutError:
            if left < FETCH_TIMEOUT_S:      # the read waited for what was left of the deadline
                raise late from None
            raise
        if not chunk:
            break
        data += chunk
    return bytes(data)


def _fetch(part: ImagePart, allow_hosts: frozenset[str]) -> bytes:
    """A remote image from an allowed host: one GET, no redirect followed (it could leave the allowed host), its
    size and time bounded."""
    import http.client
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(part.url)
        host, port = (parts.hostname or "").lower(), parts.port
    except ValueError:      # a malformed IPv6 host, a port out of range
        raise _bad(part, "URL is not a valid http(s) URL") from None
    if host not in allow_hosts:
        allowed = f"only from {', '.join(sorted(allow_hosts))}" if allow_hosts else "off"
        raise ApiError(400, f"{part.param}: remote image URLs are refused (host {host[:80]!r}; fetching is {allowed})",
                       part.param, "image_url_not_allowed")
    cls = http.client.HTTPSConnection if parts.scheme.lower() == "https" else http.client.HTTPConnection
    deadline = time.monotonic() + FETCH_DEADLINE_S
    try:
        conn = cls(host, port, timeout=FETCH_TIMEOUT_S)
        try:
            conn.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
                         headers={"Accept": "image/png, image/jpeg, image/webp"})
            r = conn.getresponse()
            if r.status != 200:
                raise _bad(part, f"could not be fetched: HTTP {r.status} (redirects are not followed)")
            declared = r.getheader("Content-Length")
            if declared and declared.isdigit() and int(declared) > MAX_IMAGE_BYTES:
                raise _bad(part, f"is {declared} bytes, more than {MAX_IMAGE_BYTES}", "image_too_large")
            data = _read_by(r, conn, deadline, part)
        finally:
            conn.close()
    except (OSError, http.client.HTTPException) as exc:
        raise _bad(part, f"could not be fetched ({type(exc).__name__}: {str(exc)[:120]})") from None
    if len(data) > MAX_IMAGE_BYTES:
        raise _bad(part, f"is more than {MAX_IMAGE_BYTES} bytes", "image_too_large")
    return data
