"""The kit end of the graph: the package stage (quality gate, assembly, signing), the check of the finished kit,
what to do with it, and the device stage that hands it to the recipe's builder.

The stages before it (fetch ... accuracy) are in pipeline/graph/actions.py; this module only reads their outputs,
each as its stage recorded it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from pipeline import contract
from pipeline.errors import PipelineError
from pipeline.graph.actions import damaged_output, fetch_digest, model_dir, recorded_record
from pipeline.graph.cmdline import stage_cache
from pipeline.graph.framework import StageSpec, run_stage
from pipeline.graph.specs import (
    accuracy_spec,
    draft_fetch_spec,
    export_payload,
    export_spec,
    fetch_spec,
    goldens_spec,
    package_spec,
    quantize_spec,
    recipe_link,
    recipe_path,
    recipe_plan,
)
from pipeline.graph.stages import ACCURACY, DEVICE, EXPORT, FETCH, FETCH_DRAFT, GOLDENS, QUANTIZE
from pipeline.recipe import Recipe


def link_recipe(recipe: Recipe) -> str:
    """artifacts/<recipe>/<stage> links for every built stage (stages skipped as current are shared, not re-run);
    returns what to do with the recipe's kits."""
    instructions = []
    for stage, spec in ((FETCH.name, fetch_spec(recipe)), (FETCH_DRAFT.name, draft_fetch_spec(recipe)),
                        (QUANTIZE.name, quantize_spec(recipe)),
                        (GOLDENS.name, goldens_spec(recipe)), (ACCURACY.name, accuracy_spec(recipe))):
        if spec is not None and spec.dir.is_dir():
            recipe_link(recipe, stage, None, spec)
    for target in recipe.targets:
        spec = export_spec(recipe, recipe_plan(recipe, target))
        if spec.dir.is_dir():
            recipe_link(recipe, EXPORT.name, target, spec)
        spec = _package_spec(recipe, target)
        if spec.dir.is_dir():
            recipe_link(recipe, "kit", target, spec)
            check_built_kit(recipe, target, spec)
            instructions.append(kit_instructions(recipe, target))
    return "\n".join(instructions)


def check_built_kit(recipe: Recipe, target: str, spec: StageSpec) -> None:
    """The finished kit, as a no-op build sees it. The package stage verified it exactly as a device will (signature,
    name, file set, every part's sha256) before recording it; since then the stage's manifest vouches for every file
    by size and mtime (status(), as for every stage: a file whose mtime moved is re-hashed), so here only the kit
    folder's listing is compared with what was packed. An extra or missing file, or a stage no longer current, means
    a full check as a device does: a kit that would fail it is a failed build, re-packed by the next one. (Damage that
    keeps size and mtime is left to `verify`, which every device command runs.)"""
    import os

    from pipeline.graph.framework import MANIFEST, built_manifest, status

    kit = kit_path(recipe, target)
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


def _verify(kit: Path) -> None:
    """The kit checked exactly as a device checks it, with this workstation's key."""
    from pipeline.kit.signing import signing_key
    from pipeline.kit.verify import check_kit
    check_kit(kit, [signing_key(create=True).public])


def _quality_gate(recipe: Recipe) -> str | None:
    """The recipe's accuracy limits, before anything is signed (graph/quality.py)."""
    from pipeline.graph.cmdline import accept_quality
    from pipeline.graph.framework import artifacts_dir
    from pipeline.graph.quality import gate, measured_formats

    spec = accuracy_spec(recipe)
    accuracy = recorded_record(spec, contract.ACCURACY_JSON, contract.AccuracyReport)
    others = measured_formats(artifacts_dir() / "stages", fetch_digest(recipe), accuracy.heldout)
    return gate(accuracy, recipe.validation, others, recipe.file,
                recipe.validation.accept_quality or accept_quality())


