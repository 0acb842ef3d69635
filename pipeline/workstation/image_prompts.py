"""A validation prompt with an image, asked as the deployed vision-language model is asked: the image through the
checkpoint's own processor held to the engine's image profile, the chat template's placeholder expanded to the
image's token count, and the calibrated model's greedy answer with the image's features in place.

The profile bounds every image the engine takes (plan/parts/tower.py): Edge-LLM's runtime resizes an image to at
most max_image_tokens_per_image tokens (Qwen: max_pixels = tokens x (patch x merge)^2; InternVL: at most
tokens / 256 - 1 tiles, one kept for the thumbnail), so the goldens' processor is held to the same bound. The image
files are the recipe's (`builtin:NAME`, drawn by pipeline/images.py, or `file:PATH`), read bounded and checked
(pipeline.images.open_image); the kit carries them as read.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from pipeline.contract import VisualLimits
from pipeline.errors import PipelineError
from pipeline.families.visual import PatchMerger, Tiles, VisualTower, expand_one
from pipeline.images import BUILTIN_IMAGES, ImageError, open_image


@dataclass(frozen=True)
class PromptImage:
    ref: str            # as the recipe names it
    name: str           # the file name the kit carries it under (images/<name>)
    data: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def pil(self):
        return open_image(self.data)


def read_image(ref: str, recipe_file: str, field: str) -> PromptImage:
    """`builtin:NAME` or `file:PATH` (relative to the recipe) as a checked image; errors name the field."""
    kind, _, value = ref.partition(":")
    if kind == "builtin":
        if value not in BUILTIN_IMAGES:
            raise PipelineError(f"{recipe_file}: {field} = {ref!r}: no builtin image {value!r}",
                                f"builtin images: {', '.join(BUILTIN_IMAGES)}")
        data, name = BUILTIN_IMAGES[value].png(), f"{value}.png"
    elif kind == "file":
        from pipeline.files import read_referenced
        from pipeline.images import MAX_IMAGE_BYTES
        _, data = read_referenced(value, recipe_file, MAX_IMAGE_BYTES, f"{recipe_file}: {field} = {ref!r}",
                                  "name a PNG, JPEG or WebP file (relative to the recipe)")
        name = f"{hashlib.sha256(data).hexdigest()[:16]}{Path(value).suffix.lower()}"
    else:
        raise PipelineError(f"{recipe_file}: {field} = {ref!r}: not an image reference",
                            "builtin:NAME or file:PATH (relative to the recipe)")
    try:
        open_image(data)
    except ImageError as exc:
        raise PipelineError(f"{recipe_file}: {field} = {ref!r} {exc}", "use a PNG, JPEG or WebP image") from None
    return PromptImage(ref, name, data)


def held_processor(processor, tower: VisualTower, limits: VisualLimits):
    """The checkpoint's image processor bounded as the engine's runtime bounds an image (its profile's
    max_image_tokens_per_image). Qwen's resize rounds up an image smaller than min_pixels, which can land a few
    tokens past max_pixels when the two are close: image_golden refuses such an image by name."""
    per_image = limits.max_image_tokens_per_image
    if isinstance(tower, PatchMerger):
        longest = per_image * tower.factor * tower.factor
        size = dict(processor.size)
        size["longest_edge"] = min(size.get("longest_edge", longest), longest)
        size["shortest_edge"] = min(size.get("shortest_edge", 0), size["longest_edge"])
        processor.size = size
    elif isinstance(tower, Tiles):
        processor.max_patches = max(1, min(processor.max_patches, per_image // tower.per_tile - 1))
    return processor


def placeholder_id(tokenizer, tower: VisualTower) -> int:
    token = tower.placeholder
    tid = tokenizer.convert_tokens_to_ids(token)
    if tid is None or tid == tokenizer.unk_token_id:
        raise PipelineError(f"the tokenizer has no {token} token, which the model's chat template places for an "
                            "image", "use the vision-language model's own tokenizer")
    return tid


def image_tokens(inputs, tower: VisualTower) -> int:
    """The images' tokens in the language model's sequence, from what the processor made of them (all together)."""
    if isinstance(tower, PatchMerger):
        return sum(int(t) * int(h) * int(w) for t, h, w in inputs["image_grid_thw"]) // (tower.merge * tower.merge)
    return int(inputs["pixel_values"].shape[0]) * tower.per_tile


IMAGE_DIR = "images"


@dataclass(frozen=True)
class PixelMaker:
    """A served request's images made into the model's inputs, as the goldens' were: the checkpoint's processor
    held to the engine's profile, Qwen's image positions marked for its multimodal RoPE. The prompt's placeholder
    tokens must be exactly the processor's count for these images (the server counted them by the family's token
    math): a difference is an error naming both, never an answer to a different prompt."""
    processor: object
    tower: VisualTower
    placeholder: int

    def __call__(self, images: tuple[bytes, ...], ids: list[int]) -> dict:
        inputs = self.processor(images=[open_image(d) for d in images], return_tensors="pt")   # type: ignore[operator]
        made = image_tokens(inputs, self.tower)
        if made != ids.count(self.placeholder):
            raise ValueError(f"the processor makes {made} image tokens of the request's {len(images)} image(s); the "
                             f"prompt holds {ids.count(self.placeholder)}")
        return {**{k: inputs[k] for k in ("pixel_values", "image_grid_thw") if k in inputs},
                **mrope_inputs(ids, self.placeholder, self.tower)}


def pixel_maker(model_dir: Path, placeholder: int, limits: VisualLimits) -> PixelMaker:
    """What makes a served request's images into model inputs, for the model in model_dir at the profile `limits`."""
    from pipeline.plan.shapes import load_shape
    from pipeline.workstation.visual_check import image_processor
    tower = load_shape(model_dir).tower
    if tower is None:
        raise PipelineError(f"{model_dir}: the model has no visual tower", "serve a vision-language model")
    processor = held_processor(image_processor(model_dir, tower.design), tower.tokens, limits)
    return PixelMaker(processor, tower.tokens, placeholder)


