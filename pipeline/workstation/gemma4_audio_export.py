"""export (edgellm backend): Gemma 4's audio tower beside its language model, as Edge-LLM 0.11 exports it, checked
against transformers' tower on the builtin recordings.

What Edge-LLM 0.11's exporter does with it (read from the 0.11.0 wheel: scripts/export.py `_export_audio`,
onnx/export_encoder.py `export_audio_onnx`, models/gemma4/modeling_gemma4_audio.py `build_gemma4_audio`):

- `tensorrt-edgellm-export CKPT OUT --skip-llm --skip-visual` writes OUT/audio/: model.onnx + model.onnx.data (FP16:
  the tower, output_proj and the model's embed_audio in one graph; input_features [1, T, 128], valid [1, T/4] ->
  last_hidden_state [1, T/4, text hidden], one trt_edgellm::Gemma4AudioAttentionPlugin per layer) and config.json
  (model_type gemma4_audio, audio_config, builder_config, and audio_token_id / boa_token_id / eoa_token_id, which the
  runner expands a recording's placeholder with; it reads eoa_token_index before eoa_token_id).
- It reads the tensors under model.audio_tower. and model.embed_audio. as they are (its FP16 linears refuse float32
  input, so they are written here in FP16) and the config as transformers saves it. So it reads a directory written for
  it here: those tensors and config.json, nothing else (the language model is exported from the unified checkpoint).

The check (workstation/gemma4_attention.py says how the plugin is computed): the graph in ONNX's reference evaluator
on the board's log-mel of each builtin recording (workstation/gemma4_features.py), against transformers'
get_audio_features on the same frames, its weights as the FP16 graph holds them; and the config's token ids against the
checkpoint's, which transformers places.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from pipeline.backends.edgellm_layout import AUDIO_DIR, LLM_DIR
from pipeline.contract import AudioExport, OnnxGraph
from pipeline.errors import PipelineError
from pipeline.families.gemma4_audio import GEMMA4_AUDIO
from pipeline.workstation.export_steps import PartExport

GRAPH_INPUTS = ("input_features", "valid")
GRAPH_OUTPUTS = ("last_hidden_state",)
ATTENTION = "trt_edgellm:Gemma4AudioAttentionPlugin"
# the runner's token ids (config.json key it writes -> the checkpoint's key transformers places it by)
TOKEN_IDS = (("audio_token_id", "audio_token_id"), ("boa_token_id", "boa_token_id"), ("eoa_token_id", "eoa_token_id"))


def write_export_input(model_dir: Path, out: Path) -> Path:
    """The directory Edge-LLM's exporter reads the tower from (the module docstring says why it is written)."""
    from safetensors.torch import save_file

    from pipeline.workstation.audio_export import fp16_tensors
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: tensor for _, name, tensor in fp16_tensors(model_dir, GEMMA4_AUDIO.modules)}
    if not any(n.startswith(GEMMA4_AUDIO.modules[0]) for n in tensors) or \
            not any(n.startswith(GEMMA4_AUDIO.modules[1]) for n in tensors):
        raise PipelineError(f"{model_dir}: the audio tower's tensors ({', '.join(GEMMA4_AUDIO.modules)}) are not all "
                            "there", "fetch the whole checkpoint")
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    shutil.copyfile(model_dir / "config.json", out / "config.json")
    return out


def export_tower(model_dir: Path, work: Path, out: Path) -> Path:
    """Edge-LLM's audio/ export of the checkpoint's tower under `out`; `work` holds the exporter's input."""
    from pipeline.workstation.audio_export import run_export
    return run_export(write_export_input(model_dir, work), out, ["--skip-llm", "--skip-visual"], model_dir)


def check_token_ids(config_path: Path, model_dir: Path) -> None:
    """The ids the runner expands a recording with are the ones transformers places (config.json's)."""
    exported = json.loads(config_path.read_text())
    native = json.loads((model_dir / "config.json").read_text())
    for ours, theirs in TOKEN_IDS:
        if exported.get(ours) != native.get(theirs):
            raise PipelineError(f"{config_path}: {ours} is {exported.get(ours)}, where the checkpoint's "
                                f"config.json has {theirs} = {native.get(theirs)} (Edge-LLM 0.11 reads "
                                "eoa_token_index before eoa_token_id): the board would mark the recording with "
                                "tokens the model was not trained with",
                                "make the checkpoint's eoa_token_index and eoa_token_id agree, as the released "
                                "checkpoints' do")


