"""export (edgellm backend): the quantized model as TensorRT Edge-LLM ONNX, for llm_build on Thor / JetPack 7.2 Orin.

ModelOpt's unified HF checkpoint (export_hf_checkpoint, the format Edge-LLM reads) is written from the calibrated
model in fp16, then Edge-LLM's exporter (its Python API: AutoModel + export_onnx, offline) turns it into
onnx/{model.onnx, model.onnx.data, config.json, embedding.safetensors, tokenizer files, chat_template.jinja}.
Edge-LLM's config.json records neither the weight precision nor the export's target knobs, which change the ONNX
(target SM, INT4 GEMM plugin version, externalized weights): the stage manifest records them, with the versions.
The ONNX is checked for the inputs, outputs and custom ops the format needs before the stage succeeds.

Where the plan says the engine build needs it (plan/buildmem.py), the INT4 FFN weights are exported as external
weight files (export_onnx(externalize_weights=["int4_ffn"]): the FFN's INT4 GEMM weights and scales become graph
inputs, written to external_int4_ffn_weights.safetensors and listed in config.json's external_weight_files). llm_build
needs no flag for it: it copies the listed files beside the engine and the runtime loads them from there.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from pipeline.backends import ExportJob
from pipeline.contract import AudioExport, ExportRecord, ExternalWeights, OnnxGraph, SpeculativeExport, VisualExport
from pipeline.errors import PipelineError
from pipeline.families import family
from pipeline.formats import INT4_V2_ALIGN, WEIGHT_FORMATS
from pipeline.workstation.export_steps import PartExport
from pipeline.workstation.onnx_graph import check_graph

# Edge-LLM 0.11's default INT4 GEMM is the cuteDSL Int4GroupwiseGemmPluginV2, whose weight layout needs every
# quantized projection's N and K to be multiples of 64; otherwise the legacy AWQ-layout plugin (version 1).
ONNX_DIR = "onnx"
INT4_OPS = {1: "trt_edgellm:Int4GroupwiseGemmPlugin", 2: "trt_edgellm:Int4GroupwiseGemmPluginV2"}


def int4_plugin_version(model) -> int:
    """2 where every quantized linear is 64-aligned in N and K, else 1. Only enabled weight quantizers count: the
    embedding and lm_head carry disabled ones (and a vocabulary of any size). Read before the unified export packs
    the weights. A family that stores q/k/v or gate/up as one tensor (Phi-3) has them split by Edge-LLM's loader:
    there the parts must be aligned too."""
    for module in model.modules():
        w = getattr(module, "weight", None)
        q = getattr(module, "weight_quantizer", None)
        if q is not None and getattr(q, "is_enabled", True) and w is not None and w.dim() == 2 \
                and (w.shape[0] % INT4_V2_ALIGN or w.shape[1] % INT4_V2_ALIGN):
                return 1
    config = getattr(model, "config", None)
    fam = family((getattr(config, "architectures", None) or ["?"])[0]) if config is not None else None
    if config is not None and fam is not None and fam.fused_projections:
        from pipeline.plan.shapes import shape_from_config
        parts = shape_from_config(config.to_dict()).layer_linears()
        if any(o % INT4_V2_ALIGN or i % INT4_V2_ALIGN for _, i, o in parts):
            return 1
    return 2


@contextlib.contextmanager
def awq_scales_as_calibrated(weights: str) -> Iterator[None]:
    """ModelOpt's unified export with its AWQ resmoothing off (requantize_resmooth_fused_llm_layers: it averages the
    pre-quant scales of projections that read one input and re-quantizes their weights), as Edge-LLM's own quantizer
    exports dense INT4-AWQ (its quantization/quantize.py): Edge-LLM's INT4 GEMM takes each linear's own scale. The
    quantize stage already gave the model the scales its recipe's backends need (calibrate.fuse_for_export: shared
    where one of them is TensorRT-LLM 0.12), so the checkpoint holds exactly the calibrated model's numerics."""
    if not WEIGHT_FORMATS[weights].awq:
        yield
        return
    from modelopt.torch.export import unified_export_hf

    original = unified_export_hf.requantize_resmooth_fused_llm_layers
    unified_export_hf.requantize_resmooth_fused_llm_layers = lambda _model: None
    try:
        yield
    finally:
        unified_export_hf.requantize_resmooth_fused_llm_layers = original