def asked(tokenizer, processor, tower: VisualTower, prompt: str, image: PromptImage
          ) -> tuple[str, list[int], dict, int]:
    """(rendered text, ids with the placeholder expanded, the processor's pixel inputs, image tokens) of a prompt
    asked with its image: the user turn holds the image, then the text (as Open WebUI and the openai client send
    it), rendered by the model's chat template."""
    from pipeline.workstation.evaluate import render_chat
    rendered = render_chat(tokenizer, [{"role": "user", "content": [{"type": "image"},
                                                                    {"type": "text", "text": prompt}]}])
    inputs = processor(images=[image.pil()], return_tensors="pt")
    count = image_tokens(inputs, tower)
    pad = placeholder_id(tokenizer, tower)
    ids = expand_one(tokenizer(rendered, add_special_tokens=False)["input_ids"], pad, count)
    return rendered, ids, {**{k: inputs[k] for k in ("pixel_values", "image_grid_thw") if k in inputs},
                           **mrope_inputs(ids, pad, tower)}, count


def mrope_inputs(ids: list[int], pad: int, tower: VisualTower) -> dict:
    """What Qwen's multimodal RoPE needs beside the pixels: which positions hold image tokens (1), as its processor
    returns them (mm_token_type_ids). Without it transformers silently gives the image tokens text positions, which
    is not what the deployed runtime computes (Edge-LLM's runtime places them on the image's 3-D grid)."""
    if not isinstance(tower, PatchMerger):
        return {}
    import torch
    return {"mm_token_type_ids": torch.tensor([[int(t == pad) for t in ids]])}


