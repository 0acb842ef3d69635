"""Images in chat requests (serve/images.py, protocol.py): image_url parts parsed into the template's shape, data URLs
and remote URLs read within their bounds, each refusal a 400 naming the part, and the image's tokens counted by the
family's token math held to the engine's profile, as the goldens' processor was held."""

from __future__ import annotations

import base64
import http.server
import threading
import zlib

import pytest

from pipeline.contract import VisualLimits
from pipeline.families.visual import INTERNVL3, QWEN2_5_VL, QWEN3_VL, PatchMerger, Tiles
from pipeline.images import BUILTIN_IMAGES, MAX_IMAGE_BYTES
from pipeline.serve import images
from pipeline.serve.errors import ApiError
from pipeline.serve.images import (
    ImageSide,
    RequestImage,
    check_profile,
    expand,
    held,
    image_bytes,
    read_image,
    read_images,
)
from pipeline.serve.protocol import ImagePart, parse_chat

PNG = BUILTIN_IMAGES["red-circle"].png()
PAD = 9


def data_url(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64," + base64.b64encode(data).decode()


def side(tower=QWEN3_VL, per_image=128, most=256, hosts=frozenset()) -> ImageSide:
    return ImageSide(held(tower, per_image), "<|image_pad|>", PAD, VisualLimits(4, most, per_image), hosts)


def test_image_url_parts_become_the_templates_image_parts_in_order():
    req = parse_chat({"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What is it?"},         # Open WebUI: text, then images
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
        {"role": "assistant", "content": "A circle."},
        {"role": "user", "content": [{"type": "image_url", "image_url": "data:image/jpeg;base64,BBBB"},
                                     {"type": "text", "text": "And this?"}]}]})
    assert req.messages[1]["content"] == [{"type": "text", "text": "What is it?"}, {"type": "image"}]
    assert req.messages[3]["content"] == [{"type": "image"}, {"type": "text", "text": "And this?"}]
    assert [(p.url[-4:], p.param) for p in req.images] == [("AAAA", "messages[1].content[1].image_url"),
                                                            ("BBBB", "messages[3].content[0].image_url")]
    text_only = parse_chat({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                      {"type": "text", "text": "b"}]}]})
    assert text_only.messages[0]["content"] == "ab" and text_only.images == ()


@pytest.mark.parametrize("message, match", [
    ({"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]},
     r"messages\[0\]: only user messages may hold images"),
    ({"role": "user", "content": [{"type": "image_url", "image_url": {"detail": "auto"}}]},
     r"messages\[0\].content\[0\].image_url must be"),
    ({"role": "user", "content": [{"type": "video_url", "video_url": {}}]},
     r"messages\[0\].content\[0\]: only text, image_url and input_audio parts are supported"),
    ({"role": "user", "content": [{"type": "input_audio", "input_audio": {"format": "wav"}}]},
     r"messages\[0\].content\[0\].input_audio must be \{\"data\": \"<base64>\""),
    ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}] * 17},
     r"messages\[0\].content\[16\]: at most 16 images per request"),
])
def test_bad_image_parts_are_a_400_naming_the_part(message, match):
    with pytest.raises(ApiError, match=match) as e:
        parse_chat({"messages": [message]})
    assert e.value.status == 400