def query_scales(model) -> dict:
    """The calibrated FP8 query scales (amax / 448) as checkpoint tensors `<attention>.q_proj.q_scale`, where Edge-LLM's
    attention reads them (qkv_scales[0] of its AttentionPlugin). ModelOpt's unified export writes the K and V scales
    and not this one; without it the runtime quantizes the prefill query with scale 1.0. Written for fused-qkv
    families too (Phi-3): Edge-LLM's loader splits qkv_proj and its q_proj holds the q_scale buffer."""
    import torch

    scales = {}
    for name, module in model.named_modules():
        quantizer = getattr(module, "q_bmm_quantizer", None)
        if quantizer is None or not quantizer.is_enabled:
            continue
        amax = quantizer.amax
        if amax is None or amax.numel() != 1 or not torch.isfinite(amax).all() or float(amax) <= 0:
            raise PipelineError(f"{name}: the FP8 query quantizer has no usable calibrated amax ({amax})",
                                "re-run the quantize stage; if it repeats, report it with the recipe")
        scales[f"{name}.q_proj.q_scale"] = (amax.detach().float().reshape(1) / quantizer.maxbound).cpu()
    return scales


def external_weights(onnx_dir: Path, externalize: tuple[str, ...]) -> list[dict]:
    """config.json's external weight files, checked: one per kind asked for, each a file beside the graph holding
    exactly the tensors it lists. Returns them as the export records them (file, kind, tensors, size)."""
    from safetensors import safe_open

    listed = json.loads((onnx_dir / "config.json").read_text()).get("external_weight_files") or []
    out, problems = [], []
    if len(listed) != len(externalize):
        problems.append(f"{len(listed)} external weight file(s) for {len(externalize)} kind(s) asked for "
                        f"({', '.join(externalize) or 'none'})")
    for entry in listed:
        path = onnx_dir / entry["file"]
        if "/" in entry["file"] or not path.is_file():
            problems.append(f"no external weight file {entry['file']!r} beside the graph")
            continue
        with safe_open(str(path), "np") as fh:
            names = set(fh.keys())
        if names != set(entry["tensors"]):
            problems.append(f"{entry['file']} holds {len(names)} tensors, config.json lists {len(entry['tensors'])}")
        out.append({"file": entry["file"], "kind": entry["kind"], "tensors": sorted(entry["tensors"]),
                    "size": path.stat().st_size})
    if problems:
        raise PipelineError(f"{onnx_dir}: external weights are not what llm_build expects: " + "; ".join(problems),
                            "this is a bug in the Edge-LLM export path; please report it with the recipe")
    return out


