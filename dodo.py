"""doit entry point: `doit build recipe=NAME`, `doit plan recipe=NAME`, `doit list`. Wiring only; see pipeline/."""

from pipeline.graph import doit_config, task_build, task_fetch, task_plan  # noqa: F401  (doit collects task_*)

DOIT_CONFIG = doit_config()
