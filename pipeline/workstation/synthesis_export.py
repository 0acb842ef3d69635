"""export (edgellm backend, text-to-speech models): Qwen3-TTS's talker, code predictor and Code2Wav as TensorRT Edge-LLM
0.11 ONNX, the layout its TTS guide builds from (user_guide/examples/tts.md):

    onnx/llm/             the talker (model.onnx + .data, config.json with the speakers, languages and protocol ids,
                          embedding.safetensors: the codec embedding, text_embedding.safetensors,
                          text_projection.safetensors, the tokenizer)
    onnx/code_predictor/  model.onnx (its 15 heads an input, picked by lm_head_idx), codec_embeddings.safetensors,
                          lm_heads.safetensors; small_to_mtp_projection.safetensors where the code predictor is
                          narrower than the talker (the 1.7B: the runtime projects every row it feeds the graph)
    onnx/code2wav/        model.onnx (codes [batch, 16, frames] -> waveform [batch, 1, 1920 x frames]), config.json

`tensorrt-edgellm-export CKPT OUT` writes all three, but its Code2Wav step moves the decoder to CUDA
(export_qwen3_tts_code2wav's default device): on a workstation without a GPU it fails. So the talker and code
predictor go through the CLI with --skip-code2wav, and Code2Wav through the same function the CLI calls, on the GPU
where there is one, else on the CPU (the graph is traced, not computed: the same ONNX).

The talker and code predictor graphs carry Edge-LLM's attention plugin, which nothing here can run: they are checked
for what llm_build expects (workstation/onnx_graph.py), their numerics by the device validation against the goldens.
Code2Wav is plain ONNX: ONNX's reference evaluator runs the FP16 graph here against the reference decoder on codes of
several lengths.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pipeline.contract import OnnxGraph, SynthesisExport
from pipeline.errors import PipelineError

EXPORT_TIMEOUT_S = 3600
TALKER_DIR, CODE_PREDICTOR_DIR, CODE2WAV_DIR = "llm", "code_predictor", "code2wav"
LLM_INPUTS = ("inputs_embeds", "rope_rotary_cos_sin", "kv_page_table", "logits_indices")
LLM_OUTPUTS = ("logits", "hidden_states")
# what each part's runtime reads beside its graph (Edge-LLM's TTS runtime: talker and code predictor engine dirs)
TALKER_FILES = ("config.json", "embedding.safetensors", "text_embedding.safetensors", "text_projection.safetensors",
                "tokenizer.json")
CODE_PREDICTOR_FILES = ("config.json", "codec_embeddings.safetensors", "lm_heads.safetensors")
CHECK_FRAMES = (1, 5, 13)       # Code2Wav checked on one frame, a few, and past its 2 x 2 upsampling's reach
MIN_COSINE = 0.999              # the FP16 graph against the float32 decoder (the twin's: 0.9999995)


def _run(argv: list[str], what: str, model_dir: Path) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PipelineError(f"Edge-LLM's {what} export of {model_dir} took over {EXPORT_TIMEOUT_S} s",
                            "see the machine's load; run the export again") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise PipelineError(f"Edge-LLM's {what} export of {model_dir} failed (exit {done.returncode}): "
                            + " | ".join(tail), "see the exporter's message above")


def export_code2wav(model_dir: Path, out: Path) -> None:
    """Edge-LLM's Code2Wav export (what its CLI calls) in FP16, traced on the GPU where there is one."""
    import torch
    from tensorrt_edgellm.models.qwen3_tts import export_qwen3_tts_code2wav
    export_qwen3_tts_code2wav(str(model_dir), str(out), torch.float16,
                              device="cuda" if torch.cuda.is_available() else "cpu")


def check_code2wav(onnx_path: Path, reference) -> tuple[float, float]:
    """(max absolute error, cosine) of the Code2Wav graph, run by ONNX's reference evaluator, against the reference
    decoder on seeded codes of CHECK_FRAMES lengths; raises where it computes something else."""
    import numpy as np
    import onnx
    from onnx.reference import ReferenceEvaluator

    from pipeline.workstation.onnx_reference import exact_elementwise_ops, float32_accumulating_ops
    evaluator = ReferenceEvaluator(onnx.load(str(onnx_path)),
                                   new_ops=[*float32_accumulating_ops(), *exact_elementwise_ops()])
    rng = np.random.default_rng(0)
    worst, cosine = 0.0, 1.0
    groups = reference.groups
    for frames in CHECK_FRAMES:
        codes = rng.integers(0, reference.codebook_size, (frames, groups))
        (wav,) = evaluator.run(None, {"codes": np.ascontiguousarray(codes.T[None]).astype(np.int64)})
        got, want = np.asarray(wav, np.float32).reshape(-1), reference.waveform(codes)
        if got.shape != want.shape:
            raise PipelineError(f"{onnx_path}: {frames} frames made {got.size} samples where the reference makes "
                                f"{want.size}", "this is a bug in the Edge-LLM export path; please report it")
        if not np.isfinite(got).all():      # checked before max()/min(), which would drop a NaN (max(0.0, nan): 0.0)
            raise PipelineError(f"{onnx_path}: the Code2Wav graph's waveform of {frames} frames holds a value that "
                                "is not finite", "this is a bug in the Edge-LLM export path; please report it")
        worst = max(worst, float(np.abs(got - want).max()))
        cosine = min(cosine, float(np.dot(got, want) / max(np.linalg.norm(got) * np.linalg.norm(want), 1e-30)))
    if cosine < MIN_COSINE:
        raise PipelineError(f"{onnx_path}: the Code2Wav graph's waveform has a cosine of {cosine:.6f} with the "
                            f"reference decoder's (at least {MIN_COSINE} expected; max error {worst:.4f})",
                            "this is a bug in the Edge-LLM export path; please report it with the recipe")
    return worst, cosine