def check_onnx(onnx_dir: Path, weights: str, layers: int, int4_plugin: int | None = None,
               extra_outputs: tuple[str, ...] = (), external_inputs: tuple[str, ...] = (), moe: bool = False,
               recurrent: tuple[str, int] | None = None, int4_linears: int | None = None) -> dict:
    """The base model's graph: the inputs, outputs and quantization ops llm_build expects for `weights` (and the
    externalized weights as graph inputs); a mixture-of-experts model's experts in the format's MoE plugin. layers:
    those with a KV cache; recurrent: a hybrid's (kind, count) of recurrent layers, each with its conv and recurrent
    state in and out and one of each of the kind's plugins; int4_linears: how many INT4 GEMMs there must be (a
    hybrid: its quantized linears, those its quantizer keeps FP16 left out)."""
    from pipeline.backends.edgellm import RECURRENT_OPS, STATE_INPUTS
    fmt = WEIGHT_FORMATS[weights]
    expected = set(fmt.edgellm_ops)      # what the format must leave in the graph (pipeline/formats.py)
    if fmt.edgellm_int4_plugin:
        expected.add(INT4_OPS[int4_plugin or 2])
    if moe and fmt.edgellm_moe_op:
        expected.add(fmt.edgellm_moe_op)
    states: list[str] = []
    counts: dict[str, int] = {}
    if recurrent is not None:
        expected.update(RECURRENT_OPS[recurrent[0]])
        counts = {op: recurrent[1] for op in RECURRENT_OPS[recurrent[0]]}
        states = [f"{kind}_{i}" for i in range(recurrent[1]) for kind in STATE_INPUTS]
    if int4_linears is not None and fmt.edgellm_int4_plugin:
        counts[INT4_OPS[int4_plugin or 2]] = int4_linears
    return check_graph(onnx_dir / "model.onnx", ["inputs_embeds", *[f"past_key_values_{i}" for i in range(layers)],
                                                 *external_inputs, *states],
                       ["logits", *[f"present_key_values_{i}" for i in range(layers)], *extra_outputs,
                        *[f"present_{s}" for s in states]],
                       ops=sorted(expected), counts=counts)


