"""The transcription endpoint's readers without a model: the multipart form (serve/multipart.py, strict and bounded),
the answer's transcript in Qwen3-ASR's format (transcripts.answer_transcript), and a speech set's manifest
(workstation/speech_set.py)."""

from __future__ import annotations

import pytest

from pipeline.errors import PipelineError
from pipeline.serve import multipart
from pipeline.serve.errors import ApiError
from pipeline.transcripts import answer_transcript

CT = "multipart/form-data; boundary=XyZ"


def form(*parts: bytes, end: bytes = b"--XyZ--\r\n") -> bytes:
    return b"".join(b"--XyZ\r\n" + p + b"\r\n" for p in parts) + end


def test_a_form_reads_its_fields_and_files_in_order():
    body = form(b'Content-Disposition: form-data; name="model"\r\n\r\ntiny',
                b'Content-Disposition: form-data; name="file"; filename="a \\"b\\".wav"\r\nContent-Type: audio/wav'
                b"\r\n\r\nRIFF\r\n--Xy not a boundary",
                b'Content-Disposition: form-data; name="timestamp_granularities[]"\r\n\r\nword',
                b'Content-Disposition: form-data; name="timestamp_granularities[]"\r\n\r\nsegment')
    got = multipart.parse(body, CT)
    assert got["model"][0].text() == "tiny"
    f = got["file"][0]
    assert (f.filename, f.content_type, f.data) == ('a "b".wav', "audio/wav", b"RIFF\r\n--Xy not a boundary")
    assert [p.text() for p in got["timestamp_granularities[]"]] == ["word", "segment"]


@pytest.mark.parametrize("body, ctype, said", [
    (b"{}", "application/json", "must be multipart/form-data"),
    (b"--XyZ\r\n", "multipart/form-data", "without a boundary"),
    (form(b'Content-Disposition: form-data; name="a"\r\n\r\nx', end=b""), CT, "ends before its closing boundary"),
    (b"junk" + form(b'Content-Disposition: form-data; name="a"\r\n\r\nx'), CT, "does not begin with its boundary"),
    (form(b"Content-Disposition: form-data\r\n\r\nx"), CT, "no Content-Disposition: form-data; name="),
    (form(b"no colon here\r\n\r\nx"), CT, "has no colon"),
    (form(b'Content-Disposition: form-data; name="a"\r\nx'), CT, "no header block"),
    (form(*[b'Content-Disposition: form-data; name="a"\r\n\r\nx'] * 17), CT, "more than 16 parts"),
    (form(b'Content-Disposition: form-data; name="a"\r\n\r\n' + b"x" * 70_000), CT, "more than 65536 bytes"),
    (form(b'Content-Disposition: form-data; name="a"\r\n\r\nx', end=b"--XyZ!!"), CT, "not followed by CRLF or --"),
])
def test_a_malformed_form_is_a_400_naming_what_is_wrong(body, ctype, said):
    with pytest.raises(ApiError, match=said) as err:
        multipart.parse(body, ctype)
    assert err.value.status == 400


def test_a_non_utf8_field_is_a_400_naming_it():
    got = multipart.parse(form(b'Content-Disposition: form-data; name="prompt"\r\n\r\n\xff\xfe'), CT)
    with pytest.raises(ApiError, match="'prompt' is not UTF-8"):
        got["prompt"][0].text()


@pytest.mark.parametrize("answer, language, text", [
    ("language English<asr_text>front left", "English", "front left"),
    ("language None<asr_text>", None, ""),
    ("language Englishfront left", "English", "front left"),       # the runtime's decode dropped the marker
    ("  language Chinese你好", "Chinese", "你好"),
    ("just words", None, "just words"),
    ("language Klingon<asr_text> q", "Klingon", "q"),              # the marker says where, whatever the name
])
def test_the_transcript_is_what_follows_the_marker_or_the_named_language(answer, language, text):
    assert answer_transcript(answer, "<asr_text>", ("English", "Chinese")) == (language, text)


def test_a_speech_sets_manifest_is_read_strictly(tmp_path):
    from pipeline.workstation.speech_set import read_speech_set, set_languages
    recipe = str(tmp_path / "r.toml")
    (tmp_path / "ok.tsv").write_text("# a comment\n\n/usr/share/sounds/alsa/Front_Left.wav\tEN\tfront left\n")
    assert set_languages("file:ok.tsv", recipe, "validation.speech.set") == ["en"]
    (tmp_path / "two.tsv").write_text("a.wav\ten\n")
    with pytest.raises(PipelineError, match=r"two.tsv:1: 'a.wav\\ten' is not PATH<TAB>LANGUAGE<TAB>TRANSCRIPT"):
        set_languages("file:two.tsv", recipe, "validation.speech.set")
    (tmp_path / "missing.tsv").write_text("nothere.wav\ten\tx\n")
    with pytest.raises(PipelineError, match=r"missing.tsv:1: .*nothere.wav"):
        read_speech_set("file:missing.tsv", recipe, "validation.speech.set")
    (tmp_path / "rate.tsv").write_text("r.wav\ten\tx\n")
    from array import array

    from pipeline.audio import wav_bytes
    (tmp_path / "r.wav").write_bytes(wav_bytes(array("h", [0] * 22050), 22050))
    with pytest.raises(PipelineError, match="22050 Hz; a speech set's recordings are at 16, 32 or 48 kHz"):
        read_speech_set("file:rate.tsv", recipe, "validation.speech.set")
    with pytest.raises(PipelineError, match="no builtin speech set 'nope'"):
        set_languages("builtin:nope", recipe, "validation.speech.set")


def test_the_decimator_keeps_speech_and_removes_what_16_khz_cannot_hold():
    """48 kHz to 16 kHz: a 1 kHz tone passes at its level, a 12 kHz one (past the new Nyquist) is filtered out
    rather than folded down to 4 kHz."""
    import numpy as np

    from pipeline.workstation.speech_set import decimated
    t = np.arange(48_000) / 48_000
    low = decimated((8000 * np.sin(2 * np.pi * 1000 * t)).astype(np.int16), 48_000).astype(float)
    high = decimated((8000 * np.sin(2 * np.pi * 12_000 * t)).astype(np.int16), 48_000).astype(float)
    assert len(low) == 16_000
    assert abs(np.sqrt(np.mean(low[100:-100] ** 2)) - 8000 / np.sqrt(2)) < 60
    assert np.sqrt(np.mean(high[100:-100] ** 2)) < 40


def test_a_recordings_placeholder_is_expanded_to_its_tokens_and_a_typed_one_refused():
    """The one expansion images and recordings share (serve/images.expand), on a speech model's side."""
    from pipeline.families.audio import QWEN3_ASR_AUDIO
    from pipeline.serve.images import expand
    from pipeline.serve.recordings import AudioSide, RequestRecording
    side = AudioSide(QWEN3_ASR_AUDIO, 50, "<|audio_pad|>", 9, 30)
    rec = RequestRecording(b"", 1.0, side.tokens(16_000))
    assert rec.tokens == 13 and side.tokens(100) == 7        # a second: one chunk; under half a second: padded to it
    assert expand([1, 9, 2], side, [rec]) == [1, *[9] * 13, 2]
    with pytest.raises(ApiError, match=r"the prompt holds 2 <\|audio_pad\|> tokens for 1 recordings: send recordings "
                       r"as input_audio parts, not as their placeholder text"):
        expand([9, 9], side, [rec])