def _prompts_fit(recipe: Recipe, plan: contract.Plan) -> None:
    """Every golden prompt fits the engine the plan builds (the limits may have changed since the goldens ran)."""
    from pipeline.workstation.evaluate import prompts_too_long

    goldens = recorded_record(goldens_spec(recipe), contract.GOLDENS, contract.Goldens)
    lengths = [(p.prompt, len(p.input_ids)) for p in goldens.prompts]
    long = prompts_too_long(lengths, goldens.max_new_tokens, plan.limits.max_input_len, plan.limits.max_seq_len)
    if long:
        raise PipelineError(f"{recipe.file}: {long[0]}; nothing was signed",
                            "shorten the prompt or max_new_tokens, or raise build.max_input_len / build.max_seq_len")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "generation_config.json")


def _package_spec(recipe: Recipe, target: str) -> StageSpec:
    from pipeline.kit.signing import signing_key
    return package_spec(recipe, target, recipe_plan(recipe, target), signing_key(create=True).public.id_hex)


def package_current(recipe: Recipe, target: str) -> bool:
    from pipeline.graph.framework import is_current
    return is_current(_package_spec(recipe, target))


def kit_name(recipe: Recipe, target: str) -> str:
    return f"{recipe.name}@{target}"


def do_package(recipe: Recipe, target: str) -> contract.StageManifest:
    """Assemble the kit's contents and pack them, signed, into the stage directory."""
    import shutil

    from pipeline import __version__
    from pipeline.files import link_or_copy
    from pipeline.graph.framework import built_manifest
    from pipeline.kit.archive import DamagedInput, pack
    from pipeline.kit.signing import signing_key

    plan = recipe_plan(recipe, target)
    key = signing_key(create=True)
    spec = package_spec(recipe, target, plan, key.public.id_hex)
    export_dir, payload = export_spec(recipe, plan).dir, export_payload(plan)

    quality = _quality_gate(recipe)     # refuses here, before anything is assembled or signed
    _prompts_fit(recipe, plan)
    goldens = recorded_record(goldens_spec(recipe), contract.GOLDENS, contract.Goldens)
    goldens_images = sorted({p.image for p in goldens.prompts if p.image})
    planted = [name for name in goldens_images if not contract.IMAGE_FILE_RE.match(name)]
    if planted:         # a goldens.json naming a file outside its images/ (damaged or planted): never followed
        raise damaged_output(goldens_spec(recipe), f"goldens.json names image file {planted[0]!r}, not one of "
                                                   "images/NAME the goldens stage writes")

    def build(out: Path) -> dict:
        content = out / ".content"
        for f in sorted((export_dir / payload).rglob("*")):
            if f.is_file():
                link_or_copy(f, content / payload / f.relative_to(export_dir / payload))
        for name in TOKENIZER_FILES:
            if (model_dir(recipe) / name).is_file():
                link_or_copy(model_dir(recipe) / name, content / contract.TOKENIZER_DIR / name)
        link_or_copy(goldens_spec(recipe).dir / contract.GOLDENS, content / contract.GOLDENS)
        for name in goldens_images:      # the images the image prompts are asked with (images/<name>)
            link_or_copy(goldens_spec(recipe).dir / name, content / name)
        for name in (contract.ACCURACY_JSON, contract.ACCURACY_MD):
            link_or_copy(accuracy_spec(recipe).dir / name, content / name)
        shutil.copy2(recipe.file, content / contract.RECIPE)
        plan.dump(content / contract.PLAN)
        built = {s.stage: built_manifest(s.dir) for s in spec.inputs}
        stages = contract.Stages({name: contract.StageRef(m.id, m.key, m.content_digest, m.tools)
                                  for name, m in built.items()})
        stages.dump(content / contract.STAGES)
        export = built_manifest(export_dir).export
        meta = contract.KitMeta(
            recipe=recipe.name, target=target, sm=plan.sm, backend=plan.backend, stack=plan.stack, quant=plan.quant,
            limits=plan.limits, versions={"jetson-trtllm-pipeline": __version__, **stages.stages[EXPORT.name].tools},
            export=export.for_kit() if export else None)
        # every file as its producing stage recorded it: same-size damage since (bit rot, a restored copy) is
        # refused while packing, naming the file and its stage, and the stage re-runs on the next build
        owners: dict[str, tuple[StageSpec, str]] = {}
        for stage, src, inside, names in ((export_spec(recipe, plan), export_dir / payload, payload, ()),
                                          (fetch_spec(recipe), model_dir(recipe), contract.TOKENIZER_DIR,
                                           TOKENIZER_FILES),
                                          (goldens_spec(recipe), goldens_spec(recipe).dir, "",
                                           (contract.GOLDENS, *goldens_images)),
                                          (accuracy_spec(recipe), accuracy_spec(recipe).dir, "",
                                           (contract.ACCURACY_JSON, contract.ACCURACY_MD))):
            for rel, sha in _recorded_hashes(stage.dir, src, inside, names).items():
                owners[rel] = (stage, sha)
        from pipeline.files import sha256_file
        recorded = {rel: sha for rel, (_, sha) in owners.items()}
        for p in sorted(content.rglob("*")):
            rel = p.relative_to(content).as_posix()
            if p.is_file() and rel not in recorded:
                recorded[rel] = sha256_file(p)      # written by this stage: plan, stage list, recipe
        try:
            kit = pack(content, out / kit_name(recipe, target), kit_name(recipe, target), "kit", key, meta=meta,
                       expected=recorded)
        except DamagedInput as exc:
            if exc.rel not in owners:      # a file this stage wrote itself: the package stage re-runs anyway
                raise PipelineError(f"{exc.message}; written by the package stage ({out})", exc.hint) from None
            raise damaged_output(owners[exc.rel][0], exc.message) from None
        shutil.rmtree(content)
        _verify(kit.path)       # as a device will: only a kit that passes is recorded (and then checked by stat)
        return {"kit": contract.KitSummary(kit.name, len(kit.manifest.parts), kit.manifest.total_size, kit.signed_by,
                                           quality)}

    manifest = run_stage(spec, build, stage_cache())
    recipe_link(recipe, "kit", target, spec)
    return manifest


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


