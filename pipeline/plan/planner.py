"""The planner: will this model, at this precision, run on this Jetson through this backend, and how fast?

`make_plan` gates impossible combinations (with the reason and what to do instead), sizes memory against the
target's usable memory, and predicts single-stream decode speed. A refused plan still carries every number computed,
so the user sees how far off it is.
"""

from __future__ import annotations

import dataclasses

from pipeline import backends, contract
from pipeline.contract import BuildLimits, MemoryPlan, Plan
from pipeline.families import family
from pipeline.formats import (
    DEFAULT_KV,
    KV_FORMATS,
    SMALLEST,
    WEIGHT_FORMATS,
    kv_formats_for,
    pick_group_size,
    quantized_formats_for,
)
from pipeline.plan.memory import plan_memory
from pipeline.plan.parts import PARTS
from pipeline.plan.parts.base import MLP_NAMES
from pipeline.plan.prediction import predict_speed
from pipeline.plan.request import PlanRequest
from pipeline.plan.targets import StackSupport, gb, load_targets


def _choose_stack(req: PlanRequest, refused: list[str]) -> StackSupport | None:
    t, arch = req.target, req.shape.architecture
    fmt = WEIGHT_FORMATS[req.weights]
    if fmt.min_sm > t.sm_float:
        usable = quantized_formats_for(t.sm_float)
        refused.append(f"{fmt.label} needs SM >= {fmt.min_sm}; {t.id} is SM {t.sm}, which has no "
                       f"{fmt.hardware} tensor cores. Use {', '.join(usable[:-1])} or {usable[-1]} on "
                       f"this target, or target a Thor (SM 11.0) for {req.weights}.")
    kv = KV_FORMATS[req.kv_cache]
    if kv.min_sm > t.sm_float:
        usable_kv = sorted(kv_formats_for(t.sm_float), key=lambda k: k == DEFAULT_KV.name)     # the default last
        refused.append(f"{kv.label} needs SM >= {kv.min_sm}; {t.id} is SM {t.sm}. Use kv_cache = "
                       + " or ".join(repr(k) for k in usable_kv) + ".")

    if req.backend:
        stack = t.stack_for(req.backend)
        if stack is None:
            wanted = backends.get(req.backend)
            family_note = wanted.refuse_on_family.get(t.family)
            refused.append(f"target {t.id} has no {wanted.label} stack." + (f" {family_note}" if family_note else ""))
            return None
        candidates = [stack]
    else:
        candidates = list(t.stacks)

    reasons: list[str] = []
    for stack in candidates:
        why: list[str] = []
        name = f"{backends.get(stack.backend).label} {stack.stack.backend_version} (JetPack {stack.stack.jetpack[-1]})"
        fam = family(arch)
        assert fam is not None          # shape_from_config admits registry families only
        refused_family = backends.family_refusal(fam, stack.backend, name)
        support = backends.family_support(stack.backend, arch)
        if refused_family:
            why.append(refused_family)
        else:
            assert support is not None      # family_refusal is None only for a family the backend builds
            if support.formats and req.weights not in support.formats:
                why.append(f"{name} builds {fam.name} only as {', '.join(support.formats)}"
                           + (f" ({support.formats_why})" if support.formats_why else ""))
            why += [r for p in req.shape.parts for r in p.refusals(support, req.weights, name, fam)]
            if support.kv_cache and req.kv_cache not in support.kv_cache:
                why.append(f"{name} builds {fam.name} only with a {' or '.join(support.kv_cache)} KV cache")
            why += [f"{name} would not run this {fam.name} checkpoint as it is defined: {loss}"
                    for loss in support.losses(req.shape.features, req.limits.max_seq_len)]
        pair = backends.get(stack.backend).refuses_pair(WEIGHT_FORMATS[req.weights], KV_FORMATS[req.kv_cache])
        if pair:
            why.append(pair)
        if req.weights not in stack.weights:
            note = backends.get(stack.backend).checkpoint_only_note if fmt.checkpoint_only else None
            why.append(f"{name} on {t.id} does not build {req.weights} (it builds: {', '.join(stack.weights)})"
                       + (f": {note}" if note else ""))
        if req.kv_cache not in stack.kv_cache:
            why.append(f"{name} on {t.id} has no {req.kv_cache} KV cache (it has: {', '.join(stack.kv_cache)})")
        if not why:
            return stack
        reasons.extend(why)
    if reasons:
        others = [s for s in t.stacks if s not in candidates and s.builds(arch, req.weights, req.kv_cache)]
        hint = f" The {others[0].id} stack can (backend = '{others[0].backend}')." if others else ""
        refused.append("; ".join(reasons) + "." + hint)
    return None


