"""The planner: will this model, at this precision, run on this Jetson through this backend, and how fast?

`make_plan` gates impossible combinations (with the reason and what to do instead), sizes memory against the
target's usable memory, and predicts single-stream decode speed. A refused plan still carries every number computed,
so the user sees how far off it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.plan.memory import Limits, MemoryPlan, decode_bytes_per_token, plan_memory
from pipeline.plan.shapes import ModelShape
from pipeline.plan.perf import BACKEND_CLASS, fitted
from pipeline.plan.formats import KV_FORMATS, WEIGHT_FORMATS, pick_group_size
from pipeline.plan.targets import GB, SoftwareStack, TargetProfile, load_targets

BACKEND_NAMES = {"trtllm-0.12": "TensorRT-LLM 0.12", "edgellm": "TensorRT Edge-LLM"}


@dataclass(frozen=True)
class DraftRequest:
    """An EAGLE-3 draft beside the base (speculative decoding)."""
    shape: "DraftShape"
    label: str
    method: str = "eagle3"
    max_draft_tree_size: int = 60
    max_verify_tree_size: int = 60


@dataclass(frozen=True)
class PlanRequest:
    shape: ModelShape
    model_label: str
    weights: str
    kv_cache: str
    target: TargetProfile
    limits: Limits
    backend: str | None = None
    group_size: int | None = None
    power_mode: str | None = None
    recipe: str | None = None
    draft: DraftRequest | None = None


@dataclass
class Plan:
    request: PlanRequest
    backend: str | None
    stack: SoftwareStack | None
    group_size: int | None
    memory: MemoryPlan | None
    predicted_decode_tok_s: float | None
    prediction: dict
    refused: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    draft_memory: dict | None = None

    @property
    def ok(self) -> bool:
        return not self.refused

    @property
    def fits(self) -> bool:
        return bool(self.memory and self.memory.fits)

    def to_json(self) -> dict:
        r = self.request
        stack = self.stack
        return {
            "recipe": r.recipe,
            "model": {"name": r.model_label, "architecture": r.shape.architecture, "params": r.shape.total_params},
            "target": r.target.id, "target_name": r.target.name, "sm": r.target.sm,
            "backend": self.backend,
            "stack": None if stack is None else {
                "id": stack.id, "backend_version": stack.backend_version, "jetpack": list(stack.jetpack),
                "l4t": stack.l4t, "cuda": stack.cuda, "tensorrt": stack.tensorrt},
            "quant": {"weights": r.weights, "kv_cache": r.kv_cache, "group_size": self.group_size,
                      "label": WEIGHT_FORMATS[r.weights].label},
            "limits": {"max_batch_size": r.limits.max_batch_size, "max_input_len": r.limits.max_input_len,
                       "max_seq_len": r.limits.max_seq_len, "max_num_tokens": r.limits.max_num_tokens},
            "fits": self.fits,
            "ok": self.ok,
            "memory": self.memory.as_dict() if self.memory else None,
            "predicted_decode_tok_s": self.predicted_decode_tok_s,
            "prediction": self.prediction,
            "refused": self.refused,
            "warnings": self.warnings,
            "speculative": self._speculative(),
        } | self._build_commands()

    def _speculative(self) -> dict | None:
        d = self.request.draft
        if d is None:
            return None
        from pipeline.plan.speculative import DRAFT_WEIGHTS
        return {"method": d.method, "draft": d.label, "draft_params": d.shape.params, "draft_weights": DRAFT_WEIGHTS,
                "draft_vocab_size": d.shape.draft_vocab_size, "max_draft_tree_size": d.max_draft_tree_size,
                "max_verify_tree_size": d.max_verify_tree_size, "memory": self.draft_memory}

    def _build_commands(self) -> dict:
        """device_build_command: the (base) engine's argv; device_build_commands: every build in order (a draft
        engine is a second llm_build into the same engine directory)."""
        from pipeline.device.engine_build import device_build_commands
        if not self.ok:
            return {"device_build_command": None, "device_build_commands": None}
        lim = self.request.limits
        argvs = device_build_commands({"ok": True, "backend": self.backend, "speculative": self._speculative(),
                                       "limits": {"max_batch_size": lim.max_batch_size,
                                                  "max_input_len": lim.max_input_len,
                                                  "max_seq_len": lim.max_seq_len,
                                                  "max_num_tokens": lim.max_num_tokens}})
        return {"device_build_command": argvs[0] if argvs else None, "device_build_commands": argvs}


def _gb(n: float) -> str:
    return f"{n / GB:.2f} GB" if abs(n) >= 0.1 * GB else f"{n / 1e6:.1f} MB"


def _choose_stack(req: PlanRequest, refused: list[str]) -> SoftwareStack | None:
    t, arch = req.target, req.shape.architecture
    fmt = WEIGHT_FORMATS[req.weights]
    if fmt.min_sm > t.sm_float:
        refused.append(f"{fmt.label} needs SM >= {fmt.min_sm}; {t.id} is SM {t.sm}, which has no "
                       f"{'FP8' if fmt.min_sm < 10 else 'FP4'} tensor cores. Use int4_awq, int8_sq or int8_wo on "
                       f"this target, or target a Thor (SM 11.0) for {req.weights}.")
    kv = KV_FORMATS[req.kv_cache]
    if kv.min_sm > t.sm_float:
        refused.append(f"{kv.label} needs SM >= {kv.min_sm}; {t.id} is SM {t.sm}. Use kv_cache = 'int8' or 'fp16'.")

    if req.backend:
        stack = t.stack_for(req.backend)
        if stack is None:
            why = ""
            if req.backend == "trtllm-0.12" and t.family == "thor":
                why = (" TensorRT-LLM has no working Thor path (it refuses INT4/INT8 on SM >= 100); Thor engines "
                       "are built with TensorRT Edge-LLM: use backend = 'edgellm'.")
            refused.append(f"target {t.id} has no {BACKEND_NAMES[req.backend]} stack.{why}")
            return None
        candidates = [stack]
    else:
        candidates = list(t.stacks)

    reasons = []
    for stack in candidates:
        why = []
        name = f"{BACKEND_NAMES[stack.backend]} {stack.backend_version} (JetPack {stack.jetpack[-1]})"
        if arch not in stack.architectures:
            why.append(f"{name} does not support {arch} (supported: {', '.join(stack.architectures)})")
        if req.weights not in stack.weights:
            why.append(f"{name} on {t.id} does not build {req.weights} (it builds: {', '.join(stack.weights)})")
        if req.kv_cache not in stack.kv_cache:
            why.append(f"{name} on {t.id} has no {req.kv_cache} KV cache (it has: {', '.join(stack.kv_cache)})")
        if not why:
            return stack
        reasons.extend(why)
    if reasons:
        others = [s for s in t.stacks if s not in candidates and arch in s.architectures
                  and req.weights in s.weights and req.kv_cache in s.kv_cache]
        hint = f" The {others[0].id} stack can (backend = '{others[0].backend}')." if others else ""
        refused.append("; ".join(reasons) + "." + hint)
    return None


def make_plan(req: PlanRequest) -> Plan:
    refused: list[str] = []
    warnings: list[str] = []
    stack = _choose_stack(req, refused)
    backend = stack.backend if stack else req.backend
    fmt, kv = WEIGHT_FORMATS[req.weights], KV_FORMATS[req.kv_cache]
    from pipeline.device.engine_build import EDGELLM_MIN_BATCH
    if backend == "edgellm" and req.limits.max_batch_size < EDGELLM_MIN_BATCH:
        import dataclasses
        lim = req.limits
        req = dataclasses.replace(req, limits=Limits(EDGELLM_MIN_BATCH, lim.max_input_len, lim.max_seq_len))
        warnings.append(f"Edge-LLM engines built for batch 1 fail at run time (known issue): built and planned "
                        f"for max_batch_size {EDGELLM_MIN_BATCH}.")

    group_size, problem = pick_group_size(fmt, req.shape.quantized_input_dims(), req.group_size)
    if problem:
        refused.append(f"{fmt.label}: {problem}.")
    elif fmt.default_group_size and group_size != fmt.default_group_size and not req.group_size:
        warnings.append(f"group size {group_size} chosen: {fmt.default_group_size} does not divide every quantized "
                        f"input dimension {req.shape.quantized_input_dims()}.")
    if req.limits.max_seq_len > req.shape.max_position_embeddings:
        refused.append(f"max_seq_len {req.limits.max_seq_len} exceeds the model's max_position_embeddings "
                       f"{req.shape.max_position_embeddings}.")

    draft_mem = None
    if req.draft is not None:
        from pipeline.plan.speculative import draft_memory, pairing_problems, pairing_warnings
        d = req.draft
        if backend is not None and backend != "edgellm":
            refused.append(f"{d.method} speculative decoding is built by TensorRT Edge-LLM only (llm_build "
                           f"--specBase/--specDraft); {BACKEND_NAMES[backend]} on {req.target.id} has no EAGLE-3 "
                           "draft engines. Remove [draft], or target a JetPack 7 stack (backend = 'edgellm').")
        refused.extend(f"{p}. Use the draft trained for this base model." for p in
                       pairing_problems(d.shape, req.shape, d.label))
        warnings.extend(pairing_warnings(d.shape, req.shape, d.label))
        draft_mem = draft_memory(d.shape, req.limits.max_seq_len, req.limits.max_batch_size, d.max_draft_tree_size)

    t = req.target
    memory = plan_memory(req.shape, fmt, group_size, kv, req.limits, backend or "trtllm-0.12",
                         t.usable_bytes, t.usable_headless_bytes, draft_mem["total"] if draft_mem else 0)
    if not memory.fits:
        if memory.fits_headless:
            warnings.append(f"needs {_gb(memory.total)}: more than the {_gb(memory.usable)} usable with the desktop "
                            f"running, within the {_gb(memory.usable_headless)} of a headless {t.id}. Boot to "
                            "multi-user.target (no desktop) before running.")
        else:
            fix = []
            if memory.max_seq_len_that_fits >= 2:
                fix.append(f"max_seq_len <= {memory.max_seq_len_that_fits} at batch {req.limits.max_batch_size}")
            fix.append("a smaller weight format (int4_awq)" if req.weights != "int4_awq" else "a smaller model")
            fix.append("a target with more memory")
            refused.append(
                f"does not fit: needs {_gb(memory.total)} (weights {_gb(memory.weights)}, embedding "
                f"{_gb(memory.embedding)}, lm_head {_gb(memory.lm_head)}, KV cache {_gb(memory.kv_cache)}, "
                + (f"EAGLE-3 draft {_gb(memory.draft)}, " if memory.draft else "") +
                f"activations {_gb(memory.activations)}, runtime {_gb(memory.runtime_overhead)}) but {t.id} has "
                f"{_gb(memory.usable)} usable ({_gb(memory.usable_headless)} headless); short by "
                f"{_gb(-memory.margin)}. Try: {'; '.join(fix)}.")
    if memory.build_peak > t.usable_headless_bytes:
        bigger = [o.id for o in load_targets().values() if o.sm == t.sm and o.family == t.family
                  and o.usable_headless_bytes >= memory.build_peak]
        where = f" (same SM: {', '.join(bigger)})" if bigger else ""
        warnings.append(f"building the engine needs ~{_gb(memory.build_peak)}, more than a {t.id} has: build on a "
                        f"larger board of the same SM and software stack{where} and copy the engine bundle.")

    context = req.limits.max_input_len
    mode = req.power_mode or t.fastest_power_mode
    constants = fitted()[BACKEND_CLASS[backend or "trtllm-0.12"]]
    bytes_read = decode_bytes_per_token(req.shape, fmt, group_size, kv, context)
    by_mode = {m: round(constants.tok_s(bytes_read, t.bandwidth_bytes(m)), 1) for m in t.bandwidth_gbs}
    prediction = {"power_mode": mode, "bandwidth_gbs": t.bandwidth_gbs.get(mode), "context_tokens": context,
                  "bytes_per_token": int(bytes_read), "engine_class": BACKEND_CLASS[backend or "trtllm-0.12"],
                  "efficiency": constants.efficiency, "fixed_s": constants.fixed_s, "by_power_mode": by_mode}
    if backend == "trtllm-0.12":
        warnings.append("decode speed predicted with constants fitted to TensorRT Edge-LLM rows: no TensorRT-LLM "
                        "0.12 Jetson decode figures are published in the reference set.")
    if req.draft is not None:
        prediction["speculative_note"] = ("decode predicted without speculation: EAGLE-3's gain depends on the "
                                          "draft's acceptance rate on your prompts (validation measures it)")
    return Plan(req, backend, stack, group_size, memory, by_mode.get(mode), prediction, refused, warnings,
                draft_mem)


def render_table(plan: Plan) -> str:
    """The plan as a text table for terminals (doit plan, python -m pipeline plan)."""
    j = plan.to_json()
    m = plan.memory
    lines = [f"plan: {j['model']['name']} ({j['quant']['label']}, KV {j['quant']['kv_cache']}) on {j['target_name']} "
             f"[SM {j['sm']}] via {BACKEND_NAMES.get(j['backend'] or '', j['backend'])}"]
    if j["stack"]:
        s = j["stack"]
        lines.append(f"  stack        JetPack {'/'.join(s['jetpack'])}, CUDA {s['cuda']}, TensorRT {s['tensorrt']}, "
                     f"{j['backend']} {s['backend_version']}")
    lim = j["limits"]
    lines.append(f"  limits       batch {lim['max_batch_size']}, input {lim['max_input_len']}, "
                 f"seq {lim['max_seq_len']}, group size {j['quant']['group_size']}")
    if m:
        for key in ("weights", "embedding", "lm_head", "kv_cache", "draft", "activations", "runtime_overhead"):
            if key == "draft" and not m.draft:
                continue
            lines.append(f"  {key.replace('_overhead', ''):<12} {_gb(getattr(m, key)):>10}")
        lines.append(f"  {'total':<12} {_gb(m.total):>10} of {_gb(m.usable)} usable "
                     f"({'fits' if m.fits else 'DOES NOT FIT'}, margin {_gb(m.margin)})")
        lines.append(f"  largest      max_seq_len {m.max_seq_len_that_fits} at batch {lim['max_batch_size']}; "
                     f"batch {m.max_batch_that_fits} at max_seq_len {lim['max_seq_len']}")
        lines.append(f"  build peak   {_gb(m.build_peak):>10} on the device")
    p = j["prediction"]
    if j["predicted_decode_tok_s"] is not None:
        lines.append(f"  decode       ~{j['predicted_decode_tok_s']} tok/s at {p['power_mode']} "
                     f"({p['bandwidth_gbs']} GB/s), context {p['context_tokens']}")
    lines += [f"  warning: {w}" for w in j["warnings"]]
    lines += [f"  REFUSED: {r}" for r in j["refused"]]
    return "\n".join(lines)


def model_config_for(recipe, fetched_dir=None) -> tuple[dict, str]:
    """The model's config.json for planning: the fetched one if there is one, else what the repo ships or knows."""
    import json

    from pipeline.errors import PipelineError
    from pipeline.plan.perf import known_model_configs

    if fetched_dir is not None and (fetched_dir / "config.json").is_file():
        return json.loads((fetched_dir / "config.json").read_text()), str(fetched_dir / "config.json")
    src = recipe.model["source"]
    if src == "local":
        path = recipe.model_dir / "config.json"
        if not path.is_file():
            raise PipelineError(f"{recipe.file}: model.path = {recipe.model['path']!r}: no config.json in {path.parent}",
                                "point model.path at a Hugging Face checkpoint directory")
        return json.loads(path.read_text()), str(path)
    if src == "builtin":
        from pipeline.workstation.tinymodel import BUILTINS
        spec = BUILTINS[recipe.model["name"]]
        return {"architectures": [spec.architecture], "vocab_size": spec.vocab_size, **spec.config}, \
            f"builtin:{recipe.model['name']}"
    known = known_model_configs().get(recipe.model["repo"])
    if known is not None:
        return dict(known), f"pipeline/data/model_configs.toml[{recipe.model['repo']}]"
    from pipeline.workstation.hub import fetch_config
    return fetch_config(recipe.model["repo"], recipe.model["revision"]), f"{recipe.model['repo']}/config.json"


