"""doit entry point: `doit build recipe=NAME`, `doit plan recipe=NAME`, `doit list`. Wiring only: the task generators
are made from the stage table (pipeline/graph/tasks.py, pipeline/graph/stages/)."""

from pipeline.graph.tasks import TASKS, doit_config

globals().update(TASKS)     # doit collects the task_* generators from this module's namespace

DOIT_CONFIG = doit_config()
