"""Open WebUI's voice features in a real browser, pointed at `serve`: Open WebUI 0.12.4 (its own server, its own
venv) in Debian's Chromium, driven by Playwright as a user would click. One `serve` of three built tiny recipes is
its OpenAI connection (chat), its speech-to-text engine and its text-to-speech engine, configured as an admin would
(the OpenAI engines, the recipes as models, a preset voice; the admin's additional TTS parameters bound each
utterance to 8 codec frames: the random twin never says its end of speech on its own). The microphone is Chromium's
fake capture device playing a real spoken recording (alsa-utils' "Front Center").

    ./bootstrap.sh --browser && .venv/bin/python -m pytest -m browser tests/browser

Not in CI: Open WebUI and its dependencies are about 7 GB. What each test checks is what the user sees and hears, and
that it is what our server answered: the dictated text Open WebUI writes into the chat box is our server's transcript
of the very recording the browser made (Open WebUI keeps it; asked again, the server answers the same words), and the
audio the browser plays on "Read Aloud" and in voice mode is the speech our server makes of that sentence (the MP3 it
played, decoded, against our WAV).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import REPO, Project

from tests.serving import Served, free_port, health, stop_process

pytestmark = pytest.mark.browser
OPEN_WEBUI = REPO / ".venv" / "open-webui" / "bin" / "open-webui"
CHROMIUM = Path("/usr/bin/chromium")
MICROPHONE = Path("/usr/share/sounds/alsa/Front_Center.wav")
CHAT, ASR, TTS = "tiny-llama-cpu", "tiny-qwen3-asr", "tiny-qwen3-tts"
VOICE, FRAMES = "serena", 8
# Chromium headless (no sandbox as root; its background connections would be refused here), with a fake microphone
# (the fixture's recording) that the page may use; it may play sound only after a click, as in any browser
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--use-fake-ui-for-media-stream",
                 "--use-fake-device-for-media-stream"]
# every <audio>/Audio() the page plays: its source and, once known, its duration (Open WebUI plays read-aloud speech
# through an audio queue of object URLs, not elements in the page)
RECORD_PLAYBACK = """
window.__played = [];
const play = HTMLMediaElement.prototype.play;
HTMLMediaElement.prototype.play = function () {
  const entry = {src: this.src, duration: null, ended: false, error: null};
  window.__played.push(entry);
  this.addEventListener('loadedmetadata', () => { entry.duration = this.duration; });
  this.addEventListener('ended', () => { entry.duration = this.duration; entry.ended = true; });
  const p = play.call(this);
  if (p) p.catch((e) => { entry.error = String(e); });
  return p;
};
"""


def _missing() -> str | None:
    for path, what in ((OPEN_WEBUI, "Open WebUI"), (CHROMIUM, "Chromium"), (MICROPHONE, "alsa-utils' recordings")):
        if not path.exists():
            return f"{what} is not installed ({path}): run ./bootstrap.sh --browser"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright's Python client is not installed: run ./bootstrap.sh --browser"
    return None


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One `serve` of the three recipes, built here through doit as a user builds them."""
    if (why := _missing()) is not None:
        pytest.fail(why)
    project = Project(tmp_path_factory.mktemp("voice") / "proj")
    for recipe in (CHAT, ASR, TTS):
        (project.recipes / f"{recipe}.toml").write_text((REPO / "recipes" / f"{recipe}.toml").read_text())
        project.doit("build", f"recipe={recipe}", timeout=1200)
    log = project.root / "server.log"
    s = Served([CHAT, ASR, TTS], project.env, REPO, log)
    yield s
    s.stop()
    assert "Traceback" not in log.read_text()


