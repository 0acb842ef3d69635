"""Audio as the pipeline takes and gives it: one exact WAV reader and writer (RIFF/WAVE, the format every speech
endpoint and tool accepts), bounded like every other input a user or an attacker can hand us.

What comes in (an upload to /v1/audio/transcriptions, a recipe's speech prompt) may be truncated, huge, hours long,
in another codec, or crafted: every field of the header is checked against the bytes really there and against
`AudioLimits` before a sample is decoded, and anything else is an `AudioError` that names what was wrong and what to
send instead (the server answers it with a 400, never a decoder crash). Other containers (FLAC, MP3, Ogg, WebM, MP4)
are recognised by their magic bytes and refused by name: decoding them would need a codec library on the board.

Read audio is mono 16-bit PCM at its own rate (channels averaged; 24/32-bit integer and 32-bit float samples
converted): `Audio`. What goes out (text to speech) is 16-bit mono PCM, as a WAV file or raw little-endian samples
(OpenAI's `pcm` response format; 24 kHz is Qwen3-TTS's rate). Standard library only: the device (Python 3.10, no
numpy) and the server read it.
"""

from __future__ import annotations

import struct
import sys
from array import array
from dataclasses import dataclass

from pipeline.errors import PipelineError

PCM, IEEE_FLOAT, EXTENSIBLE = 1, 3, 0xFFFE
# the tail every KSDATAFORMAT_SUBTYPE GUID shares: WAVE_FORMAT_EXTENSIBLE's sub-format is its first two bytes
_GUID_TAIL = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
_MAGIC = ((b"fLaC", "FLAC"), (b"ID3", "MP3"), (b"\xff\xfb", "MP3"), (b"\xff\xf3", "MP3"), (b"\xff\xf2", "MP3"),
          (b"OggS", "Ogg"), (b"\x1a\x45\xdf\xa3", "WebM/Matroska"), (b"FORM", "AIFF"), (b"RF64", "RF64"))
CONVERT = "convert it to WAV first, e.g. ffmpeg -i INPUT -ar 16000 -ac 1 -c:a pcm_s16le OUTPUT.wav"


class AudioError(PipelineError):
    """Audio the pipeline will not take: what is wrong with it and what to send instead."""


@dataclass(frozen=True)
class AudioLimits:
    max_bytes: int = 25 * 2**20         # OpenAI's upload limit for /v1/audio/transcriptions
    max_seconds: float = 600.0
    min_seconds: float = 0.01
    min_rate: int = 8_000
    max_rate: int = 48_000
    max_channels: int = 8


@dataclass(frozen=True)
class Audio:
    rate: int                   # samples per second
    samples: array              # mono, signed 16-bit ('h')

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.rate