def make_plan(req: PlanRequest) -> Plan:
    refused: list[str] = []
    warnings: list[str] = []
    stack = _choose_stack(req, refused)
    backend = stack.backend if stack else req.backend
    fmt, kv = WEIGHT_FORMATS[req.weights], KV_FORMATS[req.kv_cache]
    engine = backends.get(backend or backends.DEFAULT)   # sizes memory and speed while no stack could be chosen
    if req.limits.max_batch_size < engine.min_batch_size:
        lim = req.limits
        req = dataclasses.replace(req, limits=BuildLimits.of(engine.min_batch_size, lim.max_input_len,
                                                              lim.max_seq_len))
        warnings.append(f"{engine.label} engines built for batch 1 fail at run time (known issue): built and "
                        f"planned for max_batch_size {engine.min_batch_size}.")

    group_size, problem = pick_group_size(fmt, req.shape.quantized_input_dims(fmt), req.group_size)
    if problem:
        refused.append(f"{fmt.label}: {problem}.")
    elif fmt.default_group_size and group_size != fmt.default_group_size and not req.group_size:
        warnings.append(f"group size {group_size} chosen: {fmt.default_group_size} does not divide every quantized "
                        f"input dimension {req.shape.quantized_input_dims(fmt)}.")
    if req.limits.max_seq_len > req.shape.max_position_embeddings:
        refused.append(f"max_seq_len {req.limits.max_seq_len} exceeds the model's max_position_embeddings "
                       f"{req.shape.max_position_embeddings}.")

    draft_mem = _draft(req, engine, backend, refused, warnings)
    t = req.target
    from pipeline.plan.perf import fit_data
    visual = req.shape.visual_plan(t, req.limits, req.visual, req.visual_precision, refused, fit_data())
    if visual is None and req.visual is not None:
        refused.append("build.visual sets an image-token profile, but the model has no visual tower: remove "
                       "[build.visual] or use a vision-language model")
    audio = req.shape.audio_plan(t, req.limits, req.audio_max_seconds, refused, fit_data())
    if audio is None and req.audio_max_seconds is not None:
        refused.append("build.audio sets the longest recording, but the model has no audio encoder: remove "
                       "[build.audio] or use a speech-to-text model")
    memory = plan_memory(req.shape, fmt, group_size, kv, req.limits, engine.runtime_overhead,
                         t.usable_bytes, t.usable_headless_bytes, draft_mem.total if draft_mem else 0,
                         visual.weights + visual.activations if visual else 0, t.sm_float,
                         audio.weights + audio.activations if audio else 0)
    _memory_verdict(req, fmt, memory, refused, warnings)
    memory, on_board = _build_memory(req, engine, fmt, memory)     # shown with its commands by render_table

    prediction, by_mode, mode, ttft = predict_speed(req, engine, backend, fmt, group_size, kv, warnings)
    if visual is not None:
        if visual.build_peak > t.usable_headless_bytes:
            refused.append(f"visual_build needs {gb(visual.build_peak)} on the device, more than the "
                           f"{gb(t.usable_headless_bytes)} a headless {t.id} has: lower "
                           "build.visual.max_image_tokens")
        if visual.vit_ms is not None and ttft is not None:
            visual = dataclasses.replace(visual, ttft_ms=round(visual.vit_ms + ttft, 1))
    if audio is not None:
        from pipeline.plan.prediction import ttft_ms

        def prefill_ms(tokens: int) -> float | None:
            return ttft_ms(req.shape, fmt.name, t.id, tokens, mode, fit_data())
        audio = req.shape.audio_speed(audio, t.id, by_mode.get(mode), prefill_ms, fit_data(), req.model_label)
    from pipeline.plan.buildmem import build_seconds, externalized_kinds
    build_s = build_seconds(memory.weights + memory.embedding + memory.lm_head, on_board.swap_bytes > 0)
    ok = not refused
    limits = req.limits
    speculative = None
    if req.draft is not None and req.draft.shape is not None:
        from pipeline.plan.speculative import DRAFT_WEIGHTS
        d, dshape = req.draft, req.draft.shape
        speculative = contract.Speculative(d.method, d.label, dshape.params, DRAFT_WEIGHTS, dshape.draft_vocab_size,
                                           d.max_draft_tree_size, d.max_verify_tree_size, draft_mem,
                                           steps=d.steps if d.method == "mtp" else None)
    argvs = backends.get(backend).build_commands(limits, speculative, visual.limits if visual else None,
                                                 audio.profile if audio else None) if ok and backend else None
    return Plan(
        recipe=req.recipe, model=contract.ModelInfo(req.model_label, req.shape.architecture, req.shape.total_params),
        target=t.id, target_name=t.name, sm=t.sm, backend=backend, stack=stack.stack if stack else None,
        quant=contract.QuantSettings(req.weights, req.kv_cache, group_size, fmt.label), limits=limits,
        fits=memory.fits, ok=ok, memory=memory, predicted_decode_tok_s=by_mode.get(mode), prediction=prediction,
        refused=refused, warnings=warnings, speculative=speculative, device_build_commands=argvs,
        build_on_board=on_board, predicted_ttft_ms=ttft, externalized_weights=list(
            externalized_kinds(on_board, req.shape.keeps_dense_ffn(), req.shape.externalizable())),
        predicted_build_s=build_s, visual=visual, audio=audio)


