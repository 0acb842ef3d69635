"""The WAV reader and writer (pipeline/audio.py): exact samples in every encoding it takes, and every damaged,
crafted, huge or foreign file refused by name before a sample is decoded."""

import math
import struct
from array import array

import pytest

from pipeline.audio import AudioError, AudioLimits, container, pcm_s16le, read_wav, wav_bytes


def _wav(body: bytes, tag=1, channels=1, rate=16000, bits=16, align=None, extra_chunks=b"", data_size=None,
         extensible_sub=None) -> bytes:
    """A WAV file written field by field (so that each field can be made wrong)."""
    align = channels * bits // 8 if align is None else align
    if extensible_sub is None:
        fmt = struct.pack("<HHIIHH", tag, channels, rate, rate * align, align, bits)
    else:
        fmt = struct.pack("<HHIIHH", 0xFFFE, channels, rate, rate * align, align, bits) + struct.pack(
            "<HHIH", 22, bits, 0, extensible_sub) + b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
    data_size = len(body) if data_size is None else data_size
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt + extra_chunks + b"data" + struct.pack("<I", data_size) + body
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


SAMPLES = array("h", [0, 1, -1, 32767, -32768, 1234, -4321, 7])


def test_what_the_writer_writes_reads_back_sample_for_sample():
    data = wav_bytes(SAMPLES, 24000)
    assert data[:4] == b"RIFF" and struct.unpack_from("<I", data, 4)[0] == len(data) - 8
    audio = read_wav(data, AudioLimits(min_seconds=0))
    assert audio.rate == 24000 and list(audio.samples) == list(SAMPLES)
    assert audio.seconds == pytest.approx(8 / 24000)
    assert pcm_s16le(SAMPLES) == struct.pack("<8h", *SAMPLES) == data[-16:]


def test_stereo_is_averaged_and_24_32_bit_and_float_samples_become_16_bit():
    limits = AudioLimits(min_seconds=0)
    stereo = _wav(struct.pack("<4h", 100, 300, -5, -7), channels=2)
    assert list(read_wav(stereo, limits).samples) == [200, -6]
    # 24-bit: the top two bytes; 0x123456 -> 0x1234, -1 (0xFFFFFF) -> -1
    b24 = bytes([0x56, 0x34, 0x12, 0xFF, 0xFF, 0xFF])
    assert list(read_wav(_wav(b24, bits=24), limits).samples) == [0x1234, -1]
    b32 = struct.pack("<2i", 0x12345678, -65536)
    assert list(read_wav(_wav(b32, bits=32), limits).samples) == [0x1234, -1]
    floats = struct.pack("<5f", 0.5, -1.0, 2.0, math.nan, -math.inf)
    assert list(read_wav(_wav(floats, tag=3, bits=32), limits).samples) == [16384, -32767, 32767, 0, -32767]
    ext = _wav(struct.pack("<2h", 5, -5), extensible_sub=1)
    assert list(read_wav(ext, limits).samples) == [5, -5]


def test_chunks_before_the_data_and_odd_sizes_are_skipped():
    odd = b"LIST" + struct.pack("<I", 3) + b"abc" + b"\x00"     # padded to an even length
    audio = read_wav(_wav(struct.pack("<2h", 9, 8), extra_chunks=odd), AudioLimits(min_seconds=0))
    assert list(audio.samples) == [9, 8]


@pytest.mark.parametrize("data,kind", [(b"fLaC" + bytes(40), "FLAC"), (b"ID3\x04" + bytes(40), "MP3"),
                                       (b"OggS" + bytes(40), "Ogg"), (b"\x1a\x45\xdf\xa3" + bytes(40), "WebM"),
                                       (bytes(4) + b"ftypM4A " + bytes(40), "MP4")],
                         ids=["flac", "mp3", "ogg", "webm", "mp4"])
def test_other_containers_are_refused_by_name_with_the_conversion_to_make(data, kind):
    assert container(data).startswith(kind)
    with pytest.raises(AudioError) as e:
        read_wav(data, name="upload.bin")
    assert f"upload.bin: a {kind}" in str(e.value) and "ffmpeg -i INPUT -ar 16000 -ac 1" in str(e.value)


def test_bytes_that_are_no_audio_at_all_are_refused():
    with pytest.raises(AudioError, match="not a WAV file"):
        read_wav(b"hello, world")
    with pytest.raises(AudioError, match="not a WAV file"):
        read_wav(b"")


def test_a_truncated_data_chunk_is_named_with_the_bytes_missing():
    whole = _wav(struct.pack("<100h", *range(100)))
    with pytest.raises(AudioError, match=r"'data' chunk says 200 bytes and the file ends 150 bytes after"):
        read_wav(whole[:-50])
    with pytest.raises(AudioError, match="4294967295 bytes"):    # a streaming writer's placeholder size
        read_wav(_wav(bytes(64), data_size=0xFFFFFFFF))


@pytest.mark.parametrize("kw,message", [
    ({"tag": 2}, "format tag 2 with 16-bit"),               # ADPCM
    ({"tag": 3, "bits": 64}, "format tag 3 with 64-bit"),
    ({"bits": 8}, "format tag 1 with 8-bit"),
    ({"channels": 0}, "0 channels"),
    ({"channels": 9, "align": 18}, "9 channels"),
    ({"rate": 7999}, "7999 Hz"),
    ({"rate": 48001}, "48001 Hz"),
    ({"align": 4}, "block align 4 does not match 1 channels of 16-bit"),
    ({"extensible_sub": 7}, "format tag 7"),
])
def test_each_header_field_out_of_range_is_named(kw, message):
    with pytest.raises(AudioError, match=message):
        read_wav(_wav(bytes(3200 * max(1, kw.get("channels", 1))), **kw))


def test_the_rate_limits_are_inclusive():
    for rate in (8000, 48000):
        assert read_wav(_wav(bytes(rate * 2), rate=rate)).seconds == 1.0


def test_headers_without_fmt_or_data_are_refused():
    no_data = b"RIFF" + struct.pack("<I", 28) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + struct.pack(
        "<HHIIHH", 1, 1, 16000, 32000, 2, 16)
    with pytest.raises(AudioError, match="without a 'data' chunk"):
        read_wav(no_data)
    no_fmt = b"RIFF" + struct.pack("<I", 12) + b"WAVE" + b"data" + struct.pack("<I", 0)
    with pytest.raises(AudioError, match="without a complete 'fmt ' chunk"):
        read_wav(no_fmt)


def test_size_and_duration_limits_hold_at_their_edges():
    one_second = _wav(bytes(32000))
    assert read_wav(one_second, AudioLimits(max_bytes=len(one_second))).seconds == 1.0
    with pytest.raises(AudioError, match=f"{len(one_second)} bytes, over the limit of {len(one_second) - 1}"):
        read_wav(one_second, AudioLimits(max_bytes=len(one_second) - 1))
    assert read_wav(one_second, AudioLimits(max_seconds=1.0)).seconds == 1.0
    with pytest.raises(AudioError, match=r"1.0 s of audio, over the limit of 0.999 s"):
        read_wav(one_second, AudioLimits(max_seconds=0.999))
    # an hour claimed by a header whose data is not there is truncated, not an hour to decode
    with pytest.raises(AudioError, match="truncated"):
        read_wav(_wav(bytes(10), data_size=3600 * 32000))
    with pytest.raises(AudioError, match="no speech fits"):
        read_wav(_wav(bytes(2)))
