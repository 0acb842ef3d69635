"""Multi-token prediction (MTP) layers a checkpoint ships beside its decoder (Qwen3.5, Qwen3.5-MoE, Nemotron 3:
`mtp.*` tensors, which transformers does not load): a draft that predicts the token after next from the decoder's
last hidden state. Read from the family's MtpLayout (families/kinds.py) as Edge-LLM 0.11's config reader reads it
(tensorrt_edgellm/config.py: mtp_num_hidden_layers, else the length of Nemotron-H's draft block list where
num_nextn_predict_layers > 0), so that what its reader would refuse while parsing any export of the checkpoint, draft
or not, is refused by the plan first, naming the field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from pipeline.plan.parts.base import ConfigReader, Part

if TYPE_CHECKING:
    from pipeline.families.kinds import Family, Support

MOST = 64


@dataclass(frozen=True)
class Mtp(Part):
    layers: int                 # the draft's decoder layers (0: the config names MTP without a layer count)
    field: str                  # the config field they were read from, as the plan names it
    dedicated_embeddings: bool  # the draft has a token embedding of its own
    embeddings_field: str

    adjective: ClassVar[str] = "multi-token prediction"
    called: ClassVar[str] = "multi-token prediction layers"

    @classmethod
    def from_config(cls, r: ConfigReader) -> Mtp | None:
        layout, config = r.family.mtp, r.config
        if layout is None:
            return None
        dedicated = config.get(layout.dedicated_embeddings) is True
        field, layers, named = layout.count, 0, False
        if config.get(layout.count) is not None:     # named, even as 0: Edge-LLM's reader then checks it
            layers, named = r.need(layout.count, MOST, low=0), True
        elif layout.types is not None and _positive(config.get(layout.modules)):
            listed = config.get(layout.types)
            pattern = config.get(layout.pattern) if layout.pattern else None
            if isinstance(listed, list) and listed:
                field, layers, named = layout.types, len(listed), True
            elif isinstance(pattern, str) and pattern:
                field, layers, named = layout.pattern or "", len(pattern), True
        if not named and not dedicated:
            return None
        return cls(layers, r.prefix + field, dedicated, r.prefix + layout.dedicated_embeddings)

    def refusals(self, support: Support, weights: str, backend_name: str, family: Family) -> list[str]:
        out = []
        if support.mtp_layers is not None and self.layers not in support.mtp_layers:
            allowed = " or ".join(str(n) for n in support.mtp_layers)
            out.append(f"{self.field} = {self.layers}: {backend_name} reads {family.name}'s multi-token prediction "
                       f"layers only {allowed} at a time, and stops reading the checkpoint otherwise (draft or not); "
                       f"remove {self.field.rsplit('.', 1)[-1]} from its config.json to build the model without its "
                       "MTP draft")
        if self.dedicated_embeddings and not support.mtp_dedicated_embeddings:
            out.append(f"{self.embeddings_field} = true: {backend_name} reads no {family.name} multi-token "
                       "prediction draft with an embedding of its own, and stops reading the checkpoint (draft or "
                       "not); no build of this checkpoint here")
        return out


def _positive(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
