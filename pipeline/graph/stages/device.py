"""device: the device half of a recipe whose builder builds (local, ssh://): the kit verified, gated, built into an
engine, validated and bundled on the builder; the bundle and report land in artifacts/<recipe>/device."""

from __future__ import annotations

import hashlib
from pathlib import Path

from pipeline import contract
from pipeline.errors import PipelineError
from pipeline.graph.stage import Input, RecipeGraph, Stage, StageRun, recipe_path
from pipeline.graph.stages.package import PACKAGE, kit_path

KIT_STAMP = "kit.sha256"        # the digest of the kit the results were built from


def device_results(g: RecipeGraph, target: str) -> Path:
    return recipe_path(g.recipe, DEVICE.name, target)


def _kit_digest(g: RecipeGraph, target: str) -> str | None:
    from pipeline.files import read_regular
    try:
        return hashlib.sha256(read_regular(kit_path(g, target) / contract.SUMS, 2**20)).hexdigest()
    except (PipelineError, OSError):
        return None


def device_current(g: RecipeGraph, target: str | None) -> bool:
    from pipeline.files import read_regular
    assert target is not None
    try:        # bounded, regular files only: a FIFO planted in artifacts/ is "not built", not a hang
        stamp = read_regular(device_results(g, target) / KIT_STAMP, 256).decode("ascii", "replace")
    except (PipelineError, OSError):
        return False
    digest = _kit_digest(g, target)
    return digest is not None and stamp == digest


def do_device(run: StageRun) -> None:
    """The device half through the recipe's builder: the bundle and report land in artifacts/<recipe>/device."""
    g, target = run.graph, run.target
    assert target is not None
    kit, results = kit_path(g, target), device_results(g, target)
    rc = g.recipe.build.builder.run(kit, results)
    if rc != 0:
        raise PipelineError(f"{g.recipe.name} on {target}: the engine was built but failed validation; "
                            f"see {results}", "the report names the failed check and by how much")
    from pipeline.files import write_atomic
    write_atomic(results / KIT_STAMP, _kit_digest(g, target) or "")


# not captured: the device half's own progress lines (build, validation) stream to the terminal
DEVICE = Stage("device", "On the recipe's builder (local or ssh://): verify, gate, build the engine, validate, bring "
               "back the bundle.", lambda _result: "engine built and validated", do_device,
               inputs=(Input(PACKAGE, keyed=False),), per_target=True, applies=lambda r: r.build.builder.builds,
               link=False, capture=False, current=device_current)
