"""What Edge-LLM's export does for one kind a model carries, beside what it does for every model
(workstation/edgellm_export.py asks each of the model's parts for its steps and never which kinds it has). A kind's
steps subclass `PartExport` and override what it needs:

  before_unified(part, model)   before ModelOpt's unified checkpoint is written from the calibrated model (a quantized
                                tower's FP8 tensors taken out for its own export): its result is the part's `state`
  prepare(part, hf)             what Edge-LLM's loader reads differently from what transformers writes (a hybrid's)
  check(part, shape, onnx, hf)  after the export: what the graph alone cannot show (a hybrid's embedding table)
  graph(part, shape, weights)   what check_onnx must find in the language model's graph for it
  beside(part, ..., state)      a graph exported beside the language model's (the visual tower's), and its record
  llm_subdir                    where the language model's graph goes then

A kind with no steps needs nothing of its own from the export (its weights go through the unified checkpoint and
Edge-LLM's exporter like the rest)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class PartExport:
    llm_subdir = ""

    def before_unified(self, part, model) -> Any:
        return None

    def prepare(self, part, hf: Path) -> list[str]:
        return []

    def check(self, part, shape, onnx_dir: Path, hf: Path) -> None:
        return None

    def graph(self, part, shape, weights: str) -> dict:
        return {}

    def beside(self, part, model_dir: Path, scratch: Path, payload_dir: Path, state: Any) -> Any:
        return None
