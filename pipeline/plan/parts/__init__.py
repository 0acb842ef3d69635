"""The kinds a decoder may carry, each one `Part` (plan/parts/base.py says what a part answers): routed experts,
a hybrid's recurrent layers, layers of different widths, per-layer input embeddings, a visual tower, an audio
encoder, multi-token prediction layers.

`PARTS` is the order a shape is read and composed in: a later part edits what the earlier ones made of the layers
(an MoE block takes the place of the dense MLP of the layers the hybrid's block list names), and the first part with a
speed fit of its own gives the plan's error bands. A model with several kinds (a hybrid with MoE blocks, Gemma 4's
per-layer inputs beside its experts) is just a shape with several parts.
"""

from __future__ import annotations

from pipeline.plan.parts.audio import AudioEncoder
from pipeline.plan.parts.base import Part
from pipeline.plan.parts.experts import Experts
from pipeline.plan.parts.hybrid import Hybrid
from pipeline.plan.parts.layers import PerLayer, PerLayerInputs
from pipeline.plan.parts.mtp import Mtp
from pipeline.plan.parts.tower import TowerShape

PARTS: tuple[type[Part], ...] = (PerLayer, PerLayerInputs, Hybrid, Experts, TowerShape, AudioEncoder, Mtp)

__all__ = ["PARTS", "AudioEncoder", "Experts", "Hybrid", "Mtp", "Part", "PerLayer", "PerLayerInputs", "TowerShape"]
