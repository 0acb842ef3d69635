"""package: the target's kit (the export's payload, tokenizer, recipe, plan, goldens, accuracy), after the quality
gate and before anything is signed; signed, split and checksummed, then checked exactly as a device will check it.
Every file goes in as its producing stage recorded it."""

from __future__ import annotations

import hashlib
from pathlib import Path

from pipeline import contract
from pipeline.errors import PipelineError
from pipeline.graph.framework import StageSpec, damaged_output, recorded_record
from pipeline.graph.stage import Input, RecipeGraph, Stage, StageKey, StageRun, count, recipe_path
from pipeline.graph.stages.accuracy import ACCURACY
from pipeline.graph.stages.export import EXPORT, payload
from pipeline.graph.stages.goldens import GOLDENS
from pipeline.graph.stages.plan import FETCH, PLAN, fetch_digest, model_dir, plan_of

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "generation_config.json")
KIT_DIR = "kit"         # artifacts/<recipe>/kit[@target]: the package stage's directory, which holds the kit


def _summary(result: contract.StageManifest) -> str:
    k = result.kit
    assert k is not None        # the package stage's build returns it
    line = f"{k.name}, {count(k.parts, 'part')}, {k.total_size / 1e6:.1f} MB, signed by {k.signed_by}"
    return line + (f"\n  warning: {k.quality}" if k.quality else "")


def _key(g: RecipeGraph, target: str | None) -> StageKey:
    """The kit for one target: its identity is the recipe text, the plan, the signing key and the stage outputs."""
    from pipeline.kit.signing import signing_key
    assert target is not None
    # the recipe's name is part of the key: a copied recipe (same bytes) gets its own kit, named after it
    return StageKey({"name": g.recipe.name, "target": target,
                     "plan": hashlib.sha256(plan_of(g, target).dumps().encode()).hexdigest(),
                     "recipe": hashlib.sha256(Path(g.recipe.file).read_bytes()).hexdigest(),
                     "key": signing_key(create=True).public.id_hex})


def kit_name(g: RecipeGraph, target: str) -> str:
    return f"{g.recipe.name}@{target}"


def kit_path(g: RecipeGraph, target: str) -> Path:
    return recipe_path(g.recipe, KIT_DIR, target) / kit_name(g, target)


def _verify(kit: Path) -> None:
    """The kit checked exactly as a device checks it, with this workstation's key."""
    from pipeline.kit.signing import signing_key
    from pipeline.kit.verify import check_kit
    check_kit(kit, [signing_key(create=True).public])


def _quality_gate(g: RecipeGraph) -> str | None:
    """The recipe's accuracy limits, before anything is signed (graph/quality.py)."""
    from pipeline.graph.quality import gate, measured_formats

    spec = g.spec(ACCURACY)
    assert spec is not None
    accuracy = recorded_record(spec, contract.ACCURACY_JSON, contract.AccuracyReport)
    others = measured_formats(spec.dir.parent.parent, fetch_digest(g), accuracy.heldout)
    return gate(accuracy, g.recipe.validation, others, g.recipe.file,
                g.recipe.validation.accept_quality or g.accept_quality)


def _speech_gate(g: RecipeGraph, goldens: contract.Goldens, quality: str | None) -> str | None:
    """The speech set's error rates as the reference model scored them, and a text-to-speech recipe's round trip as
    its transcriber's checkpoint heard the reference's speech, against the recipe's limits (accept_quality signs
    anyway, and says so)."""
    from pipeline.device.round_trip import workstation_over_limit
    from pipeline.device.speech import over_limit
    missed = over_limit(goldens.speech, goldens.speech.reference) if goldens.speech is not None else []
    trip = goldens.synthesis.round_trip if goldens.synthesis is not None else None
    unheard = workstation_over_limit(trip) if trip is not None else None
    if not missed and unheard is None:
        return quality
    text = f"{g.recipe.weights} misses the recipe's speech gate: {'; '.join([*missed, *filter(None, [unheard])])}"
    if g.recipe.validation.accept_quality or g.accept_quality:
        return "; ".join(filter(None, [quality, f"signed anyway (accept_quality): {text}"]))
    raise PipelineError(f"{g.recipe.file}: {text}; nothing was signed",
                        "listen to the goldens' audio/tts-*.wav: speech that does not say its text is a model or "
                        "voice to fix; raise validation.round_trip.max_error_rate if the transcriber hears the "
                        "language worse than the speech deserves, or sign anyway with [validation] accept_quality = "
                        "true" if unheard is not None else
                        "use a format that keeps more precision (quantization.weights), raise "
                        "validation.speech.max_error_rate if the set is harder than the deployment, or sign anyway "
                        "with [validation] accept_quality = true")


