"""TEST DOUBLE of TensorRT Edge-LLM's multimodal runtime (llm_inference --multimodalEngineDir; TensorRT cannot exist
in CI).

What the runtime does with a request's images, as its published interface describes it:
- each image is preprocessed by the processor config the visual engine carries (preprocessor_config.json), resized to
  at most the engine's max_image_tokens_per_image (its config.json's builder_config); here through the checkpoint
  processor's PIL implementation, held the same way (the C++ preprocessing itself cannot be checked here);
- the visual engine (visual_build double: the tower's ONNX) runs in ONNX's reference evaluator with
  ViTAttentionPlugin as written from its interface (pipeline/workstation/visual_check.py), its position inputs made
  from the engine config's vision geometry;
- the chat template places one placeholder per image; it is expanded to the image's token count, the token
  embeddings at those positions are replaced by the image features, and Qwen3-VL's DeepStack features go into the
  language engine's deepstack_embeds_i inputs at the same positions (zeros elsewhere);
- Qwen's language model takes multimodal RoPE: the image tokens on the image's (t, h, w) grid from where the image
  starts, the text after it from the grid's largest position + 1 (Qwen2-VL's rule, which Qwen2.5-VL and Qwen3-VL
  keep for still images), later steps at their cache position + that offset. The cos/sin table each position gets
  takes every frequency from one axis: Qwen3-VL interleaves them (frequency j from h when j % 3 == 1, from w when
  j % 3 == 2, within 3 x mrope_section), Qwen2.5-VL cuts them into mrope_section runs (t, then h, then w).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from pipeline.contract import VisualLimits
from pipeline.families.visual import INTERNVL3, QWEN2_5_VL, QWEN3_VL
from pipeline.images import open_image
from pipeline.workstation import visual_check as vc
from pipeline.workstation.image_prompts import held_processor
from pipeline.workstation.onnx_reference import tower_ops

# the visual engine's model_type (its config.json, as Edge-LLM's exporter writes it) -> (tower design, token math);
# Qwen3.5's tower is Qwen3-VL's without DeepStack (its qwen3_5 visual model)
DESIGNS = {"qwen3_vl": ("qwen3_vl", QWEN3_VL), "qwen3_5": ("qwen3_vl", QWEN3_VL),
           "qwen2_5_vl": ("qwen2_5_vl", QWEN2_5_VL), "internvl": ("internvl", INTERNVL3),
           "internvl_chat": ("internvl", INTERNVL3)}


@dataclass
class Encoded:
    """A request's images through the visual engine: features in order, one grid per image (llm units)."""
    embeds: np.ndarray                  # [image tokens, hidden]
    deepstack: list[np.ndarray]         # per DeepStack layer, [image tokens, hidden]
    grids: list[tuple[int, int, int]]   # (t, h, w) of each image in the language model's tokens
    tokens: list[int]                   # each image's token count
    ms: float                           # the tower's time, all images


class VisualEngine:
    def __init__(self, visual_dir: Path):
        cfg = json.loads((visual_dir / "config.json").read_text())
        self.design, tower = DESIGNS[cfg["model_type"]]
        built = cfg["builder_config"]
        self.processor = held_processor(vc.image_processor(visual_dir, self.design), tower,
                                        VisualLimits(built["min_image_tokens"], built["max_image_tokens"],
                                                     built["max_image_tokens_per_image"]))
        self.geometry = None if self.design == "internvl" else vc.TowerGeometry.of(cfg["vision_config"])
        self.tower, self.placeholder = tower, tower.placeholder
        self.session = ReferenceEvaluator(onnx.load(str(visual_dir / "visual.engine")),
                                          new_ops=tower_ops())

    def encode(self, paths: list[str]) -> Encoded:
        embeds, deepstack, grids, tokens = [], [], [], []
        start = time.perf_counter()
        for path in paths:
            inputs = self.processor(images=[open_image(Path(path).read_bytes())], return_tensors="pt")
            out = self.session.run(None, vc.image_feeds(self.design, self.geometry, inputs))
            embeds.append(out[0].reshape(-1, out[0].shape[-1]))
            deepstack.append([d.reshape(-1, d.shape[-1]) for d in out[1:]])
            if self.geometry is not None:
                t, h, w = (int(x) for x in inputs["image_grid_thw"][0])
                grids.append((t, h // self.geometry.merge, w // self.geometry.merge))
            else:
                grids.append((1, 1, len(embeds[-1])))
            tokens.append(len(embeds[-1]))
        layers = len(deepstack[0]) if deepstack else 0
        return Encoded(np.concatenate(embeds), [np.concatenate([d[i] for d in deepstack]) for i in range(layers)],
                       grids, tokens, (time.perf_counter() - start) * 1000)


def expand(ids: list[int], placeholder: int, tokens: list[int]) -> list[int]:
    """The rendered ids with the i-th placeholder repeated tokens[i] times."""
    out, image = [], 0
    for t in ids:
        if t == placeholder:
            out += [placeholder] * tokens[image]
            image += 1
        else:
            out.append(t)
    if image != len(tokens):
        raise ValueError(f"the chat template placed {image} image placeholders for {len(tokens)} images")
    return out


def mrope_positions(ids: list[int], placeholder: int, grids: list[tuple[int, int, int]]) -> tuple[np.ndarray, int]:
    """([3, T] positions, the offset later steps add to their cache position)."""
    cols, cur, i, image = [], 0, 0, 0
    while i < len(ids):
        if ids[i] == placeholder:
            t, h, w = grids[image]
            tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
            block = np.stack([tt.ravel(), hh.ravel(), ww.ravel()]) + cur
            cols.append(block)
            cur, i, image = int(block.max()) + 1, i + t * h * w, image + 1
        else:
            cols.append(np.full((3, 1), cur))
            cur, i = cur + 1, i + 1
    return np.concatenate(cols, axis=1), cur - len(ids)
