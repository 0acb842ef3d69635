"""Image prompts for calibrating a vision-language model's language model.

AWQ searches per-channel pre-quant scales and SmoothQuant smooths per channel, both against the calibration data:
calibrated on text alone they fit the text tokens' activations and leave the image tokens', which are distributed
differently, to the rounding (Edge-LLM 0.11's own quantizer says "text-only data optimizes the image-token ranges
away and the model degenerates on image input", tensorrt_edgellm/quantization/quantize.py
_is_image_blind_calibration, and switches to image calibration for them). Range-only calibration (FP8, NVFP4:
"max") is modality-blind and stays text-only, as there, unless the tower itself is quantized (quantization.visual =
"fp8", Edge-LLM's --visual_quantization): only images reach it, so they are added to the text then.

The images are the builtin ones (pipeline/images.py: drawn in code, so calibration runs offline and the same bytes
every time), each asked a few questions through the checkpoint's chat template and its processor held to the engine's
image profile, exactly as the goldens ask theirs (image_prompts.asked). They are not the recipe's validation images'
prompts: calibrating on the checks would flatter them.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.contract import VisualLimits

QUESTIONS = ("Describe this image.", "What shapes and colours are in the picture?")


def image_calibration(model_dir: Path, tokenizer, limits: VisualLimits) -> list[dict]:
    """One model input per (builtin image, question): input_ids, pixel inputs and Qwen's image positions."""
    import torch

    from pipeline.images import BUILTIN_IMAGES
    from pipeline.plan.shapes import load_shape
    from pipeline.workstation.image_prompts import PromptImage, asked, held_processor
    from pipeline.workstation.visual_check import image_processor

    tower = load_shape(model_dir).tower
    if tower is None:
        return []
    processor = held_processor(image_processor(model_dir, tower.design), tower.tokens, limits)
    out = []
    for name, image in BUILTIN_IMAGES.items():
        for question in QUESTIONS:
            _, ids, pixels, _ = asked(tokenizer, processor, tower.tokens, question,
                                      PromptImage(f"builtin:{name}", f"{name}.png", image.png()))
            out.append({"input_ids": torch.tensor([ids]), **pixels})
    return out