def kit_path(recipe: Recipe, target: str) -> Path:
    return recipe_path(recipe, "kit", target) / kit_name(recipe, target)


def kit_instructions(recipe: Recipe, target: str) -> str:
    """What to do with a kit: where it is, how to copy it, and the command to run where it will sit on the device
    (a stick mounted at /media/usb: the workstation's path means nothing there)."""
    kit = kit_path(recipe, target)
    try:
        shown = kit.relative_to(Path.cwd())
    except ValueError:
        shown = kit
    name = kit_name(recipe, target)
    if recipe.build.builder.builds:
        return f"kit {shown} built on {recipe.build.builder.label}: see {device_results(recipe, target)}"
    return (f"kit {shown}\n"
            f"  copy it:      python -m pipeline transfer {shown} /media/usb\n"
            f"  on the Jetson: python -m pipeline device /media/usb/{name}")


# ------------------------------------------------------------------------------------------------ device (builders)
def device_results(recipe: Recipe, target: str) -> Path:
    return recipe_path(recipe, DEVICE.name, target)


def _kit_digest(recipe: Recipe, target: str) -> str | None:
    from pipeline.files import read_regular
    try:
        return hashlib.sha256(read_regular(kit_path(recipe, target) / contract.SUMS, 2**20)).hexdigest()
    except (PipelineError, OSError):
        return None


def device_current(recipe: Recipe, target: str) -> bool:
    from pipeline.files import read_regular
    try:        # bounded, regular files only: a FIFO planted in artifacts/ is "not built", not a hang
        stamp = read_regular(device_results(recipe, target) / "kit.sha256", 256).decode("ascii", "replace")
    except (PipelineError, OSError):
        return False
    digest = _kit_digest(recipe, target)
    return digest is not None and stamp == digest


def do_device(recipe: Recipe, target: str) -> None:
    """The device half through the recipe's builder: the bundle and report land in artifacts/<recipe>/device."""
    kit, results = kit_path(recipe, target), device_results(recipe, target)
    rc = recipe.build.builder.run(kit, results)
    if rc != 0:
        raise PipelineError(f"{recipe.name} on {target}: the engine was built but failed validation; "
                            f"see {results}", "the report names the failed check and by how much")
    from pipeline.files import write_atomic
    write_atomic(results / "kit.sha256", _kit_digest(recipe, target) or "")