def reference_model(model_dir: Path):
    """transformers' model in float32, the tower's weights as the FP16 graph holds them."""
    import torch
    from transformers import Gemma4ForConditionalGeneration
    model = Gemma4ForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    for name, p in model.named_parameters():
        if name.startswith(GEMMA4_AUDIO.modules):
            p.data = p.data.half().float()
    return model


def reference_tokens(model, features: np.ndarray) -> np.ndarray:
    """transformers' soft tokens [T/4, text hidden] of the board's frames [T, 128] (every frame valid)."""
    import torch
    x = torch.from_numpy(features[None].astype(np.float32))
    with torch.no_grad():
        out = model.model.get_audio_features(x, torch.ones(1, x.shape[1], dtype=torch.bool))
    return out.pooler_output[0].float().numpy()


def check_tower(onnx_path: Path, model, recordings: list[np.ndarray], mask_kind: str = "transformers"
                ) -> tuple[float, float]:
    """(largest difference over the reference's scale, lowest cosine) of the graph against `model` on each
    recording's frames; raises naming them when they exceed FP16's (the bounds of Qwen3-ASR's encoder check:
    audio_check.EncoderAgreement)."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    from pipeline.workstation.audio_check import agreement_of
    from pipeline.workstation.gemma4_attention import gemma4_audio_attention_op
    from pipeline.workstation.onnx_reference import encoder_ops
    session = ReferenceEvaluator(onnx.load(str(onnx_path)),
                                 new_ops=[gemma4_audio_attention_op(mask_kind), *encoder_ops()])
    pairs = []
    for features in recordings:
        (ours,) = session.run(None, {"input_features": features[None].astype(np.float16),
                                     "valid": np.ones((1, len(features) // 4), bool)})
        ours, ref = ours[0].astype(np.float32), reference_tokens(model, features)
        if ours.shape != ref.shape:
            raise PipelineError(f"{onnx_path}: {ours.shape[0]} soft tokens from {len(features)} frames, where "
                                f"transformers makes {ref.shape[0]}", "this is a bug in the Edge-LLM audio export "
                                "path; please report it with the recipe")
        pairs.append((ours, ref))
    agreement = agreement_of(pairs)
    if agreement.problems():
        raise PipelineError(f"{onnx_path}: the exported audio tower disagrees with the checkpoint's: "
                            f"{'; '.join(agreement.problems())}", "this is a bug in the Edge-LLM audio export path; "
                            "please report it with the recipe")
    return agreement.max_relative_error, agreement.cosine


def export_audio_tower(model_dir: Path, scratch: Path, payload_dir: Path) -> AudioExport:
    """The tower through Edge-LLM's exporter into onnx/audio, its graph and ids checked for the runner, its numerics
    against transformers' on the builtin recordings."""
    from pipeline.audio import read_wav
    from pipeline.recordings import BUILTIN_RECORDINGS
    from pipeline.workstation.gemma4_features import check_extractor_settings, recording_log_mel
    from pipeline.workstation.onnx_graph import check_graph

    check_extractor_settings(model_dir)
    out, work = scratch / "edgellm-audio", scratch / "audio-checkpoint"
    for d in (out, work):
        shutil.rmtree(d, ignore_errors=True)
    graph = export_tower(model_dir, work, out)
    shutil.move(str(graph.parent), str(payload_dir / AUDIO_DIR))
    for d in (out, work):
        shutil.rmtree(d, ignore_errors=True)
    onnx_path = payload_dir / AUDIO_DIR / "model.onnx"
    described = check_graph(onnx_path, GRAPH_INPUTS, GRAPH_OUTPUTS, extra_files=("config.json",),
                            consumer="audio_build", attention=ATTENTION)
    check_token_ids(onnx_path.parent / "config.json", model_dir)
    recordings = [recording_log_mel(read_wav(r.wav(), name=f"builtin:{r.name}"), f"builtin:{r.name}")
                  for r in BUILTIN_RECORDINGS.values()]
    worst, cosine = check_tower(onnx_path, reference_model(model_dir), recordings)
    return AudioExport(design=GEMMA4_AUDIO.name, recordings=len(recordings), max_relative_error=round(worst, 6),
                       cosine=round(cosine, 7), onnx=OnnxGraph(**described))


class Gemma4AudioExport(PartExport):
    """The Edge-LLM export's steps for Gemma 4's audio tower (workstation/export_steps.py): the language model's graph
    in onnx/llm, the tower's in onnx/audio."""
    llm_subdir = LLM_DIR

    def beside(self, _part, model_dir: Path, scratch: Path, payload_dir: Path, _state) -> AudioExport:
        return export_audio_tower(model_dir, scratch, payload_dir)
