"""export (edgellm backend, Nemotron-3.5-ASR): the RNN-T's two graphs as TensorRT Edge-LLM 0.11's exporter writes them,
checked for audio_build and against transformers' model.

`tensorrt-edgellm-export CKPT OUT` (`python -m tensorrt_edgellm.scripts.export`; its Nemotron-3.5-ASR guide) writes
    OUT/audio/         model.onnx (+ .data), config.json (the checkpoint's, verbatim), tokenizer.json,
                       processor_config.json (+ tokenizer_config.json where the checkpoint has one): the encoder,
                       (input_features [1, T_mel, 128] FP16, prompt_ids [1] INT64) -> encoder_frames [1, T, H]
    OUT/rnnt_decoder/  model.onnx, config.json (a `rnnt_decoder_config` marker: audio_build builds a static step):
                       one RNN-T step, (decoder_input_ids [1, 1] INT64, hidden_state, cell_state [L, 1, H] FP16,
                       encoder_frame [1, H] FP16) -> (logits [1, V], present_hidden_state, present_cell_state)
both in FP16 (its only format for this model). The graphs are evaluated by ONNX's reference evaluator
(workstation/onnx_reference.py) on the builtin recordings' features (transducer_features.py, as the runtime computes
them) and on the steps transformers' greedy loop takes over them, against transformers' model in float32 with the
weights the graphs hold (FP16).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from pipeline.contract import OnnxGraph, TransducerExport
from pipeline.errors import PipelineError

AUDIO_DIR, RNNT_DIR = "audio", "rnnt_decoder"
ENCODER_INPUTS, ENCODER_OUTPUTS = ("input_features", "prompt_ids"), ("encoder_frames",)
STEP_INPUTS = ("decoder_input_ids", "hidden_state", "cell_state", "encoder_frame")
STEP_OUTPUTS = ("logits", "present_hidden_state", "present_cell_state")
RUNTIME_FILES = ("config.json", "tokenizer.json", "processor_config.json")
# FP16 graphs against the float32 reference (the audio encoder's bounds, workstation/audio_check.py)
MAX_RELATIVE_ERROR = 2e-2
MIN_COSINE = 0.999
BUG = "this is a bug in the Edge-LLM export path; please report it with the recipe"


def _relative(ours: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    ours, ref = ours.astype(np.float32), ref.astype(np.float32)
    worst = float(np.abs(ours - ref).max() / max(float(np.abs(ref).max()), 1e-6))
    cosine = float((ours * ref).sum() / max(float(np.linalg.norm(ours) * np.linalg.norm(ref)), 1e-12))
    return worst, cosine


def _step_check(step, layers: int, width: int, seen: list[tuple[float, float]]):
    """greedy's `visit`: each step fed to the step graph as the runtime feeds it, its logits' agreement kept."""
    def visit(_t, frame, token, state, logits) -> None:
        zeros = np.zeros((layers, 1, width), np.float16)
        h, c = (zeros, zeros) if state is None else (s.numpy().astype(np.float16) for s in state)
        (got, _, _) = step.run(None, {"decoder_input_ids": np.array([[token]], np.int64), "hidden_state": h,
                                      "cell_state": c, "encoder_frame": frame.numpy().astype(np.float16)[None]})
        seen.append(_relative(got[0], logits.numpy()))
    return visit


def check_graphs(encoder_path: Path, step_path: Path, model, recordings: list[np.ndarray], prompt_id: int
                 ) -> tuple[float, float, float, float, int]:
    """(encoder's worst relative error, its least cosine, the step's worst logits error, its least cosine, steps
    compared): each recording's features through the encoder graph and transformers' encoder, then the greedy loop's
    steps through the step graph and transformers' prediction network and joint, from the same states."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    from pipeline.workstation.onnx_reference import encoder_ops
    from pipeline.workstation.transducer_reference import encoder_frames, greedy
    encoder = ReferenceEvaluator(onnx.load(str(encoder_path)), new_ops=encoder_ops())
    step = ReferenceEvaluator(onnx.load(str(step_path)), new_ops=encoder_ops())
    layers, width = model.config.num_decoder_layers, model.config.decoder_hidden_size
    e_worst, e_cos, s_worst, s_cos, steps = 0.0, 1.0, 0.0, 1.0, 0
    for features in recordings:
        (ours,) = encoder.run(None, {"input_features": features.astype(np.float16)[None],
                                     "prompt_ids": np.array([prompt_id], np.int64)})
        ref = encoder_frames(model, features, prompt_id).numpy()
        if ours.shape[1:] != ref.shape:
            raise PipelineError(f"{encoder_path}: {ours.shape[1]} encoder frames of {ours.shape[2]} from "
                                f"{features.shape[0]} mel frames, where transformers makes {ref.shape[0]} of "
                                f"{ref.shape[1]}", BUG)
        worst, cosine = _relative(ours[0], ref)
        e_worst, e_cos = max(e_worst, worst), min(e_cos, cosine)
        # every step transformers' greedy loop takes, fed to the step graph as the runtime feeds it: the token, the
        # state (zeros at first) and the frame, in FP16
        seen: list[tuple[float, float]] = []
        greedy(model, features, prompt_id, _step_check(step, layers, width, seen))
        s_worst = max([s_worst, *(w for w, _ in seen)])
        s_cos = min([s_cos, *(c for _, c in seen)])
        steps += len(seen)
    problems = [f"its {what} is off by up to {w:.2%} of its largest value (at most {MAX_RELATIVE_ERROR:.0%})"
                for what, w in (("encoder", e_worst), ("RNN-T step", s_worst)) if w > MAX_RELATIVE_ERROR]
    problems += [f"its {what}'s cosine with transformers' is {c:.5f} (at least {MIN_COSINE})"
                 for what, c in (("encoder", e_cos), ("RNN-T step", s_cos)) if c < MIN_COSINE]
    if problems:
        raise PipelineError(f"{encoder_path.parent.parent}: the exported Nemotron-3.5-ASR graphs disagree with the "
                            f"checkpoint's: {'; '.join(problems)}", BUG)
    return e_worst, e_cos, s_worst, s_cos, steps


