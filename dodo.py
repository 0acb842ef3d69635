"""doit entry point: `doit build recipe=NAME`, `doit plan recipe=NAME`, `doit list`. Wiring only; see pipeline/."""

from pipeline.graph.tasks import (  # noqa: F401  (doit collects the task_* functions)
    doit_config,
    task_accuracy,
    task_build,
    task_device,
    task_export,
    task_fetch,
    task_fetch_base,
    task_fetch_draft,
    task_goldens,
    task_package,
    task_plan,
    task_quantize,
)

DOIT_CONFIG = doit_config()