def _draft(req: PlanRequest, engine: backends.Backend, backend: str | None, refused: list[str],
           warnings: list[str]):
    """A draft's refusals (a backend without draft engines, another base's draft, a model without MTP layers),
    warnings and memory."""
    if req.draft is None:
        return None
    from pipeline.plan.speculative import draft_memory, pairing_problems, pairing_warnings
    d = req.draft
    what = "EAGLE-3 draft" if d.method == "eagle3" else "MTP draft"
    if backend is not None and not engine.speculative:
        refused.append(f"{d.method} speculative decoding is built by TensorRT Edge-LLM only (llm_build "
                       f"--specBase/--specDraft); {engine.label} on {req.target.id} has no {what} "
                       f"engines. Remove [draft], or target a stack whose backend builds them "
                       f"(backend = {backends.speculative_names()}).")
    if d.method == "mtp":
        support = backends.family_support(backend, req.shape.architecture) if backend else None
        if d.shape is None:
            refused.append(f"[draft] method = \"mtp\": {req.model_label}'s config names no multi-token prediction "
                           "layers (mtp_num_hidden_layers), so there is no MTP draft to build. Remove [draft], or "
                           "use the model's own checkpoint, whose config names them.")
            return None
        if support is not None and support.mtp_draft_unbuilt:
            refused.append(f"[draft] method = \"mtp\": {support.mtp_draft_unbuilt} ({req.shape.architecture}). "
                           "Remove [draft] to build the model without its MTP draft.")
    assert d.shape is not None
    refused.extend(f"{p}. Use the draft trained for this base model." for p in
                   pairing_problems(d.shape, req.shape, d.label))
    warnings.extend(pairing_warnings(d.shape, req.shape, d.label))
    return draft_memory(d.shape, req.limits.max_seq_len, req.limits.max_batch_size, d.max_draft_tree_size)


def _memory_verdict(req: PlanRequest, fmt, memory, refused: list[str], warnings: list[str]) -> None:
    """A plan that does not fit is refused with what it needs, what the board has, and what to change; one that fits
    only a headless board is a warning."""
    t = req.target
    if not memory.fits:
        if memory.fits_headless:
            warnings.append(f"needs {gb(memory.total)}: more than the {gb(memory.usable)} usable with the desktop "
                            f"running, within the {gb(memory.usable_headless)} of a headless {t.id}. Boot to "
                            "multi-user.target (no desktop) before running.")
        else:
            fix = []
            if memory.max_seq_len_that_fits >= 2:
                fix.append(f"max_seq_len <= {memory.max_seq_len_that_fits} at batch {req.limits.max_batch_size}")
            fix.append(f"a smaller weight format ({SMALLEST.name})" if fmt is not SMALLEST else "a smaller model")
            fix.append("a target with more memory")
            refused.append(
                f"does not fit: needs {gb(memory.total)} (weights {gb(memory.weights)}, embedding "
                f"{gb(memory.embedding)}, lm_head {gb(memory.lm_head)}, KV cache {gb(memory.kv_cache)}, "
                + (f"recurrent state {gb(memory.recurrent_state)}, " if memory.recurrent_state else "")
                + (f"draft {gb(memory.draft)}, " if memory.draft else "")
                + (f"visual engine {gb(memory.visual)}, " if memory.visual else "")
                + (f"audio encoder {gb(memory.audio)}, " if memory.audio else "") +
                f"activations {gb(memory.activations)}, runtime {gb(memory.runtime_overhead)}) but {t.id} has "
                f"{gb(memory.usable)} usable ({gb(memory.usable_headless)} headless); short by "
                f"{gb(-memory.margin)}. Try: {'; '.join(fix)}.")


def refuse(plan: Plan, reason: str) -> Plan:
    """The plan with one more reason it cannot be built (no build commands then)."""
    return dataclasses.replace(plan, refused=[*plan.refused, reason], ok=False, device_build_commands=None)


def externalizable_share(shape) -> float:
    """The share of the quantized weights Edge-LLM's export can keep outside the engine: int4_ffn (the dense MLPs)
    and the parts' kinds (an MoE model's int4_moe: its experts)."""
    ffn = sum(i * o * n for name, i, o, n in shape.linears()
              if name in MLP_NAMES or name.startswith(shape.externalizable_rows()))
    return ffn / shape.linear_params