def draft_config_for(recipe, fetched_dir=None) -> tuple[dict, str]:
    """The EAGLE-3 draft's config.json for planning: fetched, local, builtin, or from the hub (config only)."""
    import json

    from pipeline.errors import PipelineError

    d = recipe.draft
    if fetched_dir is not None and (fetched_dir / "config.json").is_file():
        return json.loads((fetched_dir / "config.json").read_text()), str(fetched_dir / "config.json")
    if d["source"] == "local":
        path = recipe.draft_dir / "config.json"
        if not path.is_file():
            raise PipelineError(f"{recipe.file}: draft.path = {d['path']!r}: no config.json in {path.parent}",
                                "point draft.path at the EAGLE-3 draft's checkpoint directory")
        return json.loads(path.read_text()), str(path)
    if d["source"] == "builtin":
        import tempfile
        from pathlib import Path

        from pipeline.workstation.tinymodel import materialize_draft
        with tempfile.TemporaryDirectory() as tmp:   # a tiny draft is made in a second; its config is exact
            materialize_draft(d["name"], Path(tmp))
            return json.loads((Path(tmp) / "config.json").read_text()), f"builtin:{d['name']}"
    from pipeline.plan.perf import known_model_configs
    known = known_model_configs().get(d["repo"])
    if known is not None:
        return dict(known), f"pipeline/data/model_configs.toml[{d['repo']}]"
    from pipeline.workstation.hub import fetch_config
    return fetch_config(d["repo"], d["revision"]), f"{d['repo']}/config.json"