def container(data: bytes) -> str | None:
    """What container the bytes are, by their magic ("WAV", "FLAC", ...); None: none known."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "WAV"
    if data[4:8] == b"ftyp":
        return "MP4/M4A"
    return next((name for magic, name in _MAGIC if data.startswith(magic)), None)


def _chunks(data: bytes, name: str):
    """(id, offset, size) of each chunk after the RIFF header, each inside the bytes there."""
    at = 12
    while at + 8 <= len(data):
        cid, size = data[at:at + 4], struct.unpack_from("<I", data, at + 4)[0]
        if at + 8 + size > len(data):
            # a data chunk that runs past the end: a truncated file (streaming writers also leave 0xFFFFFFFF here)
            raise AudioError(f"{name}: its {cid.decode('latin-1')!r} chunk says {size} bytes and the file ends "
                             f"{len(data) - at - 8} bytes after its header: the file is truncated or damaged",
                             "send the whole file; " + CONVERT)
        yield cid, at + 8, size
        at += 8 + size + (size & 1)     # chunks are padded to an even length


def read_wav(data: bytes, limits: AudioLimits = AudioLimits(), name: str = "the audio") -> Audio:
    """The WAV file in `data` as mono 16-bit samples, every header field checked against the bytes and `limits`."""
    if len(data) > limits.max_bytes:
        raise AudioError(f"{name}: {len(data)} bytes, over the limit of {limits.max_bytes}",
                         "send a shorter recording (or split it), or raise the server's limit")
    kind = container(data)
    if kind != "WAV":
        what = f"a {kind} file" if kind else "not a WAV file (no RIFF/WAVE header)"
        raise AudioError(f"{name}: {what}; this pipeline takes WAV (PCM 16/24/32-bit or 32-bit float)", CONVERT)
    fmt = body = None
    for cid, at, size in _chunks(data, name):
        if cid == b"fmt " and fmt is None:
            fmt = (at, size)
        elif cid == b"data" and body is None:
            body = (at, size)
    if fmt is None or fmt[1] < 16:
        raise AudioError(f"{name}: a WAV file without a complete 'fmt ' chunk", CONVERT)
    tag, channels, rate, _, align, bits = struct.unpack_from("<HHIIHH", data, fmt[0])
    if tag == EXTENSIBLE:
        if fmt[1] < 40 or data[fmt[0] + 26:fmt[0] + 40] != _GUID_TAIL:
            raise AudioError(f"{name}: a WAVE_FORMAT_EXTENSIBLE header without a known sub-format", CONVERT)
        tag = struct.unpack_from("<H", data, fmt[0] + 24)[0]
    encodings = {(PCM, 16): "h", (PCM, 24): "24", (PCM, 32): "i", (IEEE_FLOAT, 32): "f"}
    if (tag, bits) not in encodings:
        raise AudioError(f"{name}: WAV format tag {tag} with {bits}-bit samples; this pipeline takes PCM 16/24/32-bit "
                         f"or 32-bit float", CONVERT)
    if not 1 <= channels <= limits.max_channels:
        raise AudioError(f"{name}: {channels} channels; from 1 to {limits.max_channels} are taken", CONVERT)
    if not limits.min_rate <= rate <= limits.max_rate:
        raise AudioError(f"{name}: a sample rate of {rate} Hz; from {limits.min_rate} to {limits.max_rate} Hz are "
                         f"taken", CONVERT)
    if align != channels * bits // 8:
        raise AudioError(f"{name}: block align {align} does not match {channels} channels of {bits}-bit samples",
                         CONVERT)
    if body is None:
        raise AudioError(f"{name}: a WAV file without a 'data' chunk", CONVERT)
    frames = body[1] // align
    seconds = frames / rate
    if seconds > limits.max_seconds:
        raise AudioError(f"{name}: {seconds:.1f} s of audio, over the limit of {limits.max_seconds:g} s",
                         "send a shorter recording, or split it")
    if seconds < limits.min_seconds:
        raise AudioError(f"{name}: {frames} samples ({seconds * 1000:.1f} ms): no speech fits in it",
                         "send at least a short word")
    raw = data[body[0]:body[0] + frames * align]
    return Audio(rate, _mono(_decode(raw, encodings[(tag, bits)]), channels))


def _decode(raw: bytes, code: str) -> array:
    """Interleaved samples as signed 16-bit integers."""
    if code == "24":
        # the top two bytes of each little-endian 24-bit sample are its 16-bit value
        top = bytearray(len(raw) // 3 * 2)
        top[0::2], top[1::2] = raw[1::3], raw[2::3]
        out = array("h", bytes(top))
    else:
        out = array(code, raw)
    if sys.byteorder == "big":
        out.byteswap()
    if code == "i":
        return array("h", (v >> 16 for v in out))
    if code == "f":
        return array("h", (_clip(v) for v in out))
    return out


def _clip(v: float) -> int:
    """A float sample in [-1, 1] as 16-bit (NaN as silence: a crafted file must not poison what follows)."""
    if v != v:
        return 0
    return int(round(max(-1.0, min(1.0, v)) * 32767))


def _mono(samples: array, channels: int) -> array:
    if channels == 1:
        return samples
    return array("h", (sum(samples[i:i + channels]) // channels for i in range(0, len(samples), channels)))


def pcm_s16le(samples: array) -> bytes:
    """Raw little-endian 16-bit samples (OpenAI's `pcm` response format)."""
    out = array("h", samples)
    if sys.byteorder == "big":
        out.byteswap()
    return out.tobytes()


def wav_header(pcm_bytes: int, rate: int) -> bytes:
    """The canonical 44-byte header of mono 16-bit PCM (RIFF/WAVE, one fmt and one data chunk) before `pcm_bytes`
    of samples: what wav_bytes writes, and what a server sends before samples it already holds as bytes."""
    fmt = struct.pack("<HHIIHH", PCM, 1, rate, rate * 2, 2, 16)
    return b"".join((b"RIFF", struct.pack("<I", 4 + 8 + len(fmt) + 8 + pcm_bytes), b"WAVE",
                     b"fmt ", struct.pack("<I", len(fmt)), fmt, b"data", struct.pack("<I", pcm_bytes)))


def wav_bytes(samples: array, rate: int) -> bytes:
    """A mono 16-bit PCM WAV file of the samples."""
    body = pcm_s16le(samples)
    return wav_header(len(body), rate) + body


RESAMPLE_ZEROS = 16     # the windowed-sinc filter's zero crossings each side: ~70 dB of stop band


def resample(samples: array, rate_in: int, rate_out: int) -> array:
    """16-bit samples at rate_in as 16-bit samples at rate_out (rational rates): the signal band-limited below the
    lower Nyquist by a Hann-windowed sinc and read at the new instants, one output sample at a time. Standard
    library only (the device half has no numpy); what it is for: a text-to-speech engine's 24 kHz speech handed to a
    16 kHz transcriber (device/round_trip.py)."""
    import math
    if rate_in == rate_out or not samples:
        return array("h", samples)
    g = math.gcd(rate_in, rate_out)
    up, down = rate_out // g, rate_in // g
    cutoff = 1.0 / max(up, down)                   # of the upsampled rate's Nyquist
    half = RESAMPLE_ZEROS * max(up, down)          # the filter's half length, in upsampled samples
    # output n sits at upsampled position P = n*down = base*up + phase; input i sits at i*up, so its distance is
    # (base - i)*up + phase: one set of taps per phase, over m = base - i
    phases = []
    for p in range(up):
        taps = []
        for k in range(-(half // up) - 1, half // up + 2):
            t = k * up + p
            if abs(t) > half:
                taps.append(0.0)
                continue
            x = t * cutoff
            sinc = 1.0 if t == 0 else math.sin(math.pi * x) / (math.pi * x)
            taps.append(cutoff * sinc * (0.5 + 0.5 * math.cos(math.pi * t / half)) * up)
        phases.append(taps)
    first = -(half // up) - 1
    n_out = len(samples) * up // down
    out = array("h", bytes(2 * n_out))
    count = len(samples)
    for n in range(n_out):
        pos = n * down
        base, phase = pos // up, pos % up
        acc = 0.0
        for j, h in enumerate(phases[phase]):
            i = base - (first + j)
            if 0 <= i < count and h:
                acc += h * samples[i]
        out[n] = max(-32768, min(32767, int(round(acc))))
    return out