def _prompts_fit(g: RecipeGraph, plan: contract.Plan) -> None:
    """Every golden prompt fits the engine the plan builds (the limits may have changed since the goldens ran)."""
    from pipeline.workstation.evaluate import prompts_too_long

    goldens = recorded_record(_spec(g, GOLDENS), contract.GOLDENS, contract.Goldens)
    lengths = [(p.prompt, len(p.input_ids)) for p in goldens.prompts]
    long = prompts_too_long(lengths, goldens.max_new_tokens, plan.limits.max_input_len, plan.limits.max_seq_len)
    if long:
        raise PipelineError(f"{g.recipe.file}: {long[0]}; nothing was signed",
                            "shorten the prompt or max_new_tokens, or raise build.max_input_len / build.max_seq_len")


def _spec(g: RecipeGraph, stage: Stage, target: str | None = None) -> StageSpec:
    spec = g.spec(stage, target)
    assert spec is not None, stage.name
    return spec


def do_package(run: StageRun) -> contract.StageManifest:
    """Assemble the kit's contents and pack them, signed, into the stage directory."""
    import shutil

    from pipeline import __version__
    from pipeline.files import link_or_copy, sha256_file
    from pipeline.graph.framework import built_manifest
    from pipeline.kit.archive import DamagedInput, pack
    from pipeline.kit.signing import signing_key

    g, target = run.graph, run.target
    assert target is not None
    recipe, plan, spec = g.recipe, plan_of(g, target), run.spec
    key = signing_key(create=True)
    export, goldens_spec, accuracy_spec = _spec(g, EXPORT, target), _spec(g, GOLDENS), _spec(g, ACCURACY)
    export_dir, carried = export.dir, payload(g, target)

    quality = _quality_gate(g)     # refuses here, before anything is assembled or signed
    _prompts_fit(g, plan)
    goldens = recorded_record(goldens_spec, contract.GOLDENS, contract.Goldens)
    quality = _speech_gate(g, goldens, quality)
    # the images and recordings the goldens are asked with (images/<name>, audio/<name>.wav), the speech set's
    goldens_media = sorted({p.image for p in goldens.prompts if p.image} |
                           {p.recording for p in goldens.prompts if p.recording} |
                           {u.recording for u in (goldens.speech.utterances if goldens.speech else [])} |
                           {u.recording for u in (goldens.synthesis.utterances if goldens.synthesis else [])})
    planted = [name for name in goldens_media
               if not (contract.IMAGE_FILE_RE.match(name) or contract.RECORDING_FILE_RE.match(name))]
    if planted:         # a goldens.json naming a file outside its images/ (damaged or planted): never followed
        raise damaged_output(goldens_spec, f"goldens.json names media file {planted[0]!r}, not one of "
                                           "images/NAME or audio/NAME.wav the goldens stage writes")

    def build(out: Path) -> contract.KitSummary:
        content = out / ".content"
        for f in sorted((export_dir / carried).rglob("*")):
            if f.is_file():
                link_or_copy(f, content / carried / f.relative_to(export_dir / carried))
        for name in TOKENIZER_FILES:
            if (model_dir(g) / name).is_file():
                link_or_copy(model_dir(g) / name, content / contract.TOKENIZER_DIR / name)
        link_or_copy(goldens_spec.dir / contract.GOLDENS, content / contract.GOLDENS)
        for name in goldens_media:
            link_or_copy(goldens_spec.dir / name, content / name)
        for name in (contract.ACCURACY_JSON, contract.ACCURACY_MD):
            link_or_copy(accuracy_spec.dir / name, content / name)
        shutil.copy2(recipe.file, content / contract.RECIPE)
        plan.dump(content / contract.PLAN)
        built = {s.stage: built_manifest(s.dir) for s in spec.inputs}
        stages = contract.Stages({name: contract.StageRef(m.id, m.key, m.content_digest, m.tools)
                                  for name, m in built.items()})
        stages.dump(content / contract.STAGES)
        exported = built_manifest(export_dir).export
        meta = contract.KitMeta(
            recipe=recipe.name, target=target, sm=plan.sm, backend=plan.backend, stack=plan.stack, quant=plan.quant,
            limits=plan.limits, versions={"jetson-trtllm-pipeline": __version__, **stages.stages[EXPORT.name].tools},
            export=exported.for_kit() if exported else None)
        # every file as its producing stage recorded it: same-size damage since (bit rot, a restored copy) is
        # refused while packing, naming the file and its stage, and the stage re-runs on the next build
        owners: dict[str, tuple[StageSpec, str]] = {}
        for stage, src, inside, names in ((export, export_dir / carried, carried, ()),
                                          (_spec(g, FETCH), model_dir(g), contract.TOKENIZER_DIR, TOKENIZER_FILES),
                                          (goldens_spec, goldens_spec.dir, "", (contract.GOLDENS, *goldens_media)),
                                          (accuracy_spec, accuracy_spec.dir, "",
                                           (contract.ACCURACY_JSON, contract.ACCURACY_MD))):
            for rel, sha in _recorded_hashes(stage.dir, src, inside, names).items():
                owners[rel] = (stage, sha)
        recorded = {rel: sha for rel, (_, sha) in owners.items()}
        for p in sorted(content.rglob("*")):
            rel = p.relative_to(content).as_posix()
            if p.is_file() and rel not in recorded:
                recorded[rel] = sha256_file(p)      # written by this stage: plan, stage list, recipe
        try:
            kit = pack(content, out / kit_name(g, target), kit_name(g, target), "kit", key, meta=meta,
                       expected=recorded)
        except DamagedInput as exc:
            if exc.rel not in owners:      # a file this stage wrote itself: the package stage re-runs anyway
                raise PipelineError(f"{exc.message}; written by the package stage ({out})", exc.hint) from None
            raise damaged_output(owners[exc.rel][0], exc.message) from None
        shutil.rmtree(content)
        _verify(kit.path)       # as a device will: only a kit that passes is recorded (and then checked by stat)
        return contract.KitSummary(kit.name, len(kit.manifest.parts), kit.manifest.total_size, kit.signed_by,
                                   quality)

    return run.build(build)