def export_transducer(model_dir: Path, payload_dir: Path) -> dict:
    """The checkpoint at `model_dir` through Edge-LLM's exporter into payload_dir (audio/, rnnt_decoder/), checked;
    the export record's fields (families/audio.py SpeechModel.export)."""
    from pipeline.audio import read_wav
    from pipeline.recordings import BUILTIN_RECORDINGS
    from pipeline.runtime.transducer import prompts_of
    from pipeline.workstation.onnx_graph import check_graph
    from pipeline.workstation.synthesis_export import _run
    from pipeline.workstation.transducer_checkpoint import read_json
    from pipeline.workstation.transducer_features import log_mel
    from pipeline.workstation.transducer_reference import load_reference

    _run([sys.executable, "-m", "tensorrt_edgellm.scripts.export", str(model_dir), str(payload_dir)],
         "Nemotron-3.5-ASR", model_dir)
    encoder_path, step_path = payload_dir / AUDIO_DIR / "model.onnx", payload_dir / RNNT_DIR / "model.onnx"
    encoder = check_graph(encoder_path, ENCODER_INPUTS, ENCODER_OUTPUTS, extra_files=RUNTIME_FILES,
                          consumer="audio_build", attention=":Softmax")
    step = check_graph(step_path, STEP_INPUTS, STEP_OUTPUTS, extra_files=("config.json",), consumer="audio_build",
                       attention=":Sigmoid")
    marker = read_json(payload_dir / RNNT_DIR / "config.json", str(step_path.parent))
    if not isinstance(marker.get("rnnt_decoder_config"), dict):
        raise PipelineError(f"{step_path.parent / 'config.json'} has no rnnt_decoder_config: audio_build would not "
                            "build it as the RNN-T step", BUG)
    model = load_reference(model_dir)
    prompts = prompts_of(payload_dir / AUDIO_DIR)       # the exported config.json is the checkpoint's
    recordings = [log_mel(read_wav(r.wav(), name=f"builtin:{r.name}").samples) for r in BUILTIN_RECORDINGS.values()]
    e_worst, e_cos, s_worst, s_cos, steps = check_graphs(encoder_path, step_path, model, recordings, prompts["auto"])
    return {"transducer": TransducerExport(
        encoder=OnnxGraph(**encoder), step=OnnxGraph(**step), recordings=len(recordings),
        encoder_max_relative_error=round(e_worst, 6), encoder_cosine=round(e_cos, 7), steps=steps,
        step_max_relative_error=round(s_worst, 6), step_cosine=round(s_cos, 7),
        languages=sorted(k for k in prompts if k != "auto"))}