def check_code_predictor_inputs(cp_dir: Path, model_dir: Path, config: dict) -> None:
    """What Edge-LLM's runtime feeds the code predictor's graph with, against the checkpoint: the graph takes rows of
    the code predictor's width, its codec embeddings are the talker's width, and where the two differ the projection
    between them (small_to_mtp_projection.safetensors) is the checkpoint's, cast to the file's dtype and nothing
    else. Raises where one is missing or differs."""
    import onnx
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file

    from pipeline.workstation.safetensors_check import check_safetensors
    from pipeline.workstation.synthesis_model import PROJECTION, weight_files, widths
    wide, narrow = widths(config["talker_config"])
    graph = onnx.load(str(cp_dir / "model.onnx"), load_external_data=False)
    rows = next(i for i in graph.graph.input if i.name == "inputs_embeds").type.tensor_type.shape.dim[-1].dim_value
    embeddings = check_safetensors(cp_dir / "codec_embeddings.safetensors")    # the header: only the widths
    widths_seen = sorted({int(shape[-1]) for _, shape in embeddings.values()})
    fix = "this is a bug in the Edge-LLM export path; please report it with the recipe"
    if rows != narrow or widths_seen != [wide]:
        raise PipelineError(f"{cp_dir}: the code predictor's graph takes rows of {rows} and its codec embeddings are "
                            f"{widths_seen} wide, where the config makes {narrow} and {wide}", fix)
    path = cp_dir / f"{PROJECTION}.safetensors"
    if wide == narrow:
        return
    if not path.is_file():
        raise PipelineError(f"{cp_dir}: no {path.name}: the code predictor ({narrow} wide) cannot read the talker's "
                            f"rows ({wide} wide) without it", fix)
    exported = load_file(str(path))
    prefix = f"talker.code_predictor.{PROJECTION}."
    want: dict = {}
    for shard in weight_files(model_dir):      # the two tensors only (a 1.7B's shard is 4 GB)
        with safe_open(str(shard), framework="pt") as f:
            want |= {k[len(prefix):]: f.get_tensor(k) for k in f.keys() if k.startswith(prefix)}
    for name in ("weight", "bias"):
        got = exported.get(name)
        if got is None or name not in want or tuple(got.shape) != tuple(want[name].shape) \
                or not torch.equal(want[name].to(got.dtype), got):
            said = "missing" if got is None else f"{list(got.shape)} {got.dtype}"
            raise PipelineError(f"{path}: its {name} ({said}) is not the checkpoint's {prefix}{name}", fix)


def export_synthesis(model_dir: Path, payload_dir: Path) -> SynthesisExport:
    """The checkpoint at `model_dir` (Qwen3-TTS, hub layout) through Edge-LLM's exporter into payload_dir, checked."""
    from pipeline.workstation.onnx_graph import check_graph
    from pipeline.workstation.synthesis_reference import ReferenceSynthesis

    _run([sys.executable, "-m", "tensorrt_edgellm.scripts.export", str(model_dir), str(payload_dir),
          "--skip-code2wav"], "talker and code predictor", model_dir)
    _run([sys.executable, "-m", "pipeline.workstation.synthesis_export", str(model_dir),
          str(payload_dir / CODE2WAV_DIR)], "Code2Wav", model_dir)
    graphs = {}
    for part, extra, files in ((TALKER_DIR, (), TALKER_FILES),
                               (CODE_PREDICTOR_DIR, ("lm_heads", "lm_head_idx"), CODE_PREDICTOR_FILES)):
        graphs[part] = OnnxGraph(**check_graph(payload_dir / part / "model.onnx", LLM_INPUTS + extra, LLM_OUTPUTS,
                                               extra_files=files))
    code2wav = payload_dir / CODE2WAV_DIR / "model.onnx"
    graphs[CODE2WAV_DIR] = OnnxGraph(**check_graph(code2wav, ("codes",), ("waveform",), extra_files=("config.json",),
                                                   consumer="audio_build", attention=":Softmax"))
    talker = json.loads((payload_dir / TALKER_DIR / "config.json").read_text())
    check_code_predictor_inputs(payload_dir / CODE_PREDICTOR_DIR, model_dir,
                                json.loads((model_dir / "config.json").read_text()))
    reference = ReferenceSynthesis(model_dir)
    worst, cosine = check_code2wav(code2wav, reference)
    return SynthesisExport(talker=graphs[TALKER_DIR], code_predictor=graphs[CODE_PREDICTOR_DIR],
                           code2wav=graphs[CODE2WAV_DIR], code_groups=reference.groups,
                           speakers=sorted(talker.get("speaker_id") or {}),
                           languages=sorted(talker.get("codec_language_id") or {}),
                           sample_rate=reference.sample_rate, samples_per_frame=reference.samples_per_frame,
                           code2wav_frames=list(CHECK_FRAMES), code2wav_max_error=round(worst, 6),
                           code2wav_cosine=round(cosine, 7))


if __name__ == "__main__":      # the Code2Wav step, in a process of its own (the export's torch state stays there)
    export_code2wav(Path(sys.argv[1]), Path(sys.argv[2]))


def export_record(model_dir: Path, payload_dir: Path) -> dict:
    """The export's record fields (families/audio.py SpeechModel.export): the three graphs, checked."""
    return {"synthesis": export_synthesis(model_dir, payload_dir)}