def _build_memory(req: PlanRequest, engine: backends.Backend, fmt, memory: MemoryPlan
                  ) -> tuple[MemoryPlan, contract.BuildOnBoard]:
    """The backend's build-memory model, and the first way to build on the target board itself."""
    from pipeline.plan.buildmem import build_on_board, externalized_kinds

    t = req.target
    estimate = engine.build_memory
    engine_weights = memory.weights + memory.embedding + memory.lm_head
    build = estimate(engine_weights, memory.activations, 0)
    externalized = None
    if engine.externalizes_int4_ffn and fmt.edgellm_int4_plugin:
        externalized = estimate(engine_weights, memory.activations,
                                int(memory.weights * externalizable_share(req.shape)))
    bigger = tuple(o.id for o in load_targets().values() if o.sm == t.sm and o.family == t.family and o.id != t.id
                   and o.usable_headless_bytes >= build.peak)
    on_board = build_on_board(build, t.usable_bytes, t.usable_headless_bytes, t.id, externalized, bigger)
    if externalized_kinds(on_board):            # the export keeps them outside the engine: the device builds with less
        assert externalized is not None
        build = externalized
    memory = dataclasses.replace(memory, build_peak=build.peak, build_host=build.host_total,
                                 build_device=build.device_total)
    return memory, on_board


def render_table(plan: Plan) -> str:
    """The plan as a text table for terminals (doit plan, python -m pipeline plan)."""
    if plan.speech is not None:     # a speech model without a decoder's parts: its own table
        from pipeline.plan.speech_plan import render
        lines = [render(plan.speech)] + [f"  warning: {w}" for w in plan.warnings]
        lines += [f"  build: {' '.join(c)}" for c in plan.device_build_commands or []]
        return "\n".join(lines + [f"  REFUSED: {r}" for r in plan.refused])
    m, q, lim, p = plan.memory, plan.quant, plan.limits, plan.prediction
    lines = [f"plan: {plan.model.name} ({q.label}, KV {q.kv_cache}) on {plan.target_name} [SM {plan.sm}] via "
             f"{backends.get(plan.backend).label if plan.backend else 'no backend'}"]
    if plan.stack:
        s = plan.stack
        lines.append(f"  stack        JetPack {'/'.join(s.jetpack)}, CUDA {s.cuda}, TensorRT {s.tensorrt}, "
                     f"{plan.backend} {s.backend_version}")
    lines.append(f"  limits       batch {lim.max_batch_size}, input {lim.max_input_len}, "
                 f"seq {lim.max_seq_len}, group size {q.group_size}")
    if m:
        for key in ("weights", "embedding", "lm_head", "kv_cache", "recurrent_state", "draft", "visual", "audio",
                    "activations", "runtime_overhead"):
            if key in ("draft", "visual", "audio", "recurrent_state") and not getattr(m, key):
                continue
            lines.append(f"  {key.replace('_overhead', '').replace('_state', ''):<12} {gb(getattr(m, key)):>10}")
        lines.append(f"  {'total':<12} {gb(m.total):>10} of {gb(m.usable)} usable "
                     f"({'fits' if m.fits else 'DOES NOT FIT'}, margin {gb(m.margin)})")
        lines.append(f"  largest      max_seq_len {m.max_seq_len_that_fits} at batch {lim.max_batch_size}; "
                     f"batch {m.max_batch_that_fits} at max_seq_len {lim.max_seq_len}")
        lines.append(f"  build peak   {gb(m.build_peak):>10} on the device (GPU-pinned {gb(m.build_device)}, "
                     f"pageable {gb(m.build_host)})")
    if plan.predicted_decode_tok_s is not None and p is not None:
        lines.append(f"  decode       ~{plan.predicted_decode_tok_s} tok/s at {p.power_mode} "
                     f"({p.bandwidth_gbs} GB/s), context {p.context_tokens}")
    if plan.predicted_ttft_ms is not None and p is not None and p.ttft_error_band is not None:
        lines.append(f"  TTFT         ~{plan.predicted_ttft_ms:.0f} ms for a {p.ttft_input_tokens}-token prompt "
                     f"(+-{p.ttft_error_band:.0%}, the fit's leave-one-out median error)")
    lines += [line for kind in PARTS for line in kind.plan_lines(plan)]
    lines += [f"  warning: {w}" for w in plan.warnings]
    b = plan.build_on_board
    if plan.externalized_weights:
        lines.append(f"  export       {', '.join(plan.externalized_weights)} weights kept outside the engine (Edge-LLM "
                     "external weight files): the build holds less")
    if b and b.how != "as-is" and not plan.refused:
        lines.append(f"  build on the {plan.target}: {b.how}: {b.note}")
        lines += [f"    {c}" for c in b.commands]
    lines += [f"  REFUSED: {r}" for r in plan.refused]
    return "\n".join(lines)