def _png_claiming(width: int, height: int) -> bytes:
    """A valid PNG header and one tiny compressed row claiming width x height pixels (a decompression bomb)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")
    ihdr = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


@pytest.mark.parametrize("url, code, match", [
    (data_url(PNG[: len(PNG) // 2]), "invalid_image", r"cannot be decoded as PNG \(OSError: image file is truncated"),
    (data_url(b"GIF89a" + bytes(40), "png"), "invalid_image", r"is not a PNG, JPEG or WebP image"),
    (data_url(_png_claiming(8000, 8000)), "invalid_image", r"is 8000 x 8000 pixels; at most 40000000 pixels"),
    (data_url(_png_claiming(100_000, 100_000)), "invalid_image", r"cannot be decoded as PNG \(DecompressionBombError"),
    ("data:image/png;base64,not base64!", "invalid_image_url", r"is not valid base64"),
    ("data:text/plain;base64,QUFB", "invalid_image_url", r"is a data URL of another kind"),
    ("file:///etc/passwd", "invalid_image_url", r"must be a data:image/...;base64 URL"),
    ("http://169.254.169.254/latest/meta-data", "image_url_not_allowed",
     r"(?#no 'the image')remote image URLs are refused \(host '169.254.169.254'; fetching is off\)"),
    ("data:image/png;base64," + "A" * ((MAX_IMAGE_BYTES + 2) // 3 * 4 + 4), "image_too_large",
     rf"holds more than {MAX_IMAGE_BYTES} bytes"),
])
def test_an_image_that_cannot_be_used_is_a_400_naming_the_part_before_any_decoding_past_its_bounds(url, code, match):
    part = ImagePart(url, "messages[0].content[1].image_url")
    lead = "" if match.startswith("(?#") else "the image "
    with pytest.raises(ApiError, match=r"messages\[0\].content\[1\].image_url: " + lead + match) as e:
        read_image(part, side())
    assert (e.value.status, e.value.code, e.value.param) == (400, code, part.param)


def test_a_good_image_is_read_and_counted_by_the_held_token_math():
    got = read_image(ImagePart(data_url(PNG), "p"), side(per_image=128))
    # 150 x 130 through Qwen3-VL's resize (factor 32, at least 65,536 pixels): 288 x 256 -> 9 x 8 tokens
    assert (got.width, got.height, got.tokens) == (150, 130, 72) and got.data == PNG
    assert read_image(ImagePart(data_url(PNG), "p"), side(per_image=64)).tokens == 72     # the processor's round-up


def test_the_held_token_math_is_the_goldens_held_processor():
    """held() bounds the token math exactly as image_prompts.held_processor bounds the processor."""
    assert held(QWEN3_VL, 100) == PatchMerger(16, 2, 65_536, 100 * 32 * 32)
    assert held(QWEN2_5_VL, 30) == PatchMerger(14, 2, 56 * 56, 30 * 28 * 28)
    assert held(QWEN2_5_VL, 10_000) == QWEN2_5_VL                  # never above the processor's own maximum
    assert held(INTERNVL3, 768) == Tiles(448, 14, 0.5, 1, 2)       # 768 / 256 - 1 tiles, the thumbnail beside them
    assert held(INTERNVL3, 256) == Tiles(448, 14, 0.5, 1, 1)


def test_the_checkpoints_processor_config_sets_the_bounds():
    bounds = images.with_processor_config
    assert bounds(QWEN3_VL, {"size": {"shortest_edge": 3136, "longest_edge": 1_003_520}}) == \
        PatchMerger(16, 2, 3136, 1_003_520)
    assert bounds(QWEN2_5_VL, {"min_pixels": 1000, "max_pixels": 2000}) == PatchMerger(14, 2, 1000, 2000)
    assert bounds(INTERNVL3, {"min_patches": 1, "max_patches": 6}).max_tiles == 6
    assert bounds(QWEN3_VL, {"size": {"longest_edge": "big"}}) == QWEN3_VL     # not a count: ignored


def _image(tokens: int) -> RequestImage:
    return RequestImage(b"", 1, 1, tokens)


def test_placeholders_expand_to_each_images_tokens_and_a_cut_chat_keeps_the_newest_images():
    s = side()
    assert expand([1, PAD, 2, PAD, 3], s, [_image(2), _image(3)]) == [1, PAD, PAD, 2, PAD, PAD, PAD, 3]
    assert expand([1, PAD, 3], s, [_image(2), _image(3)]) == [1, PAD, PAD, PAD, 3]    # the oldest turn was dropped
    with pytest.raises(ApiError, match=r"the prompt holds 2 <\|image_pad\|> tokens for 1 images"):
        expand([PAD, PAD], s, [_image(2)])
    check_profile(s, [_image(128), _image(128)])
    with pytest.raises(ApiError, match=r"the request's 3 images take 257 image tokens; the visual engine takes at "
                                       r"most max_image_tokens = 256 per request"):
        check_profile(s, [_image(128), _image(128), _image(1)])


class _Images(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        if self.path == "/moved.png":
            self.send_response(302)
            self.send_header("Location", "http://169.254.169.254/")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(PNG)))
        self.end_headers()
        self.wfile.write(PNG)

    def log_message(self, *_a):
        pass


def test_remote_images_come_only_from_allowed_hosts_and_redirects_are_not_followed():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert image_bytes(ImagePart(f"{url}/c.png", "p"), frozenset({"127.0.0.1"})) == PNG
        with pytest.raises(ApiError, match=r"p: the image could not be fetched: HTTP 302 \(redirects are not "):
            image_bytes(ImagePart(f"{url}/moved.png", "p"), frozenset({"127.0.0.1"}))
        with pytest.raises(ApiError, match=r"remote image URLs are refused \(host '127.0.0.1'; fetching is only "
                                           r"from kiosk.local\)"):
            image_bytes(ImagePart(f"{url}/c.png", "p"), frozenset({"kiosk.local"}))
        for bad in ("http://127.0.0.1:99999/c.png", "http://[::1/c.png", "https://[fe80::1%25en0]:x/c.png"):
            with pytest.raises(ApiError, match=r"p: the image URL is not a valid http\(s\) URL"):
                image_bytes(ImagePart(bad, "p"), frozenset({"127.0.0.1", "::1"}))
    finally:
        server.shutdown()
        server.server_close()


def test_the_image_placeholder_typed_as_text_is_refused_in_a_raw_prompt():
    """#66: special tokens never come from text; images enter only as image parts (the chat's control-token check is
    test_serve.py's, on a served tokenizer)."""
    from types import SimpleNamespace

    from pipeline.serve.prepare import Preparer, Settings
    from pipeline.serve.protocol import parse_completion
    served = SimpleNamespace(codec=SimpleNamespace(control_pattern=None), images=side(), audio=None)
    prep = Preparer(served, Settings(), lambda: None)
    for prompt in ("Describe <|image_pad|> please", [5, PAD, 6]):
        with pytest.raises(ApiError, match="image placeholder") as err:
            prep.check_control_text(parse_completion({"prompt": prompt}), chat=False)
        assert err.value.param == "prompt"
    prep.check_control_text(parse_completion({"prompt": "Describe a picture"}), chat=False)


