"""build: every stage of a recipe; its action links artifacts/<recipe>/<stage> to each built stage (shared stages
skipped as current are not re-run) and says what to do with the kits."""

from __future__ import annotations

from pathlib import Path

from pipeline.graph.stage import Input, RecipeGraph, Stage, StageRun
from pipeline.graph.stages.accuracy import ACCURACY
from pipeline.graph.stages.device import DEVICE, device_results
from pipeline.graph.stages.export import EXPORT
from pipeline.graph.stages.goldens import GOLDENS
from pipeline.graph.stages.package import PACKAGE, check_built_kit, kit_name, kit_path
from pipeline.graph.stages.plan import FETCH, FETCH_BASE, FETCH_DRAFT, PLAN
from pipeline.graph.stages.quantize import QUANTIZE

BUILT = (PLAN, FETCH, FETCH_DRAFT, FETCH_BASE, QUANTIZE, EXPORT, GOLDENS, ACCURACY, PACKAGE, DEVICE)


def kit_instructions(g: RecipeGraph, target: str) -> str:
    """What to do with a kit: where it is, how to copy it, and the command to run where it will sit on the device
    (a stick mounted at /media/usb: the workstation's path means nothing there)."""
    kit = kit_path(g, target)
    try:
        shown = kit.relative_to(Path.cwd())
    except ValueError:
        shown = kit
    name = kit_name(g, target)
    if g.recipe.build.builder.builds:
        return f"kit {shown} built on {g.recipe.build.builder.label}: see {device_results(g, target)}"
    return (f"kit {shown}\n"
            f"  copy it:      python -m pipeline transfer {shown} /media/usb\n"
            f"  on the Jetson: python -m pipeline device /media/usb/{name}")


def link_recipe(run: StageRun) -> str:
    """artifacts/<recipe>/<stage> links for every built stage; returns what to do with the recipe's kits."""
    g = run.graph
    for stage in BUILT:
        for target in (g.recipe.targets if stage.per_target else [None]):
            g.link(stage, target)
    instructions = []
    for target in g.recipe.targets:
        spec = g.spec(PACKAGE, target)
        if spec is not None and spec.dir.is_dir():
            check_built_kit(g, target)
            instructions.append(kit_instructions(g, target))
    return "\n".join(instructions)


BUILD = Stage("build", "Every stage of the selected recipes.", str, link_recipe,
              inputs=tuple(Input(s, keyed=False) for s in BUILT), link=False)