def _recorded_hashes(stage_dir: Path, src: Path, inside: str, names: tuple[str, ...] = ()) -> dict[str, str]:
    """sha256 of the stage's files under `src` as its stage.json recorded them, keyed by their path in the kit."""
    from pipeline.graph.framework import built_manifest
    files = built_manifest(stage_dir).files
    out = {}
    prefix = src.relative_to(stage_dir).as_posix()
    for rel, f in files.items():
        under = rel if prefix == "." else rel[len(prefix) + 1:] if rel.startswith(prefix + "/") else None
        if under is None or (names and under not in names):
            continue
        out[f"{inside}/{under}" if inside else under] = f.sha256
    return out


def check_built_kit(g: RecipeGraph, target: str) -> None:
    """The finished kit, as a no-op build sees it. The package stage verified it exactly as a device will (signature,
    name, file set, every part's sha256) before recording it; since then the stage's manifest vouches for every file
    by size and mtime (status(), as for every stage: a file whose mtime moved is re-hashed), so here only the kit
    folder's listing is compared with what was packed. An extra or missing file, or a stage no longer current, means
    a full check as a device does: a kit that would fail it is a failed build, re-packed by the next one. (Damage that
    keeps size and mtime is left to `verify`, which every device command runs.)"""
    import os

    from pipeline.graph.framework import MANIFEST, built_manifest, status

    spec = _spec(g, PACKAGE, target)
    kit = kit_path(g, target)
    packed = {rel.split("/", 1)[1] for rel in built_manifest(spec.dir).files if "/" in rel}
    try:
        listed = set(os.listdir(kit))
    except OSError:
        listed = set()
    if listed == packed and status(spec)[0]:
        return
    try:
        _verify(kit)
    except PipelineError as exc:
        (spec.dir / MANIFEST).unlink(missing_ok=True)
        raise PipelineError(f"the kit would not pass `verify` on a device: {exc.message}",
                            "run the build again: the kit is re-packed from the stages' outputs") from None


PACKAGE = Stage("package", "Pack the target's kit: checkpoint, tokenizer, recipe, plan, goldens, accuracy; signed, "
                "split, checksummed.", _summary, do_package,
                inputs=(Input(FETCH), Input(EXPORT), Input(GOLDENS), Input(ACCURACY), Input(PLAN, keyed=False)),
                key=_key, result=contract.KitSummary, per_target=True, link_as=KIT_DIR,
                version=2)      # 2: a text-to-speech kit carries the reference's waveforms (goldens' audio/)