def export_draft(draft_dir: Path, onnx_dir: Path) -> dict:
    """An EAGLE-3 draft as Edge-LLM ONNX (fp16): model.onnx(.data), config.json (engine_role draft), d2t.safetensors."""
    from tensorrt_edgellm import AutoModel, export_onnx

    from pipeline.plan.speculative import DRAFT_INPUTS, DRAFT_OUTPUTS

    onnx_dir.mkdir(parents=True)
    export_onnx(AutoModel.from_pretrained(str(draft_dir), device="cpu"), str(onnx_dir / "model.onnx"),
                model_dir=str(draft_dir))
    return check_graph(onnx_dir / "model.onnx", DRAFT_INPUTS, DRAFT_OUTPUTS, extra_files=("d2t.safetensors",),
                       consumer="llm_build --specDraft", path_name="EAGLE-3")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def export(model_dir: Path, quant_dir: Path, scratch: Path, payload_dir: Path, weights: str, kv_cache: str,
           target_sm: str, draft_dir: Path | None = None, handoff=None, externalize: tuple[str, ...] = (),
           mtp_draft: bool = False, audio_tower: bool = True) -> ExportRecord:
    """payload_dir (onnx/) for llm_build; with an EAGLE-3 draft, onnx/base (exported as the EAGLE-3 base: it also
    emits the hidden states the draft reads) and onnx/draft (the draft in fp16); with mtp_draft the same from the
    checkpoint's own MTP layer (workstation/mtp.py). scratch holds the unified HF checkpoint while the ONNX is made
    from it."""
    from pipeline.workstation.models import MODELOPT_MODULES, import_clean

    try:
        import_clean(*MODELOPT_MODULES, "tensorrt_edgellm", "tensorrt_edgellm.models.ops")    # (its docstring)
        from tensorrt_edgellm import AutoModel, export_onnx
        from tensorrt_edgellm.models.ops import set_int4_gemm_plugin_version, set_nvfp4_a16_export_target_sm
    except ImportError as exc:
        raise PipelineError(f"the edgellm export needs TensorRT Edge-LLM's exporter ({exc})",
                            "pip install 'tensorrt-edgellm[export]==0.11.0' (never [tools]: its CUDA torchvision "
                            "breaks CPU torch); ./bootstrap.sh installs it") from None
    from transformers import AutoTokenizer

    hf = scratch / "hf-checkpoint"
    from pipeline.plan.shapes import load_shape
    from pipeline.workstation.prequantized import detect
    held = detect(model_dir)
    shape = load_shape(model_dir)
    steps = part_steps(shape, audio_tower)      # what the model's kinds need of the export (a tower, a hybrid's)
    states: list = [None] * len(steps)
    moe = False
    if held is not None and held.zero_point:
        # AutoAWQ / GPTQ: the checkpoint's own files, which Edge-LLM's loader reads as they are (quant_method awq,
        # gptq); the goldens were computed from them as that loader repacks them (prequantized.py)
        plugin = checkpoint_plugin_version(model_dir)
        zero_point_copy(model_dir, hf)
    else:
        plugin, states, moe = _unified_checkpoint(model_dir, quant_dir, hf, weights, handoff, steps)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(hf)
    if mtp_draft:       # the MTP layer, which transformers did not load, beside the quantized decoder
        from pipeline.workstation import mtp
        print(f"edgellm checkpoint: {mtp.carry_into(hf, mtp.checkpoint_mtp(model_dir))} MTP tensors carried over "
              "(unquantized)")
    for part, step in steps:        # what Edge-LLM's loader reads differently from what transformers writes
        for change in step.prepare(part, hf):
            print(f"edgellm checkpoint: {change}")
    if not (hf / "chat_template.jinja").is_file() and "chat_template" not in json.loads(
            (hf / "tokenizer_config.json").read_text()):
        raise PipelineError(f"{model_dir}: the tokenizer has no chat template; Edge-LLM's runtime needs one",
                            "use the instruct model's repository, or add chat_template.jinja to the local model")

    sm = int(round(float(target_sm) * 10))
    set_int4_gemm_plugin_version(plugin or 2)
    set_nvfp4_a16_export_target_sm(sm)
    from pipeline.plan import speculative
    llm_subdir = next((step.llm_subdir for _, step in steps if step.llm_subdir), "")
    onnx_dir = payload_dir / (speculative.ONNX_BASE if draft_dir or mtp_draft else llm_subdir)
    onnx_dir.mkdir(parents=True)
    eagle = {"eagle_base": True, "eagle_draft_dir": str(draft_dir)} if draft_dir else \
        {"mtp_base": True} if mtp_draft else {}
    remap = loader_key_remap(hf)
    export_onnx(AutoModel.from_pretrained(str(hf), device="cpu", **eagle, **({"key_remap": remap} if remap else {})),
                str(onnx_dir / "model.onnx"), model_dir=str(hf), externalize_weights=list(externalize) or None)
    runtime_cfg = json.loads((onnx_dir / "config.json").read_text())
    if runtime_cfg.get("kv_cache_dtype") != kv_cache:
        # the exporter decides the KV cache from the checkpoint (and for some formats ignores it): a kit that says
        # one thing and builds another must not leave this stage (checked before the draft is exported)
        raise PipelineError(f"Edge-LLM's exporter made a {runtime_cfg.get('kv_cache_dtype')} KV cache where the "
                            f"recipe asks for {kv_cache} ({onnx_dir / 'config.json'}: kv_cache_dtype)",
                            "this pair of formats is not one this Edge-LLM version builds; use another "
                            "quantization.kv_cache, and please report it with the recipe")
    external = external_weights(onnx_dir, externalize)
    expected: dict[str, Any] = {}
    for part, step in steps:
        step.check(part, shape, onnx_dir, hf)
        expected |= step.graph(part, shape, weights)
    # KV for the layers that attend (a hybrid's others keep states: its step says which)
    from pipeline.workstation import mtp
    graph = check_onnx(onnx_dir, weights, shape.attention_layers, plugin,
                       speculative.BASE_EXTRA_OUTPUTS if draft_dir else
                       mtp.base_extra_outputs(onnx_dir) if mtp_draft else (),
                       tuple(t for e in external for t in e["tensors"]), moe=moe, **expected)
    spec = None
    if draft_dir:
        draft_graph = export_draft(draft_dir, payload_dir / speculative.ONNX_DRAFT)
        draft_cfg = json.loads((payload_dir / speculative.ONNX_DRAFT / "config.json").read_text())
        spec = SpeculativeExport(method="eagle3", draft_weights=speculative.DRAFT_WEIGHTS,
                                 draft_vocab_size=draft_cfg.get("draft_vocab_size"),
                                 base_hidden_state_layers=runtime_cfg.get("eagle_hidden_state_layers"),
                                 draft_onnx=OnnxGraph(**draft_graph))
    elif mtp_draft:
        draft_graph = mtp.export_draft(hf, payload_dir / speculative.ONNX_DRAFT)
        spec = SpeculativeExport(method="mtp", draft_weights=speculative.DRAFT_WEIGHTS,
                                 draft_vocab_size=runtime_cfg.get("vocab_size"), base_hidden_state_layers=None,
                                 draft_onnx=OnnxGraph(**draft_graph))
    quant: dict[str, Any] = json.loads((hf / "hf_quant_config.json").read_text())["quantization"] \
        if (hf / "hf_quant_config.json").is_file() else \
        {"quant_algo": held.algo, "group_size": held.group_size} if held is not None else {}
    shutil.rmtree(hf)        # the kit carries the ONNX; the unified checkpoint is rebuilt from the state if needed
    beside = [v for (part, step), state in zip(steps, states, strict=True)
              if (v := step.beside(part, model_dir, scratch, payload_dir, state)) is not None]
    return ExportRecord(
        weights=weights, kv_cache=kv_cache, quant_algo=quant.get("quant_algo"),
        kv_cache_quant_algo=quant.get("kv_cache_quant_algo"), group_size=quant.get("group_size"),
        kv_cache_dtype=runtime_cfg.get("kv_cache_dtype"), target_sm=sm, int4_gemm_plugin_version=plugin,
        externalized_weights=[ExternalWeights(file=e["file"], kind=e["kind"], tensors=len(e["tensors"]),
                                              size=e["size"]) for e in external],
        onnx=OnnxGraph(**graph), speculative=spec,
        visual=next((b for b in beside if isinstance(b, VisualExport)), None),
        audio=next((b for b in beside if isinstance(b, AudioExport)), None),
        versions={d: _version(d) for d in ("tensorrt-edgellm", "nvidia-modelopt", "transformers", "onnx")})


