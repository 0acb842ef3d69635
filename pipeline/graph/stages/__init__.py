"""The workstation's stages, one table: each row (a `Stage`, graph/stage.py) declared whole in its own module, with
its name (the doit task, the stage directory, the log, the recipe's link), what it reads (its inputs: doit's
dependencies and its key's), how it is keyed, what it does and the typed result it records, and the one line that
result shows on the terminal.

Every other module asks a row (`FETCH.name`, `FETCH.task_for(label)`, `CACHED`), never spells a stage's name; doit's
tasks are made from the rows (graph/tasks.py).
"""

from __future__ import annotations

from pipeline.graph.stage import Stage
from pipeline.graph.stages.accuracy import ACCURACY
from pipeline.graph.stages.build import BUILD
from pipeline.graph.stages.device import DEVICE
from pipeline.graph.stages.export import EXPORT
from pipeline.graph.stages.goldens import GOLDENS
from pipeline.graph.stages.package import PACKAGE
from pipeline.graph.stages.plan import FETCH, FETCH_BASE, FETCH_DRAFT, PLAN
from pipeline.graph.stages.quantize import QUANTIZE

STAGES: tuple[Stage, ...] = (PLAN, FETCH, FETCH_DRAFT, FETCH_BASE, QUANTIZE, EXPORT, GOLDENS, ACCURACY, PACKAGE, DEVICE,
                             BUILD)
BY_NAME = {s.name: s for s in STAGES}
CACHED = frozenset(s.name for s in STAGES if s.cached)      # what the shared stage cache may carry

__all__ = ["ACCURACY", "BUILD", "BY_NAME", "CACHED", "DEVICE", "EXPORT", "FETCH", "FETCH_BASE", "FETCH_DRAFT",
           "GOLDENS", "PACKAGE", "PLAN", "QUANTIZE", "STAGES", "Stage"]
