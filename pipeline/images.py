"""The builtin test images (recipes name them `builtin:NAME`): drawn here, pixel by pixel, so a vision-language recipe
needs no download and no licence beyond this repository's; written as PNG byte for byte the same everywhere (the
image data stored uncompressed: zlib's compressed output differs between zlib builds, and a kit records the hash of
every file it carries).

Each is a plain scene a vision-language model can be asked about ("what shape is this, what colour?"): a coloured
shape or pattern on a light background, at a size that is not a multiple of any tower's patch, so the processor's
resize is exercised. Standard library only: the device half (Python 3.10, no numpy) reads these names too.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

Pixel = tuple[int, int, int]
BACKGROUND: Pixel = (245, 245, 240)


@dataclass(frozen=True)
class BuiltinImage:
    name: str
    width: int
    height: int
    what: str                               # what it shows, as a caption would say it
    draw: Callable[[int, int, int, int], Pixel]   # (x, y, width, height) -> RGB

    def pixels(self) -> list[list[Pixel]]:
        return [[self.draw(x, y, self.width, self.height) for x in range(self.width)] for y in range(self.height)]

    def png(self) -> bytes:
        return png_bytes(self.pixels())


def _disk(colour: Pixel) -> Callable[[int, int, int, int], Pixel]:
    def draw(x: int, y: int, w: int, h: int) -> Pixel:
        r = min(w, h) * 0.35
        return colour if (x - w / 2 + 0.5) ** 2 + (y - h / 2 + 0.5) ** 2 <= r * r else BACKGROUND
    return draw


def _square(colour: Pixel) -> Callable[[int, int, int, int], Pixel]:
    def draw(x: int, y: int, w: int, h: int) -> Pixel:
        half = min(w, h) * 0.3
        return colour if abs(x - w / 2 + 0.5) <= half and abs(y - h / 2 + 0.5) <= half else BACKGROUND
    return draw


def _triangle(colour: Pixel) -> Callable[[int, int, int, int], Pixel]:
    def draw(x: int, y: int, w: int, h: int) -> Pixel:
        top, bottom = h * 0.2, h * 0.8
        if not top <= y <= bottom:
            return BACKGROUND
        half = (y - top) / (bottom - top) * w * 0.35
        return colour if abs(x - w / 2 + 0.5) <= half else BACKGROUND
    return draw


def _stripes(_x: int, y: int, _w: int, h: int) -> Pixel:
    return ((220, 40, 40), (245, 245, 240), (40, 80, 200))[min(2, y * 3 // h)]


def _checkerboard(x: int, y: int, w: int, h: int) -> Pixel:
    cell = max(1, min(w, h) // 8)
    return (20, 20, 20) if (x // cell + y // cell) % 2 else (235, 235, 235)


BUILTIN_IMAGES: dict[str, BuiltinImage] = {i.name: i for i in (
    BuiltinImage("red-circle", 150, 130, "a red circle on a white background", _disk((210, 30, 30))),
    BuiltinImage("blue-square", 140, 150, "a blue square on a white background", _square((30, 60, 200))),
    BuiltinImage("green-triangle", 170, 120, "a green triangle on a white background", _triangle((30, 160, 60))),
    BuiltinImage("flag-stripes", 180, 110, "three horizontal stripes: red, white and blue", _stripes),
    BuiltinImage("checkerboard", 128, 128, "a black and white checkerboard", _checkerboard),
)}


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_bytes(rows: list[list[Pixel]]) -> bytes:
    """An 8-bit RGB PNG of `rows`, its image data in stored (uncompressed) deflate blocks: the same bytes from any
    zlib."""
    height, width = len(rows), len(rows[0])
    raw = b"".join(b"\x00" + bytes(c for px in row for c in px) for row in rows)     # filter 0 on every row
    blocks, pos = [], 0
    while True:
        part = raw[pos:pos + 65535]
        pos += len(part)
        last = pos >= len(raw)
        blocks.append(struct.pack("<BHH", 1 if last else 0, len(part), len(part) ^ 0xFFFF) + part)
        if last:
            break
    stream = b"\x78\x01" + b"".join(blocks) + struct.pack(">I", zlib.adler32(raw) & 0xFFFFFFFF)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", stream) + _chunk(b"IEND", b"")


# ------------------------------------------------------------------------------------------------ reading images
# An image from a recipe, a kit or an HTTP request: bounded before it is decoded (a PNG of a few KB can claim
# 100,000 x 100,000 pixels), of a format named by its magic bytes, decoded whole (a truncated file is an error, not
# a grey band), as RGB. Pillow is needed here only (the workstation has it; the server's extra brings it).
MAX_IMAGE_BYTES = 20 * 2**20
MAX_IMAGE_PIXELS = 40_000_000           # a 8K x 5K photo; the processors resize far below this anyway
MAGIC = {b"\x89PNG\r\n\x1a\n": "PNG", b"\xff\xd8\xff": "JPEG", b"RIFF": "WEBP"}


class ImageError(ValueError):
    """An image that cannot be used, with the reason (the caller names where it came from)."""


def image_format(data: bytes) -> str:
    for magic, name in MAGIC.items():
        if data.startswith(magic) and (name != "WEBP" or data[8:12] == b"WEBP"):
            return name
    raise ImageError("is not a PNG, JPEG or WebP image (its first bytes say otherwise)")


def image_size(data: bytes) -> tuple[int, int]:
    """(width, height) as the image's header states them, nothing decoded; ImageError if it has no readable header.
    A request's images are held to a pixel budget by these before any is decoded (serve/images.py)."""
    import io
    import warnings

    from PIL import Image

    fmt = image_format(data)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)     # the size is the caller's to judge
            with Image.open(io.BytesIO(data), formats=[fmt]) as im:
                return im.size
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise ImageError(f"cannot be decoded as {fmt} ({type(exc).__name__}: {str(exc)[:120]})") from None


def open_image(data: bytes, max_bytes: int = MAX_IMAGE_BYTES, max_pixels: int = MAX_IMAGE_PIXELS):
    """The image in `data` as an RGB PIL image, or ImageError saying why not."""
    import io
    import warnings

    from PIL import Image

    if len(data) > max_bytes:
        raise ImageError(f"is {len(data)} bytes, more than {max_bytes}")
    fmt = image_format(data)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data), formats=[fmt])
            width, height = im.size
            if width < 1 or height < 1 or width * height > max_pixels:
                raise ImageError(f"is {width} x {height} pixels; at most {max_pixels} pixels are taken")
            im.load()
    except ImageError:
        raise
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageError(f"cannot be decoded as {fmt} ({type(exc).__name__}: {str(exc)[:120]})") from None
    return im.convert("RGB")