def test_a_trickling_image_host_costs_a_request_at_most_the_fetch_deadline(monkeypatch):
    """#66: each read had a timeout and the fetch none: a host sending a byte every 0.2 s held a preparation slot
    forever. Now the whole fetch has a deadline (here 1.5 s)."""
    import time

    from pipeline.serve import images
    from tests.serving import trickling_image_host
    monkeypatch.setattr(images, "FETCH_DEADLINE_S", 1.5)
    with trickling_image_host() as url:
        t0 = time.monotonic()
        with pytest.raises(ApiError, match=r"p: the image was not fetched within 1.5 s \(\d+ bytes came\)") as err:
            image_bytes(ImagePart(url, "p"), frozenset({"127.0.0.1"}))
        assert err.value.code == "image_fetch_timeout" and 1.4 < time.monotonic() - t0 < 3.0


def test_a_requests_images_are_held_to_one_pixel_budget_before_any_is_decoded(monkeypatch):
    """#66: sixteen images each inside the per-image bound cost seconds of decoding that every other client waited
    for; the request's images together are held to MAX_REQUEST_PIXELS by their headers, before each is decoded."""
    import pipeline.images
    assert images.MAX_REQUEST_PIXELS == pipeline.images.MAX_IMAGE_PIXELS == 40_000_000
    one = 150 * 130                                             # the builtin image's pixels
    monkeypatch.setattr(images, "MAX_REQUEST_PIXELS", 2 * one)
    parts = [ImagePart(data_url(PNG), f"messages[0].content[{i}].image_url") for i in range(3)]
    assert [i.tokens for i in read_images(parts[:2], side())] == [72, 72]     # at the budget: taken
    decoded = []
    real_open = images.open_image
    monkeypatch.setattr(images, "open_image", lambda data: decoded.append(len(data)) or real_open(data))
    with pytest.raises(ApiError) as e:
        read_images(parts, side())
    assert (e.value.status, e.value.code, e.value.param) == (400, "image_too_large", parts[2].param)
    assert e.value.message == (f"{parts[2].param}: the image is 150 x 130 pixels, and {2 * one} were decoded for the "
                               f"request's images before it: at most {2 * one} pixels are decoded per request (send "
                               "fewer or smaller images)")
    assert len(decoded) == 2                                    # the third was never decoded
    # a bomb's claimed size counts before its data is touched: refused by the budget, not by a failed decode
    monkeypatch.setattr(images, "MAX_REQUEST_PIXELS", 30_000_000)
    bomb = ImagePart(data_url(_png_claiming(6000, 5000)), "messages[0].content[1].image_url")
    with pytest.raises(ApiError, match=r"content\[1\].image_url: the image is 6000 x 5000 pixels, and 19500 were "
                       r"decoded .* at most 30000000 pixels"):
        read_images([parts[0], bomb], side())
