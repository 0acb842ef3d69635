"""Model families as data: one `Family` record per Hugging Face architecture (pipeline/families/records.py).

A record says what every consumer needs to know about an architecture, so that none of them carries its own
per-family `if` chain:

  the planner      which backend versions build it, with which formats (each backend registers a `Support` per
                   family: Backend.families), and what each version cannot run as the checkpoint defines it
                   (a sliding window, soft-capping, a RoPE scaling it lacks): refused before any download,
                   naming what would be lost and where the family does run;
  the shapes       the attention-bias default (pipeline/plan/shapes.py); fetch, whether the projections are fused;
  the exporters    the ModelOpt decoder type of the TensorRT-LLM 0.12 checkpoint (trtllm_checkpoint.ARCHITECTURES);
                   Edge-LLM's INT4 plugin choice, the fused projections' parts;
  the tiny models  the transformers config class (pipeline/workstation/tinymodel.py).

Norm kind and placement, activation, q/k norm and embedding scale are recorded for every family but read by no
code yet: the independent 0.12 reader computes the Llama/Qwen2 layout, the one every family 0.12 builds here has.
A family that needs them on 0.12 (Gemma 2, Phi-3) is refused until the reader applies them.

What a *particular* checkpoint uses of its family's features (its window, its RoPE scaling, its caps) is read from
its config.json into `ModelFeatures`; `Support.losses` compares that with what a backend version runs. Standard
library only: the device imports the planner on Python 3.10 without torch.
"""

from __future__ import annotations

from pipeline.families.kinds import Family, ModelFeatures, Support, features_of
from pipeline.families.records import FAMILIES

__all__ = ["Family", "ModelFeatures", "Support", "family", "features_of", "known", "registry"]


def registry() -> dict[str, Family]:
    return {f.architecture: f for f in FAMILIES}


def family(architecture: str) -> Family | None:
    return registry().get(architecture)


def known() -> list[str]:
    return sorted(registry())