def plan_recipe(recipe, target_id: str, config: dict, config_source: str, backend: str | None = None,
                draft: tuple[dict, str] | None = None) -> Plan:
    from pipeline.plan.shapes import shape_from_config
    from pipeline.plan.targets import get_target

    shape = shape_from_config(config, config_source)
    draft_req = None
    if recipe.draft:
        from pipeline.plan.speculative import draft_shape
        if draft is None:
            draft = draft_config_for(recipe)
        d = recipe.draft
        draft_req = DraftRequest(draft_shape(draft[0], draft[1]), d.get("repo") or d.get("name") or d.get("path"),
                                 d["method"], d["max_draft_tree_size"], d["max_verify_tree_size"])
    b = recipe.build
    label = recipe.model.get("repo") or recipe.model.get("name") or recipe.model.get("path")
    req = PlanRequest(shape=shape, model_label=label, weights=recipe.weights, kv_cache=recipe.kv_cache,
                      target=get_target(target_id), backend=backend or recipe.backend,
                      limits=Limits(b["max_batch_size"], b["max_input_len"], b["max_seq_len"]),
                      group_size=recipe.quantization["group_size"], power_mode=b["power_mode"], recipe=recipe.name,
                      draft=draft_req)
    plan = make_plan(req)
    prequant = config.get("quantization_config")
    if prequant:
        method = prequant.get("quant_method", "?")
        plan.refused.append(
            f"{config_source} is already quantized (quant_method {method!r}; AutoAWQ checkpoints hold asymmetric INT4 "
            "with zero points in AutoAWQ's GEMM packing and no pre-quant scales). TensorRT-LLM's own converters load "
            "them as W4A16_GPTQ (`use_autoawq`, asymmetric), not as W4A16_AWQ (ModelOpt's symmetric INT4 with "
            "pre-quant scales, the format this pipeline exports and verifies); Edge-LLM takes ModelOpt checkpoints "
            "only. Point the recipe at the unquantized base model and set quantization.weights = 'int4_awq'.")
    return plan
