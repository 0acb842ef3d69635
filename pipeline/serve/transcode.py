"""Audio the engine does not take as it came (another container or codec: FLAC, MP3, Ogg/Opus, WebM, M4A as browsers
and Open WebUI record it; or WAV at another rate) decoded to 16 kHz mono 16-bit WAV by ffmpeg, bounded like every
other input: the bytes in (AudioLimits.max_bytes), the samples out (max_seconds of 16 kHz, a few bytes past it mean
a longer recording), the time (TIMEOUT_S, then killed), and no file or network access (stdin to stdout, ffmpeg's
protocol whitelist pipe only). A file ffmpeg cannot decode is a 400 naming the part, never a crash.

ffmpeg is the machine's own (Debian's ffmpeg package; JetPack's Ubuntu has it); without it such audio is refused
naming the conversion to do before sending.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from array import array

from pipeline.audio import CONVERT, AudioLimits, container, wav_bytes
from pipeline.serve.errors import ApiError

TIMEOUT_S = 30.0
RATE = 16_000


def to_wav16k(data: bytes, limits: AudioLimits, param: str) -> bytes:
    """The recording as a 16 kHz mono 16-bit WAV file, or a 400 naming `param`."""
    ffmpeg = shutil.which("ffmpeg")
    kind = container(data) or ("WAV" if data.startswith(b"RIFF") else "this")
    if ffmpeg is None:
        raise ApiError(400, f"{param}: {kind} audio needs decoding to 16 kHz mono WAV, and this server has no ffmpeg: "
                       f"{CONVERT}", param, "unsupported_audio")
    if len(data) > limits.max_bytes:
        raise ApiError(400, f"{param}: the audio is more than {limits.max_bytes} bytes", param, "audio_too_large")
    most = int(limits.max_seconds * RATE) * 2
    argv = [ffmpeg, "-nostdin", "-hide_banner", "-loglevel", "error", "-protocol_whitelist", "pipe",
            "-i", "pipe:0", "-map", "0:a:0", "-ac", "1", "-ar", str(RATE),
            # at most a second past the longest recording taken: the output (and ffmpeg's work) is bounded by ffmpeg
            # itself, and a longer recording shows as more samples than the limit
            "-t", f"{limits.max_seconds + 1:g}", "-f", "s16le", "-acodec", "pcm_s16le", "pipe:1"]
    try:
        done = subprocess.run(argv, input=data, capture_output=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise ApiError(400, f"{param}: decoding the audio took over {TIMEOUT_S:g} s", param, "invalid_audio") from None
    if done.returncode != 0 or not done.stdout:
        why = (done.stderr or b"").decode("utf-8", "replace").strip().splitlines()
        raise ApiError(400, f"{param}: the audio cannot be decoded ({why[-1][:120] if why else 'no audio stream'})",
                       param, "invalid_audio")
    if len(done.stdout) > most:
        raise ApiError(400, f"{param}: the recording is longer than {limits.max_seconds:g} s, the longest the audio "
                       "engine takes", param, "audio_too_long")
    samples = array("h")
    samples.frombytes(done.stdout[: len(done.stdout) // 2 * 2])
    if sys.byteorder == "big":
        samples.byteswap()
    return wav_bytes(samples, RATE)