def image_golden(model, tokenizer, processor, tower: VisualTower, prompt: str, image: PromptImage,
                 max_new_tokens: int, top_k: int, stops: list[int], max_tokens: int | None = None):
    """The golden of one prompt asked with its image (asked): the calibrated model's greedy answer."""
    from pipeline import contract
    from pipeline.workstation.evaluate import greedy

    rendered, ids, pixels, count = asked(tokenizer, processor, tower, prompt, image)
    if max_tokens is not None and count > max_tokens:
        raise PipelineError(f"{image.ref} becomes {count} image tokens through the model's processor, more than the "
                            f"engine's profile takes (build.visual.max_image_tokens_per_image = {max_tokens})",
                            f"raise build.visual.max_image_tokens_per_image to at least {count}, or use a larger "
                            "or smaller image")
    g = greedy(model, ids, max_new_tokens, top_k, stops, **pixels)
    return contract.GoldenPrompt(prompt=prompt, rendered=rendered, input_ids=ids, output_ids=g["output_ids"],
                                 top_logprobs=g["top_logprobs"],
                                 text=tokenizer.decode(g["output_ids"], skip_special_tokens=True),
                                 image=f"{IMAGE_DIR}/{image.name}", image_sha256=image.sha256, image_tokens=count)


@dataclass(frozen=True)
class ImagePrompts:
    """A recipe's validation images, with what asks them as the engine will: the processor held to the profile."""
    images: tuple[PromptImage, ...]
    processor: object
    tower: VisualTower
    limits: VisualLimits

    def __len__(self) -> int:
        return len(self.images)

    def golden(self, model, tokenizer, prompt: str, index: int, max_new_tokens: int, top_k: int, stops: list[int]):
        return image_golden(model, tokenizer, self.processor, self.tower, prompt, self.images[index],
                            max_new_tokens, top_k, stops, max_tokens=self.limits.max_image_tokens_per_image)

    def write(self, out: Path) -> None:
        """The images as the kit carries them (images/<name>), beside goldens.json."""
        (out / IMAGE_DIR).mkdir(exist_ok=True)
        for image in self.images:
            (out / IMAGE_DIR / image.name).write_bytes(image.data)


def image_prompts(model_dir: Path, refs: tuple[str, ...], recipe_file: str, limits: VisualLimits | None
                  ) -> ImagePrompts | None:
    """The recipe's validation images for the model in model_dir, asked at the plan's image profile `limits`
    (None without images); images for a model without a visual tower are an error naming the field."""
    if not refs:
        return None
    from pipeline.plan.shapes import load_shape
    from pipeline.workstation.visual_check import image_processor
    shape = load_shape(model_dir)
    if shape.tower is None or limits is None:
        raise PipelineError(f"{recipe_file}: validation.images = {list(refs)!r}, but the model "
                            f"({shape.architecture}) has no visual tower", "remove validation.images, or use a "
                            "vision-language model")
    images = tuple(read_image(r, recipe_file, f"validation.images[{i}]") for i, r in enumerate(refs))
    processor = held_processor(image_processor(model_dir, shape.tower.design), shape.tower.tokens, limits)
    return ImagePrompts(images, processor, shape.tower.tokens, limits)


def image_agreement(original, quantized, tokenizer, images: ImagePrompts, prompts: tuple[str, ...],
                    new_tokens: int) -> float:
    """Top-1 agreement of the quantized model with the original on the prompts asked with images: both models
    teacher-forced along the original's own greedy answer (the prompt's last position and each answer token), as the
    held-out text's agreement is measured."""
    import torch

    from pipeline.workstation.evaluate import greedy
    from pipeline.workstation.models import input_device

    agree = total = 0
    for i, image in enumerate(images.images):
        _, ids, pixels, _ = asked(tokenizer, images.processor, images.tower, prompts[i], image)
        answer = greedy(original, ids, new_tokens, 1, [], **pixels)["output_ids"]
        seq = ids + answer[:-1]
        inputs = {**pixels, **mrope_inputs(seq, placeholder_id(tokenizer, images.tower), images.tower)}
        picks = []
        with torch.no_grad():
            for model in (original, quantized):
                device = input_device(model)
                logits = model(input_ids=torch.tensor([seq], device=device),
                               **{k: v.to(device) for k, v in inputs.items()}).logits[0, len(ids) - 1:]
                picks.append(logits.float().argmax(-1).cpu())
        agree += int((picks[0] == picks[1]).sum())
        total += len(picks[0])
    return agree / total if total else 1.0