def loader_key_remap(hf: Path):
    """The checkpoint key remap Edge-LLM 0.11's own export command (scripts/export.py) gives its loader where
    AutoModel picks none: Gemma 4 with routed experts keeps its router and experts at the decoder layer, which its
    model nests under moe_block (GEMMA4_NVFP4_KEY_REMAP for a quantized checkpoint's per-expert tensors,
    GEMMA4_FUSED_BF16_KEY_REMAP for fused ones). Without it the loader leaves the routers unread (seen: an NVFP4
    export whose router weights were uninitialized memory, and NaN logits). None: no remap."""
    cfg = json.loads((hf / "config.json").read_text())
    text = cfg.get("text_config") or cfg
    if not str(text.get("model_type", cfg.get("model_type", ""))).startswith("gemma4") or \
            not text.get("enable_moe_block"):
        return None
    from tensorrt_edgellm.models.gemma4 import modeling_gemma4_text as gemma4
    quantized = (hf / "hf_quant_config.json").is_file() or "quantization_config" in cfg
    return gemma4.GEMMA4_NVFP4_KEY_REMAP if quantized else gemma4.GEMMA4_FUSED_BF16_KEY_REMAP


def part_steps(shape, audio_tower: bool = True) -> list[tuple[Any, PartExport]]:
    """(part, its export steps) for each of the shape's parts that has some (workstation/export_steps.py); an audio
    encoder's are its design's, and only where the plan built its engine (audio_tower)."""
    import importlib

    from pipeline.plan.parts import AudioEncoder, Hybrid, TowerShape
    from pipeline.workstation.edgellm_hybrid import HybridExport
    from pipeline.workstation.visual_export import TowerExport

    def design_step(part) -> PartExport | None:
        module, name = part.design.export_step.split(":")
        return getattr(importlib.import_module(module), name)() if audio_tower else None
    table: dict[type, Any] = {Hybrid: lambda _: HybridExport(), TowerShape: lambda _: TowerExport(),
                              AudioEncoder: design_step}
    return [(p, step) for p in shape.parts if type(p) in table and (step := table[type(p)](p)) is not None]


