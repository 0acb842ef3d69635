"""/v1/audio/speech's checks at their edges (serve/speech.py), and the Edge-LLM TTS session (runtime/speech.py) against
a runtime that misbehaves. The runtime here is a double of tensorrt_edgellm.runtime's TTS names (TTSRuntime,
OmniAudioParams, AudioStreamChannel, AudioChunk) that sends what each case scripts; the engines' numerics are
test_tts_build.py's (the runtime double computing the exported graphs)."""

from __future__ import annotations

import queue
import threading
import time
from types import SimpleNamespace

import pytest

from pipeline.audio import wav_header
from pipeline.runtime.session import Limits
from pipeline.runtime.speech import Audio, EdgellmSpeechSession, SpeechParams
from pipeline.serve.errors import ApiError
from pipeline.serve.speech import MAX_INPUT_CHARS, SpeechSide, parse

SIDE = SpeechSide(("ryan", "serena"), "serena", 24000, SpeechParams(max_audio_length=256), 256)


def test_the_input_s_bound_is_4096_characters():
    assert parse({"input": "x" * MAX_INPUT_CHARS}, SIDE).text == "x" * MAX_INPUT_CHARS
    with pytest.raises(ApiError, match="input is 4097 characters; at most 4096"):
        parse({"input": "x" * (MAX_INPUT_CHARS + 1)}, SIDE)


@pytest.mark.parametrize(("field", "ok", "bad", "says"), [
    ("max_audio_length", 256, 257, "max_audio_length 257 is past the 256 frames"),
    ("max_audio_length", 1, 0, "max_audio_length must be within 1 and 65536"),
    ("talker_top_p", 1.0, 1.0001, "talker_top_p must be within 0 and 1"),
    ("talker_temperature", 0.0, -0.001, "talker_temperature must be within 0 and 100"),
    ("codec_chunk_frames", 4096, 4097, "codec_chunk_frames must be within 1 and 4096"),
    ("talker_top_k", 0, -1, "talker_top_k must be within 0 and 65536"),
])
def test_each_knob_is_taken_at_its_edge_and_refused_past_it(field, ok, bad, says):
    assert getattr(parse({"input": "Hi.", field: ok}, SIDE).params, field) == ok
    with pytest.raises(ApiError, match=says):
        parse({"input": "Hi.", field: bad}, SIDE)


def test_what_a_request_omits_is_the_model_s_and_the_voice_object_is_openai_s():
    asked = parse({"input": "Hi.", "voice": {"id": "ryan"}}, SIDE)
    assert asked.params == SpeechParams(voice="ryan", max_audio_length=256) and asked.response_format == "wav"
    assert parse({"input": "Hi.", "voice": ""}, SIDE).params.voice == ""      # the runtime's default speaker
    assert parse({"input": "Hi.", "response_format": "pcm", "stream_format": "sse"}, SIDE).sse
    greedy_only = SpeechSide(SIDE.voices, "serena", 24000, SpeechParams(talker_top_k=1, max_audio_length=256), 256,
                             greedy_only=True)
    assert parse({"input": "Hi."}, greedy_only).params.greedy
    with pytest.raises(ApiError, match="the reference backend decodes greedily only"):
        parse({"input": "Hi.", "talker_top_k": 50}, greedy_only)


def test_the_wav_header_is_the_canonical_one():
    from array import array

    from pipeline.audio import read_wav, wav_bytes
    samples = array("h", [0, 1, -1, 32767, -32768] * 480)
    assert wav_header(2 * len(samples), 24000) + samples.tobytes() == wav_bytes(samples, 24000)
    assert read_wav(wav_header(2 * len(samples), 24000) + samples.tobytes()).samples == samples


# ------------------------------------------------------------------------------------- the runtime misbehaving
class Channel:
    """AudioStreamChannel as its binding has it: wait_pop / try_pop / is_finished / is_cancelled / cancel."""

    def __init__(self):
        self.q, self.finished, self.cancelled = queue.Queue(), False, False

    def push(self, chunk):
        self.q.put(chunk)
        self.finished = self.finished or chunk.is_final

    def wait_pop(self, timeout_ms=0):
        try:
            return self.q.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            return None

    def try_pop(self):
        try:
            return self.q.get_nowait()
        except queue.Empty:
            return None

    def is_finished(self):
        return self.finished and self.q.empty()

    def is_cancelled(self):
        return self.cancelled

    def cancel(self):
        self.cancelled = True