@pytest.fixture(scope="module")
def webui(served, tmp_path_factory):
    """Open WebUI on 127.0.0.1 with its OpenAI connection, STT and TTS engines set to `served`; single-user (no
    login), offline (nothing fetched from a hub), no background chats of its own (titles, tags, follow-ups)."""
    data = tmp_path_factory.mktemp("open-webui")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIPELINE_", "JETSON_", "PYTHON"))}
    base = served.url + "/v1"
    env.update(DATA_DIR=str(data), WEBUI_AUTH="False", OFFLINE_MODE="true", HF_HUB_OFFLINE="1",
               ENABLE_OLLAMA_API="false", OPENAI_API_BASE_URL=base, OPENAI_API_KEY="none",
               DEFAULT_MODELS=CHAT, ENABLE_TITLE_GENERATION="false", ENABLE_TAGS_GENERATION="false",
               ENABLE_FOLLOW_UP_GENERATION="false", ENABLE_AUTOCOMPLETE_GENERATION="false",
               AUDIO_STT_ENGINE="openai", AUDIO_STT_MODEL=ASR, AUDIO_STT_OPENAI_API_BASE_URL=base,
               AUDIO_STT_OPENAI_API_KEY="none", AUDIO_TTS_ENGINE="openai", AUDIO_TTS_MODEL=TTS,
               AUDIO_TTS_OPENAI_API_BASE_URL=base, AUDIO_TTS_OPENAI_API_KEY="none",
               AUDIO_TTS_VOICE=VOICE, AUDIO_TTS_OPENAI_PARAMS=json.dumps({"max_audio_length": FRAMES}))
    log = data / "open-webui.log"
    proc = subprocess.Popen([str(OPEN_WEBUI), "serve", "--host", "127.0.0.1", "--port", str(port)], env=env,
                            cwd=data, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while (h := health(url)) is None or h[0] != 200:
        assert proc.poll() is None, log.read_text()[-5000:]
        assert time.monotonic() < deadline, "Open WebUI did not come up in 300 s:\n" + log.read_text()[-5000:]
        time.sleep(1)
    yield url, data
    stop_process(proc)


@pytest.fixture(scope="module")
def microphone(tmp_path_factory) -> Path:
    """What Chromium's fake microphone plays, looping: the spoken recording, then 4 s of silence (voice mode ends a
    turn after 2 s without sound)."""
    from array import array

    from pipeline.audio import read_wav, wav_bytes
    spoken = read_wav(MICROPHONE.read_bytes())
    samples = array("h", spoken.samples)
    samples.extend(array("h", bytes(2 * spoken.rate * 4)))
    path = tmp_path_factory.mktemp("microphone") / "speech-then-silence.wav"
    path.write_bytes(wav_bytes(samples, spoken.rate))
    return path


@pytest.fixture
def page(webui, microphone, tmp_path):
    """A new browser profile on Open WebUI's start page (its release notes dismissed), with the microphone allowed
    and every playback recorded; a screenshot of how it ended is left in the test's tmp_path."""
    from playwright.sync_api import sync_playwright
    url, _ = webui
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM),
                                    args=[*CHROMIUM_ARGS, f"--use-file-for-fake-audio-capture={microphone}"])
        context = browser.new_context(permissions=["microphone"])
        context.add_init_script(RECORD_PLAYBACK)
        pg = context.new_page()
        pg.set_default_timeout(120_000)
        pg.goto(url + "/")
        pg.locator("#chat-input").wait_for()
        pg.wait_for_timeout(1000)
        okay = pg.get_by_text("Okay, Let's Go!")        # the release notes Open WebUI shows on a first visit
        if okay.is_visible():
            okay.click()
        try:
            yield pg
        finally:
            pg.screenshot(path=str(tmp_path / "page.png"))
            browser.close()


