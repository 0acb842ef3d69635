"""Qwen3-TTS's official implementation (qwen-tts 0.1.1, installed by `./bootstrap.sh --test-tools` into
.venv/qwen-tts-reference with the transformers 4.57.3 it pins), run in a process of its own: the independent check of
pipeline/workstation/synthesis_reference.py's generation loop and of Edge-LLM's Code2Wav.

qwen-tts imports torchaudio, librosa, sox, soundfile and onnxruntime at module level for audio I/O and the Base
model's speaker encoder; none of them is on the paths compared here (CustomVoice generation from token ids, the 12 Hz
tokenizer's decoder), so they are stubbed (empty modules) rather than installed.

    python tests/official_qwen_tts.py MODEL_DIR REQUESTS.json OUT.npz

REQUESTS: {"generate": [{"text", "speaker", "language", "max_frames", "repetition_penalty"}...],
           "decode": [[[code x 16] x frames]...]}; OUT: generate_<i> ([frames, 16] codes), decode_<i> (samples).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / ".venv" / "qwen-tts-reference"
STUBBED = ("torchaudio", "librosa", "sox", "soundfile", "onnxruntime")


def run(model_dir: Path, requests: dict, out: Path, timeout: float = 600) -> dict:
    """The official outputs for `requests` (see the module docstring), as numpy arrays by name."""
    import numpy as np
    if not (REFERENCE / ".pinned-qwen-tts-0.1.1").is_file():
        raise AssertionError(f"{REFERENCE} is missing: run ./bootstrap.sh --test-tools")
    spec = out.with_suffix(".json")
    spec.write_text(json.dumps(requests))
    env = dict(os.environ, PYTHONPATH=str(REFERENCE), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, __file__, str(model_dir), str(spec), str(out)], capture_output=True,
                          text=True, timeout=timeout, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(out) as npz:
        return {k: npz[k] for k in npz.files}


class _Stub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__path__ = []
        module.__getattr__ = lambda attr: None


def _main(model_dir: Path, spec: Path, out: Path) -> None:
    sys.meta_path.insert(0, _Stub())
    import numpy as np
    import torch
    import transformers
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig
    from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSForConditionalGeneration
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2DecoderConfig
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Decoder
    from safetensors.torch import load_file
    assert transformers.__version__ == "4.57.3", transformers.__version__   # the pinned one, not the venv's

    requests = json.loads(spec.read_text())
    arrays = {}
    config = json.loads((model_dir / "config.json").read_text())
    model = Qwen3TTSForConditionalGeneration(Qwen3TTSConfig(**config)).float().eval()
    missing, unexpected = model.load_state_dict(load_file(str(model_dir / "model.safetensors")), strict=False)
    # a CustomVoice checkpoint holds the talker only: the speaker encoder (Base models) is all that may be missing
    assert not unexpected and all(k.startswith("speaker_encoder.") for k in missing), (missing, unexpected)
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(str(model_dir))
    for i, r in enumerate(requests.get("generate", [])):
        text = f"<|im_start|>assistant\n{r['text']}<|im_end|>\n<|im_start|>assistant\n"
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            # max_new_tokens counts codebook-0 tokens: the last one's other codebooks are made by a step that
            # never runs, so N frames take N + 1 (an EOS ends it earlier)
            codes, _ = model.generate(input_ids=[ids], languages=[r["language"]], speakers=[r["speaker"]],
                                      do_sample=False, subtalker_dosample=False,
                                      repetition_penalty=r["repetition_penalty"], max_new_tokens=r["max_frames"] + 1)
        arrays[f"generate_{i}"] = codes[0].numpy()
    if requests.get("decode"):
        speech = model_dir / "speech_tokenizer"
        decoder_config = json.loads((speech / "config.json").read_text())["decoder_config"]
        decoder = Qwen3TTSTokenizerV2Decoder(Qwen3TTSTokenizerV2DecoderConfig(**decoder_config)).float().eval()
        weights = {k[len("decoder."):]: v for k, v in load_file(str(speech / "model.safetensors")).items()
                   if k.startswith("decoder.")}
        decoder.load_state_dict(weights, strict=True)
        for i, frames in enumerate(requests["decode"]):
            with torch.no_grad():
                arrays[f"decode_{i}"] = decoder(torch.tensor(frames).T[None])[0, 0].numpy()
    np.savez(out, **arrays)


if __name__ == "__main__":
    _main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
