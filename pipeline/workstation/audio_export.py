"""export (edgellm backend, speech-to-text models): the audio encoder as Edge-LLM 0.11 ONNX (audio/), checked against
transformers' model (workstation/audio_check.py).

What Edge-LLM 0.11's exporter does with Qwen3-ASR's encoder (read from the 0.11.0 wheel: tensorrt_edgellm/scripts/
export.py `_export_audio`, onnx/export_encoder.py `export_audio_onnx`, models/qwen3_asr/modeling_qwen3_asr_audio.py):

- `tensorrt-edgellm-export CKPT OUT --skip-llm` (`python -m tensorrt_edgellm.scripts.export`) writes OUT/audio/:
  model.onnx + model.onnx.data (FP16) and config.json (model_type qwen3_asr_thinker, audio_config, and the audio
  token ids it finds in thinker_config: audioRunner.cpp reads audio_token_id there).
- It reads the encoder from the checkpoint's tensors under `thinker.audio_tower.` (or `audio_tower.`,
  `model.audio_tower.`) with its projection inside it (proj1, proj2): the original layout. transformers' -hf layout,
  the one this pipeline builds from, keeps the projection beside the encoder (multi_modal_projector.linear_1/2), which
  its loader would not find. So it reads a directory written for it here: the encoder's tensors in FP16 under their
  thinker names (families/layouts.py QWEN3_ASR_THINKER_NAMES) and config.json in the thinker layout; nothing else.
- Its encoder is built in FP16 and its FP16 linears refuse float32 input: the tensors it reads must be FP16.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from pipeline.backends.edgellm_layout import AUDIO_DIR, LLM_DIR
from pipeline.contract import AudioExport, OnnxGraph
from pipeline.errors import PipelineError
from pipeline.families.layouts import QWEN3_ASR_THINKER_NAMES, rename, thinker_config
from pipeline.workstation.export_steps import PartExport

EXPORT_TIMEOUT_S = 3600
ENCODER_MODULES = ("model.audio_tower.", "model.multi_modal_projector.")


def fp16_tensors(model_dir: Path, prefixes: tuple[str, ...]):
    """(shard, name, tensor) of each of the checkpoint's tensors under `prefixes`, its floating ones in FP16: what
    Edge-LLM's exporter builds an encoder from (its FP16 linears refuse float32 input)."""
    import torch
    from safetensors import safe_open
    for shard in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as fh:
            for name in fh.keys():
                if name.startswith(prefixes):
                    t = fh.get_tensor(name)
                    yield shard, name, (t.to(torch.float16) if t.is_floating_point() else t).contiguous()


def run_export(source: Path, out: Path, flags: list[str], model_dir: Path) -> Path:
    """`tensorrt-edgellm-export SOURCE OUT FLAGS` for the audio/ graph of the checkpoint at `model_dir`, bounded in
    time; returns the graph's path, or an error with the exporter's last lines."""
    argv = [sys.executable, "-m", "tensorrt_edgellm.scripts.export", str(source), str(out), *flags]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PipelineError(f"Edge-LLM's audio export of {model_dir} took over {EXPORT_TIMEOUT_S} s",
                            "see the machine's load; run the export again") from None
    graph = out / AUDIO_DIR / "model.onnx"
    if done.returncode != 0 or not graph.is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise PipelineError(f"Edge-LLM's audio export of {model_dir} failed (exit {done.returncode}): "
                            + " | ".join(tail), "see the exporter's message above")
    return graph


def write_export_input(model_dir: Path, out: Path) -> Path:
    """The directory Edge-LLM's exporter reads the encoder from (the module docstring says why it is written)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for shard, name, tensor in fp16_tensors(model_dir, ENCODER_MODULES):
        thinker = rename(name, QWEN3_ASR_THINKER_NAMES, to_native=False)
        if thinker is None:
            raise PipelineError(f"{shard}: {name} has no name in Qwen3-ASR's original layout",
                                "use a Qwen3-ASR checkpoint as transformers saves it")
        tensors[thinker] = tensor
    if not tensors:
        raise PipelineError(f"{model_dir}: no audio encoder tensors ({', '.join(ENCODER_MODULES)})",
                            "fetch the whole checkpoint")
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    native = json.loads((model_dir / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(thinker_config(native), indent=2) + "\n")
    return out


def export_audio(model_dir: Path, work: Path, out: Path) -> Path:
    """Edge-LLM's audio/ export of the checkpoint at `model_dir` (native layout) under `out`; `work` holds the
    exporter's input. Returns the graph's path."""
    return run_export(write_export_input(model_dir, work), out, ["--skip-llm"], model_dir)


def reference_model(model_dir: Path):
    """transformers' model of the checkpoint in float32, its encoder's weights as the FP16 graph holds them."""
    import torch
    from transformers import Qwen3ASRForConditionalGeneration
    model = Qwen3ASRForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    for name, p in model.named_parameters():
        if name.startswith(ENCODER_MODULES):
            p.data = p.data.half().float()
    return model


def export_encoder(model_dir: Path, scratch: Path, payload_dir: Path, design_name: str) -> AudioExport:
    """The encoder through Edge-LLM's exporter into onnx/audio, its graph checked for audio_build and its numerics
    against transformers' on the builtin recordings (their log-mel features by the checkpoint's own extractor)."""
    from pipeline.audio import read_wav
    from pipeline.recordings import BUILTIN_RECORDINGS
    from pipeline.workstation.audio_check import GRAPH_INPUTS, GRAPH_OUTPUTS, check_encoder
    from pipeline.workstation.onnx_graph import check_graph
    from pipeline.workstation.speech_features import feature_extractor, log_mel

    out = scratch / "edgellm-audio"
    for d in (out, scratch / "audio-checkpoint"):
        shutil.rmtree(d, ignore_errors=True)
    graph = export_audio(model_dir, scratch / "audio-checkpoint", out)
    shutil.move(str(graph.parent), str(payload_dir / AUDIO_DIR))
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(scratch / "audio-checkpoint", ignore_errors=True)
    onnx_path = payload_dir / AUDIO_DIR / "model.onnx"
    # explicit softmax attention (no plugin): its Softmax is the attention check_graph looks for
    described = check_graph(onnx_path, GRAPH_INPUTS, GRAPH_OUTPUTS, extra_files=("config.json",),
                            consumer="audio_build", attention=":Softmax")
    extractor = feature_extractor(model_dir)
    recordings = [log_mel(extractor, read_wav(r.wav(), name=f"builtin:{r.name}"), f"builtin:{r.name}")
                  for r in BUILTIN_RECORDINGS.values()]
    agreement = check_encoder(onnx_path, reference_model(model_dir), recordings)
    return AudioExport(design=design_name, recordings=agreement.recordings,
                       max_relative_error=round(agreement.max_relative_error, 6), cosine=round(agreement.cosine, 7),
                       onnx=OnnxGraph(**described))


class AudioEncoderExport(PartExport):
    """The Edge-LLM export's steps for a speech model's audio encoder (workstation/export_steps.py): the language
    model's graph in onnx/llm, the encoder's in onnx/audio, checked against transformers' encoder."""
    llm_subdir = LLM_DIR

    def beside(self, part, model_dir: Path, scratch: Path, payload_dir: Path, _state) -> AudioExport:
        return export_encoder(model_dir, scratch, payload_dir, part.design.name)
