"""A fetched checkpoint in a layout the hub publishes under other names (pipeline/families/layouts.py), rewritten in its
family's native layout before anything else reads it: its config.json, its tensors renamed (and InternViT's fused
qkv split into q, k and v, as transformers' own conversion splits it), the image processor's settings the native
processor reads, and a chat template that places the image where the native processor expands it, where the
checkpoint's own template does not. Nothing of the checkpoint's own code is run. Files are replaced whole (written
beside, then renamed over), so a file linked from the user's directory is never written through.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.families.layouts import IMAGENET_MEAN, IMAGENET_STD, INTERNVL_CHAT, HubLayout, hub_layout
from pipeline.files import write_atomic

IMAGE_PLACEHOLDER = "<IMG_CONTEXT>"
# ChatML as InternVL3's language model (Qwen2.5) is asked, an image part as the native processor expects it: its
# placeholder once between <img> and </img> (the processor repeats it per token; transformers' converted template
# writes "<image>", which its processor replaces by exactly this)
CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
                 "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
                 "{% for content in message['content'] %}{% if content['type'] in ('image', 'image_url') %}"
                 "{{ '<img><IMG_CONTEXT></img>\\n' }}{% elif content['type'] == 'text' %}{{ content['text'] }}"
                 "{% endif %}{% endfor %}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def convert(model_dir: Path, source: str) -> str | None:
    """Rewrite `model_dir` in its family's native layout, if it is in a hub layout; what it was (for the fetch's
    record), else None."""
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        return None
    from pipeline.plan.shapes import load_config
    config = load_config(config_path)
    layout = hub_layout(config)
    if layout is None:
        return None
    native = layout.config(config, str(config_path))
    extras = EXTRAS.get(layout.architecture)
    if extras is not None:
        native["image_token_id"] = _placeholder_id(model_dir, source)
    # the native config first: nothing below may see the layout's auto_map (transformers would offer to run the
    # checkpoint's code); a failure leaves the fetch stage's output unpublished
    write_atomic(config_path, (json.dumps(native, indent=2) + "\n").encode())
    _convert_tensors(model_dir, layout, source)
    if extras is not None:
        extras(model_dir, config, source)
    return layout.description


def _placeholder_id(model_dir: Path, source: str) -> int:
    from tokenizers import Tokenizer
    path = model_dir / "tokenizer.json"
    token = Tokenizer.from_file(str(path)).token_to_id(IMAGE_PLACEHOLDER) if path.is_file() else None
    if token is None:
        raise PipelineError(f"{source}: {model_dir} has no {IMAGE_PLACEHOLDER} token in a tokenizer.json",
                            "fetch the checkpoint with its tokenizer files")
    return int(token)


def _convert_tensors(model_dir: Path, layout: HubLayout, source: str) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    index_path = model_dir / "model.safetensors.index.json"
    index = json.loads(index_path.read_text()) if index_path.is_file() else None
    for shard in sorted(model_dir.glob("*.safetensors")):
        out = {}
        with safe_open(str(shard), "pt") as fh:
            metadata = fh.metadata()
            for name in fh.keys():
                targets = layout.tensors(name)
                if not targets:
                    raise PipelineError(f"{source}: {shard.name} holds {name}, which {layout.description} does not "
                                        "name: the checkpoint is not that layout as this version maps it",
                                        "use its -hf conversion, or report the tensor with the repository")
                tensor = fh.get_tensor(name)
                for target, part, parts in targets:
                    out[target] = tensor.chunk(parts, dim=0)[part].contiguous() if parts > 1 else tensor
        tmp = shard.with_name(shard.name + ".native")
        save_file(out, str(tmp), metadata=metadata or {"format": "pt"})
        tmp.replace(shard)
        if index is not None:
            index["weight_map"] = {t: f for n, f in index.get("weight_map", {}).items()
                                   for t, _, _ in (layout.tensors(n) or [(n, 0, 1)])}
    if index is not None:
        write_atomic(index_path, (json.dumps(index, indent=2) + "\n").encode())


def _write_processor(model_dir: Path, config: dict) -> None:
    """InternVL's own preprocessing (448-pixel tiles, up to max_dynamic_patch of them and a thumbnail, bicubic,
    ImageNet's mean and std) as transformers' GotOcr2 processor reads it."""
    size = int(config.get("force_image_size") or 448)
    processor = {"image_processor_type": "GotOcr2ImageProcessor", "size": {"height": size, "width": size},
                 "crop_to_patches": bool(config.get("dynamic_image_size", True)),
                 "min_patches": int(config.get("min_dynamic_patch", 1)),
                 "max_patches": int(config.get("max_dynamic_patch", 12)), "image_mean": IMAGENET_MEAN,
                 "image_std": IMAGENET_STD, "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255,
                 "do_normalize": True, "do_convert_rgb": True, "resample": 3}
    write_atomic(model_dir / "preprocessor_config.json", (json.dumps(processor, indent=2) + "\n").encode())


def _internvl_extras(model_dir: Path, config: dict, source: str) -> None:
    _write_processor(model_dir, config)
    _write_template(model_dir, source)


def _write_template(model_dir: Path, source: str) -> None:
    """The checkpoint's chat template where it places an image part's placeholder, else CHAT_TEMPLATE."""
    from transformers import AutoTokenizer

    from pipeline.workstation.evaluate import render_chat
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.chat_template:
        try:
            text = render_chat(tokenizer, [{"role": "user", "content": [{"type": "image"},
                                                                         {"type": "text", "text": "x"}]}])
            if text.count(IMAGE_PLACEHOLDER) == 1:
                return
        except PipelineError:
            pass
    for stale in ("chat_template.jinja", "chat_template.json"):
        (model_dir / stale).unlink(missing_ok=True)
    write_atomic(model_dir / "chat_template.jinja", CHAT_TEMPLATE.encode())
    from pipeline.progress import terminal
    print(f"{source}: the checkpoint's chat template does not place an image part; the fetch wrote InternVL's "
          "(ChatML, the image as <img><IMG_CONTEXT></img>)", file=terminal())


# what a layout needs beside its config and tensors (InternVL's chat layout: the image processor's settings and a chat
# template that places its placeholder; Qwen3-ASR's thinker layout needs nothing more)
EXTRAS = {INTERNVL_CHAT: _internvl_extras}
