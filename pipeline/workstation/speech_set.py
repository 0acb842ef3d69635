"""A speech set for the speech quality gate: real recordings with their reference transcripts and languages, pinned
by content, brought to what the engine takes (16 kHz mono 16-bit WAV) once, on the workstation, by a deterministic
resampler; the kit carries the converted files, so the reference model and the engine on the device hear the same
bytes.

    builtin:alsa-channels   Debian's alsa-utils 1.2.8-1 (/usr/share/sounds/alsa): a woman's voice naming each
                            loudspeaker channel ("front left", ...), 8 utterances in English, 48 kHz; pinned by sha256
                            (a machine with another version has other bytes, whose figures would not compare). The
                            only real speech with known words found installable offline from the package registries
                            (PyPI's speech packages ship none; see the README); it measures English only.
    file:MANIFEST.tsv       one utterance a line: PATH<TAB>LANGUAGE<TAB>TRANSCRIPT (the path relative to the manifest;
                            a WAV file at 16, 32 or 48 kHz; the language an ISO 639 code): the recipe's own set, in the
                            languages it is deployed for

A recipe declares the languages it must be measured in ([validation.speech] languages); a set without utterances in
one of them is refused before any work (a model rejected after deployment for a 26% character error rate on Chinese,
which nobody had measured, is why).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from pipeline.audio import AudioError, AudioLimits, read_wav, wav_bytes
from pipeline.errors import PipelineError

RATE = 16_000
ALSA_DIR = Path("/usr/share/sounds/alsa")
ALSA_CHANNELS = (
    ("Front_Center.wav", "front center", "0d61518bcd3f13b0c709a5298e939caf698b80d31d71d50475365ee0e5536cc9"),
    ("Front_Left.wav", "front left", "9f97e8458785da2f0aa0ec60bf9cc81520cbf80a4683e83eca9cb5f2958e9fef"),
    ("Front_Right.wav", "front right", "1fdea4d7003f1f7d3e48d3521aaab0a112c4ac570b02ddf1813abacac3070f6f"),
    ("Rear_Center.wav", "rear center", "9343207e3298813fdc4d26b7948e15a38533c37a9f232c3eff809b565398b330"),
    ("Rear_Left.wav", "rear left", "1679e0557701864d55b742a0abd3fe5f50d95b1bfcb55ffad4b597dcc7e3c7b8"),
    ("Rear_Right.wav", "rear right", "12828d125f692faa75c7445d52125dcc2c36f82c4f7a3ef49b8ae6afd74ada9d"),
    ("Side_Left.wav", "side left", "03dc7c641d7825417d2a261831715e945e95d87343fb037db910e7ce4f87a2a1"),
    ("Side_Right.wav", "side right", "ecdd0329945f355960796a56f8126d5080ed93fdd2437c7eaddbbbd56137d7e9"),
)
BUILTIN_SETS = ("alsa-channels",)
MAX_UTTERANCES = 200
MANIFEST_MAX = 256 * 1024
TAPS_PER_SIDE = 32          # of the decimation filter, per unit of the factor


@dataclass(frozen=True)
class Utterance:
    name: str           # the kit's file (audio/speech-<sha>.wav)
    language: str
    transcript: str
    wav: bytes          # 16 kHz mono 16-bit

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.wav).hexdigest()


@dataclass(frozen=True)
class SpeechSet:
    ref: str
    utterances: tuple[Utterance, ...]

    def languages(self) -> list[str]:
        return sorted({u.language for u in self.utterances})


def decimated(samples, rate: int):
    """16-bit samples at a multiple of 16 kHz brought to 16 kHz: a Kaiser-windowed sinc low-pass at 8 kHz, then every
    k-th sample (float64 throughout, rounded once: the same bytes on every machine numpy computes IEEE doubles on)."""
    import numpy as np
    factor = rate // RATE
    x = np.asarray(samples, np.float64)
    if factor == 1:
        return np.asarray(samples, np.int16)
    half = TAPS_PER_SIDE * factor
    n = np.arange(-half, half + 1)
    taps = np.sinc(n / factor) / factor * np.kaiser(len(n), 8.0)
    y = np.convolve(x, taps / taps.sum(), mode="same")[::factor]
    return np.clip(np.round(y), -32768, 32767).astype(np.int16)


def _utterance(data: bytes, language: str, transcript: str, where: str) -> Utterance:
    try:
        audio = read_wav(data, AudioLimits(max_seconds=60.0), name=where)
    except AudioError as exc:
        raise PipelineError(exc.message, exc.hint) from None
    if audio.rate % RATE:
        raise PipelineError(f"{where}: {audio.rate} Hz; a speech set's recordings are at 16, 32 or 48 kHz",
                            "resample it: ffmpeg -i IN -ar 16000 -ac 1 -c:a pcm_s16le OUT.wav")
    from array import array
    wav = wav_bytes(array("h", decimated(audio.samples, audio.rate).tobytes()), RATE)
    return Utterance(f"audio/speech-{hashlib.sha256(wav).hexdigest()[:16]}.wav", language, transcript, wav)


def set_languages(ref: str, recipe_file: str, field: str) -> list[str]:
    """The languages a set holds, read without its recordings (a recipe is checked when it loads, on machines that
    need not have the set's files: `plan` runs anywhere); the recordings are read and checked by the goldens stage."""
    kind, _, value = ref.partition(":")
    if kind == "builtin":
        if value not in BUILTIN_SETS:
            raise PipelineError(f"{recipe_file}: {field} = {ref!r}: no builtin speech set {value!r}",
                                f"builtin speech sets: {', '.join(BUILTIN_SETS)}")
        return ["en"]
    return sorted({cells[1] for _, cells in _manifest_lines(ref, value, recipe_file, field)[1]})


def _manifest_lines(ref: str, value: str, recipe_file: str, field: str) -> tuple[Path, list[tuple[int, list[str]]]]:
    """(the manifest's path, its utterance lines as (line number, [path, language, transcript])), checked."""
    from pipeline.files import read_referenced
    if not ref.startswith("file:"):
        raise PipelineError(f"{recipe_file}: {field} = {ref!r}: not a speech set reference",
                            "builtin:alsa-channels or file:MANIFEST.tsv (relative to the recipe)")
    where, hint = f"{recipe_file}: {field} = {ref!r}", "a UTF-8 manifest: PATH<TAB>LANGUAGE<TAB>TRANSCRIPT per line"
    manifest, raw = read_referenced(value, recipe_file, MANIFEST_MAX, where, hint)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PipelineError(f"{where}: {type(exc).__name__}: {exc}", hint) from None
    lines = [(i, line) for i, line in enumerate(text.splitlines(), 1) if line.strip() and not line.startswith("#")]
    if not lines or len(lines) > MAX_UTTERANCES:
        raise PipelineError(f"{manifest}: {len(lines)} utterances; a speech set has 1 to {MAX_UTTERANCES}",
                            "one utterance a line: PATH<TAB>LANGUAGE<TAB>TRANSCRIPT")
    out = []
    for i, line in lines:
        cells = [c.strip() for c in line.split("\t")]
        if len(cells) != 3 or not all(cells):
            raise PipelineError(f"{manifest}:{i}: {line[:60]!r} is not PATH<TAB>LANGUAGE<TAB>TRANSCRIPT",
                                "give each utterance its file, its language and its reference transcript")
        out.append((i, [cells[0], cells[1].lower(), cells[2]]))
    return manifest, out


def set_sources(ref: str, recipe_file: str, field: str) -> list[tuple[str, bytes, str, str]]:
    """(where, the file's bytes as read, language, transcript) of each utterance of the set `ref` names, every file
    read bounded (a builtin set's checked against its pins); nothing decoded: what the goldens' key hashes."""
    from pipeline.files import read_referenced, read_regular
    kind, _, value = ref.partition(":")
    if kind == "builtin":
        if value not in BUILTIN_SETS:
            raise PipelineError(f"{recipe_file}: {field} = {ref!r}: no builtin speech set {value!r}",
                                f"builtin speech sets: {', '.join(BUILTIN_SETS)}")
        out = []
        for name, transcript, pinned in ALSA_CHANNELS:
            path = ALSA_DIR / name
            try:
                data = read_regular(path, 1 << 20, follow=True)
            except (PipelineError, OSError):
                raise PipelineError(f"{recipe_file}: {field} = {ref!r}: {path} is not there",
                                    "install Debian's alsa-utils (apt-get install alsa-utils): it ships it") from None
            if hashlib.sha256(data).hexdigest() != pinned:
                raise PipelineError(f"{recipe_file}: {field} = {ref!r}: {path} is not the pinned recording (alsa-utils "
                                    "1.2.8-1): figures measured on other bytes would not compare",
                                    "install alsa-utils 1.2.8-1, or give the set as file:MANIFEST.tsv")
            out.append((str(path), data, "en", transcript))
        return out
    manifest, lines = _manifest_lines(ref, value, recipe_file, field)
    sources = []
    for i, (name, language, transcript) in lines:
        path, data = read_referenced(name, manifest, AudioLimits().max_bytes, f"{manifest}:{i}",
                                     "name a WAV file relative to the manifest")
        sources.append((f"{manifest}:{i} ({path.name})", data, language, transcript))
    return sources


def read_speech_set(ref: str, recipe_file: str, field: str) -> SpeechSet:
    """The set `ref` names, every file read bounded and checked, brought to 16 kHz; errors name the field and the
    file."""
    return SpeechSet(ref, tuple(_utterance(data, language, transcript, where)
                                for where, data, language, transcript in set_sources(ref, recipe_file, field)))