def transcribe(served, path: Path) -> str:
    import requests
    with path.open("rb") as f:
        r = requests.post(served.url + "/v1/audio/transcriptions", files={"file": (path.name, f)},
                          data={"model": ASR}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["text"]


def answered(served, endpoint: str) -> float:
    """How many requests to `endpoint` the server answered with a 200 so far."""
    return served.metrics().get(f'jetson_llm_requests_total{{endpoint="{endpoint}",status="200"}}', 0.0)


def played_speech(served, page, request: dict) -> tuple[float, float]:
    """The last speech the page played to its end (an object URL: Open WebUI's MP3 of our WAV), fetched back from the
    page and decoded, against the WAV our server speaks for the same request: (cosine at lag 0, its duration s)."""
    import numpy as np
    import requests

    from pipeline.audio import read_wav
    src = page.evaluate("window.__played.filter(p => p.src.startsWith('blob:') && p.ended).pop().src")
    mp3 = bytes(page.evaluate("async s => Array.from(new Uint8Array(await (await fetch(s)).arrayBuffer()))", src))
    pcm = subprocess.run(["ffmpeg", "-nostdin", "-loglevel", "error", "-i", "-", "-f", "s16le", "-ac", "1", "-ar",
                          "24000", "-"], input=mp3, capture_output=True, check=True).stdout
    heard = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    r = requests.post(served.url + "/v1/audio/speech", json=request, timeout=180)
    assert r.status_code == 200, r.text
    wav = read_wav(r.content)
    ours = np.asarray(wav.samples, dtype=np.float64)
    n = min(len(heard), len(ours))
    # the MP3 decoder trims the encoder's delay (LAME's header): the samples line up; its last frame is padded
    assert len(ours) <= len(heard) < len(ours) + 1152, (len(heard), len(ours))
    cosine = float(heard[:n] @ ours[:n] / (np.linalg.norm(heard[:n]) * np.linalg.norm(ours[:n])))
    return cosine, len(ours) / wav.rate


def speech_request(text: str) -> dict:
    """What Open WebUI sends our /v1/audio/speech for `text`: the browser's input and voice, its TTS model and the
    admin's additional parameters."""
    return {"input": text, "voice": VOICE, "model": TTS, "max_audio_length": FRAMES}


def test_voice_input_writes_the_servers_transcript_of_the_browsers_recording_into_the_chat_box(served, webui, page):
    """The microphone button, three seconds of speech, the confirm button: the browser uploads its WebM/Opus recording
    to Open WebUI, which converts it to MP3 and posts that to our /v1/audio/transcriptions; the text lands in the chat
    box. Both the browser's recording and the MP3 Open WebUI sent (it keeps them) transcribe to those words again."""
    _, data = webui
    before = answered(served, "/v1/audio/transcriptions")
    page.get_by_role("button", name="Voice Input").click()
    confirm = page.get_by_role("button", name="Confirm recording")
    confirm.wait_for()
    page.wait_for_timeout(3000)
    with page.expect_response(lambda r: r.url.endswith("/api/v1/audio/transcriptions")) as answer:
        confirm.click()
    assert answer.value.status == 200, answer.value.text()
    text = answer.value.json()["text"]
    assert text.strip(), "the transcript is empty"
    page.wait_for_function("t => document.getElementById('chat-input').innerText.includes(t)", arg=text.strip())
    assert answered(served, "/v1/audio/transcriptions") == before + 1
    recording = data / "cache" / "audio" / "transcriptions" / answer.value.json()["filename"]
    sent = recording.with_suffix(".mp3")
    assert recording.read_bytes()[:4] == b"\x1aE\xdf\xa3", "not the WebM (Matroska) the browser records"
    assert transcribe(served, recording) == transcribe(served, sent) == text


def test_read_aloud_plays_the_servers_speech(served, webui, page):
    """A chat answered by the chat recipe, then its "Read Aloud": Open WebUI asks our /v1/audio/speech for each
    sentence with its TTS model, voice and parameters and hands the speech (transcoded to MP3) to the browser, which
    plays it; what it played is our server's speech of that sentence (the decoded MP3 against our WAV)."""
    spoken: list[str] = []
    page.on("request", lambda r: spoken.append(json.loads(r.post_data or "{}")["input"])
            if r.url.endswith("/api/v1/audio/speech") else None)
    page.locator("#chat-input").fill("Say something short.")
    page.keyboard.press("Enter")
    read_aloud = page.get_by_role("button", name="Read Aloud").last
    read_aloud.wait_for()
    before = answered(served, "/v1/audio/speech")
    read_aloud.click()
    page.wait_for_function("window.__played.some(p => p.src.startsWith('blob:') && p.ended)", timeout=180_000)
    assert not page.evaluate("window.__played.filter(p => p.error).map(p => p.error)")
    assert spoken and answered(served, "/v1/audio/speech") >= before + 1
    cosine, seconds = played_speech(served, page, speech_request(spoken[0]))
    assert cosine > 0.99 and seconds == FRAMES * 1920 / 24000, (cosine, seconds)


def test_voice_mode_hears_the_user_answers_and_speaks_the_answer(served, webui, page):
    """Voice mode (the call overlay): the microphone's speech, then silence, ends the user's turn; Open WebUI
    transcribes it through our server and sends the words as the chat's message to our chat recipe, then speaks the
    answer's sentences through our server as they arrive."""
    sent: list[dict] = []
    page.on("request", lambda r: sent.append(json.loads(r.post_data or "{}"))
            if r.url.endswith("/api/chat/completions") else None)
    spoken: list[str] = []
    page.on("request", lambda r: spoken.append(json.loads(r.post_data or "{}")["input"])
            if r.url.endswith("/api/v1/audio/speech") else None)
    with page.expect_response(lambda r: r.url.endswith("/api/v1/audio/transcriptions"),
                              timeout=120_000) as heard:
        page.get_by_role("button", name="Voice mode").click()
    assert heard.value.status == 200, heard.value.text()
    words = heard.value.json()["text"]
    page.wait_for_function("window.__played.some(p => p.src.startsWith('blob:') && p.ended)", timeout=240_000)
    # the browser sends the user's message (Open WebUI's backend builds the chat it asks our server from it)
    assert sent and sent[0]["model"] == CHAT and sent[0]["user_message"]["content"] == words, sent[:1]
    assert answered(served, "/v1/chat/completions") >= 1
    cosine, _ = played_speech(served, page, speech_request(spoken[0]))
    assert cosine > 0.99, cosine