def scripted(script):
    """A runtime module whose TTSRuntime pushes `script(channel, params)`'s chunks."""
    class Runtime:
        def __init__(self, **dirs):
            self.dirs = dirs

        def get_speaker_names(self):
            return ["serena", "ryan"]

        def handle_request_tts(self, text, params, channel):
            script(channel, params)
    return SimpleNamespace(TTSRuntime=Runtime, OmniAudioParams=lambda: SimpleNamespace(), AudioStreamChannel=Channel)


def chunk(pcm: bytes, final: bool = False):
    return SimpleNamespace(pcm16=pcm, is_final=final, num_frames=1)


def spoken(script, params=SpeechParams(max_audio_length=2), cancel_after: float | None = None, tmp=None):
    from pathlib import Path
    session = EdgellmSpeechSession(Path(tmp or "/nonexistent"), Limits(1, 128, 256), scripted(script))
    got, done = [], threading.Event()

    def emit(a: Audio):
        got.append(a)
        if a.final:
            done.set()
    handle = session.speak("Hi.", params, emit)
    if cancel_after is not None:
        time.sleep(cancel_after)
        session.cancel(handle)
        time.sleep(0.3)
        return session, got
    assert done.wait(10), got
    return session, got


def test_the_binding_is_opened_and_asked_as_edge_llm_s_server_does(tmp_path):
    asked = {}

    def script(channel, params):
        asked.update(vars(params))
        channel.push(chunk(b"\x01\x00" * 1920))
        channel.push(chunk(b"\x02\x00" * 1920, final=True))
    session, got = spoken(script, SpeechParams(voice="ryan", max_audio_length=2, codec_chunk_frames=1), tmp=tmp_path)
    assert session.voices == ("ryan", "serena")
    assert session.runtime.dirs == {"talker_engine_dir": str(tmp_path / "talker"),
                                    "code_predictor_engine_dir": str(tmp_path / "code_predictor"),
                                    "code2wav_engine_dir": str(tmp_path / "code2wav"),
                                    "tokenizer_dir": str(tmp_path / "talker")}
    assert asked == {"speaker_name": "ryan", "talker_temperature": 0.9, "talker_top_k": 50, "talker_top_p": 1.0,
                     "repetition_penalty": 1.05, "max_audio_length": 2, "codec_chunk_frames": 1,
                     "talker_prefill_threshold": 4}
    assert [(len(a.pcm), a.final, a.error) for a in got] == [(3840, False, None), (3840, True, None)]


@pytest.mark.parametrize(("script", "says"), [
    (lambda ch, p: ch.push(chunk(b"\x01\x00\x02", final=True)), "an odd number of PCM bytes"),
    # two frames' worth is the most a max_audio_length of 2 may send
    (lambda ch, p: [ch.push(chunk(b"\x00\x00" * 1920)) for _ in range(3)], "more than 7680 bytes of PCM"),
    (lambda ch, p: (_ for _ in ()).throw(RuntimeError("TTS generation failed")), "RuntimeError: TTS generation failed"),
    (lambda ch, p: ch.push(chunk(b"\x00\x00")), "ended the utterance without its final chunk"),
])
def test_a_runtime_that_sends_what_it_must_not_fails_its_utterance_naming_why(script, says):
    _, got = spoken(script)
    assert got[-1].final and got[-1].error is not None and says in got[-1].error, got[-1]
    assert all(not a.final for a in got[:-1])


def test_a_cancelled_utterance_cancels_the_channel_and_emits_nothing_more():
    seen = {}

    def script(channel, params):
        seen["channel"] = channel
        while not channel.is_cancelled():
            channel.push(chunk(b"\x00\x00" * 10))
            time.sleep(0.01)
    params = SpeechParams(max_audio_length=4096)
    session, got = spoken(script, params, cancel_after=0.2)
    n = len(got)
    time.sleep(0.3)
    assert seen["channel"].cancelled and len(got) == n and not any(a.final for a in got)
