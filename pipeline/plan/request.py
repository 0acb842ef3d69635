"""What the planner is asked: a model's shape at a precision on a target with its limits (and an EAGLE-3 draft)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.contract import BuildLimits, VisualLimits
from pipeline.formats import UNQUANTIZED

if TYPE_CHECKING:
    from pipeline.plan.shapes import ModelShape
    from pipeline.plan.speculative import DraftShape
    from pipeline.plan.targets import TargetProfile


@dataclass(frozen=True)
class DraftRequest:
    """A draft beside the base (speculative decoding): an EAGLE-3 checkpoint, or the model's own MTP layers (shape
    None: the model has none)."""
    shape: DraftShape | None
    label: str
    method: str = "eagle3"
    max_draft_tree_size: int = 60
    max_verify_tree_size: int = 60
    steps: int = 3              # MTP: tokens proposed per base step


@dataclass(frozen=True)
class PlanRequest:
    shape: ModelShape
    model_label: str
    weights: str
    kv_cache: str
    target: TargetProfile
    limits: BuildLimits
    backend: str | None = None
    group_size: int | None = None
    power_mode: str | None = None
    recipe: str | None = None
    draft: DraftRequest | None = None
    visual: VisualLimits | None = None      # a vision-language model's image-token profile (None: the defaults)
    visual_precision: str = UNQUANTIZED.name    # its tower's weights: a VISUAL_FORMATS name (pipeline/formats.py)
    audio_max_seconds: int | None = None    # a speech-to-text model's longest recording a request (None: the default)