def _unified_checkpoint(model_dir: Path, quant_dir: Path, hf: Path, weights: str, handoff, steps):
    """ModelOpt's unified checkpoint of the calibrated (or restored) model in `hf`; returns (INT4 plugin version,
    each part step's state from before the export, whether it has experts)."""
    from modelopt.torch.export import export_hf_checkpoint

    from pipeline.workstation.state import load_quantized
    # the unified export is fp16
    model = load_quantized(model_dir, quant_dir, "cpu", consume=True, handoff=handoff).half()
    # before the unified export, which packs INT4 weights in place (two per byte: half the rows)
    plugin = int4_plugin_version(model) if WEIGHT_FORMATS[weights].edgellm_int4_plugin else None
    states = [step.before_unified(part, model) for part, step in steps]
    from pipeline.workstation.experts import moe_blocks, unified_export_of_fused_experts
    moe = bool(moe_blocks(model))
    if moe and not any(n.endswith("_quantizer") for n, _ in model.named_modules()):
        # FP16 experts: ModelOpt 0.47's export has no unquantized path for transformers 5's fused experts
        # (NotImplementedError for Qwen3MoeExperts); transformers writes the hub's per-expert layout itself
        model.save_pretrained(hf)
    else:
        with unified_export_of_fused_experts(), awq_scales_as_calibrated(weights):
            export_hf_checkpoint(model, export_dir=hf, extra_state_dict=query_scales(model) or None)
    del model
    return plugin, states, moe


def checkpoint_plugin_version(model_dir: Path) -> int:
    """int4_plugin_version for a zero-point checkpoint, from its quantized linears' shapes (headers only)."""
    from pipeline.workstation.prequantized import detect, logical_headers
    from pipeline.workstation.safetensors_check import check_safetensors
    held = detect(model_dir)
    assert held is not None
    typed: dict = {}
    for shard in sorted(model_dir.glob("*.safetensors")):
        typed |= check_safetensors(shard)
    quantized = {k[: -len(".qweight")] + ".weight" for k in typed if k.endswith(".qweight")}
    shapes = [s for k, s in logical_headers(held, typed, str(model_dir)).items() if k in quantized]
    return 1 if any(o % INT4_V2_ALIGN or i % INT4_V2_ALIGN for o, i in shapes) else 2


def zero_point_copy(model_dir: Path, hf: Path) -> None:
    """The checkpoint's files in `hf` for Edge-LLM's exporter (weights linked: nothing writes them; the rest copied, as
    the tokenizer is saved over them)."""
    from pipeline.files import link_or_copy
    from pipeline.workstation.fetch import needed_files
    hf.mkdir(parents=True)
    for f in needed_files(model_dir):
        if f.suffix == ".safetensors":
            link_or_copy(f, hf / f.name)
        else:
            shutil.copyfile(f, hf / f.name)


def export_job(job: ExportJob) -> ExportRecord:
    """The edgellm backend's export step (pipeline/workstation/exporters.py)."""
    from pipeline.families.audio import speech_model_of
    from pipeline.plan.shapes import load_config
    speech = speech_model_of(load_config(job.model_dir / "config.json"))
    if speech is not None:      # a speech model: its own graphs, FP16 (the plan refused any other format)
        made = speech.stage("export_graphs")(job.model_dir, job.payload_dir)
        return ExportRecord(quant_algo=None, kv_cache_quant_algo=None, weights=job.weights, kv_cache=job.kv_cache,
                            target_sm=int(round(float(job.target_sm) * 10)), **made,
                            versions={d: _version(d) for d in ("tensorrt-edgellm", "transformers", "onnx")})
    return export(job.model_dir, job.quant_dir, job.stage_dir, job.payload_dir, job.weights, job.kv_cache,
                  job.target_sm, draft_dir=job.draft_dir, handoff=job.handoff, externalize=job.externalize,
                  mtp_draft=job.mtp_draft, audio_tower=job.audio_tower)
