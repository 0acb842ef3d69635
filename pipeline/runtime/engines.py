"""Serving sessions, one per backend (SESSIONS, registered per backend as RUNNERS and EXPORTERS are): each class
opens the engine directory of a verified kit or bundle with the plan's limits (`open`), says what it cannot serve
(`refuses`) and how its runtime reports its KV cache (`reported_kv_allocation`)."""

from __future__ import annotations

from pipeline.backends import edgellm, trtllm012
from pipeline.runtime.edgellm import EdgellmSession
from pipeline.runtime.session import EngineSession
from pipeline.runtime.speech import EdgellmSpeechSession
from pipeline.runtime.transducer import TranscriberSession
from pipeline.runtime.trtllm import TrtllmSession

SESSIONS: dict[str, type[EngineSession]] = {trtllm012.BACKEND.name: TrtllmSession, edgellm.BACKEND.name: EdgellmSession}
# text-to-speech models (Plan.speech), served by their own runtime: Edge-LLM's TTSRuntime
SPEECH_SESSIONS: dict[str, type[EdgellmSpeechSession]] = {edgellm.BACKEND.name: EdgellmSpeechSession}
# RNN-T speech-to-text models (Plan.speech, speech to text), served by their own runtime: Edge-LLM's NemotronAsrRuntime
TRANSCRIBER_SESSIONS: dict[str, type[TranscriberSession]] = {edgellm.BACKEND.name: TranscriberSession}
