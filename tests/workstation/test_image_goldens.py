"""Goldens of prompts asked with an image: the image held to the engine's profile, its placeholder expanded to the
processor's count (which the family's token math predicts), the calibrated model's answer with the image in place."""

import pytest
from transformers import AutoTokenizer

from pipeline.contract import VisualLimits
from pipeline.errors import PipelineError
from pipeline.images import BUILTIN_IMAGES
from pipeline.plan.shapes import load_shape
from pipeline.serve.images import held
from pipeline.workstation.image_prompts import held_processor, image_golden, placeholder_id, read_image
from pipeline.workstation.models import load_model
from pipeline.workstation.visual_check import image_processor
from tests.workstation.test_export import builtin  # noqa: F401  (fixture)

VLMS = ["tiny-qwen3-vl", "tiny-qwen2.5-vl", "tiny-internvl3"]


@pytest.fixture(scope="module")
def asked(builtin):  # noqa: F811
    """(model, tokenizer, tower, processor held to a profile) per tiny VLM, loaded once."""
    made = {}

    def get(name, per_image):
        key = (name, per_image)
        if key not in made:
            src = builtin(name)
            tower = load_shape(src).tower
            processor = held_processor(image_processor(src, tower.design), tower.tokens,
                                       VisualLimits(4, 4096, per_image))
            made[key] = load_model(src, "cpu"), AutoTokenizer.from_pretrained(src), tower, processor
        return made[key]
    return get


@pytest.mark.parametrize("name, per_image", [("tiny-qwen3-vl", 100), ("tiny-qwen3-vl", 400), ("tiny-qwen2.5-vl", 30),
                                             ("tiny-internvl3", 768)])
def test_image_tokens_are_what_the_family_token_math_predicts_under_the_profile(asked, name, per_image):
    model, tok, tower, processor = asked(name, per_image)
    pad = placeholder_id(tok, tower.tokens)
    for key, image in BUILTIN_IMAGES.items():
        g = image_golden(model, tok, processor, tower.tokens, "What is it?", read_image(f"builtin:{key}", "r.toml",
                                                                                          "validation.images[0]"),
                         2, 2, [1], max_tokens=per_image)
        # the server counts an image's tokens by the family's token math held to the profile (serve/images.py):
        # exactly what the held processor makes
        expected = held(tower.tokens, per_image).image_tokens(image.height, image.width)
        assert g.image_tokens == expected <= per_image, key
        assert g.input_ids.count(pad) == expected
        i = g.input_ids.index(pad)        # wrapped by the family's start and end tokens, in one run
        assert g.input_ids[i - 1] != pad and g.input_ids[i + expected] != pad
        assert g.image == f"images/{key}.png" and len(g.image_sha256) == 64


def test_an_image_the_profile_cannot_take_is_refused_by_name(asked):
    """Qwen3-VL's processor makes at least 64 tokens of an image (65,536 pixels), rounding up past a profile of 64:
    the 150 x 130 red circle becomes 72 tokens."""
    model, tok, tower, processor = asked("tiny-qwen3-vl", 64)
    image = read_image("builtin:red-circle", "r.toml", "validation.images[0]")
    with pytest.raises(PipelineError, match=r"builtin:red-circle becomes 72 image tokens through the model's "
                                            r"processor, more than the engine's profile takes \(build.visual."
                                            r"max_image_tokens_per_image = 64\)"):
        image_golden(model, tok, processor, tower.tokens, "What is it?", image, 2, 2, [1], max_tokens=64)
    assert image_golden(model, tok, processor, tower.tokens, "What is it?", image, 2, 2, [1],
                        max_tokens=72).image_tokens == 72


def test_the_image_is_in_the_answer_and_the_answer_is_reproducible(asked):
    model, tok, tower, processor = asked("tiny-qwen2.5-vl", 30)
    answers = {}
    for key in ("red-circle", "checkerboard"):
        image = read_image(f"builtin:{key}", "r.toml", "validation.images[0]")
        first = image_golden(model, tok, processor, tower.tokens, "What is it?", image, 8, 3, [1])
        again = image_golden(model, tok, processor, tower.tokens, "What is it?", image, 8, 3, [1])
        assert first == again
        answers[key] = first.top_logprobs[0]
    # the image reaches the answer: its first step's log-probabilities differ by image (the tiny random model's
    # greedy picks may coincide)
    assert answers["red-circle"] != answers["checkerboard"]


@pytest.mark.parametrize("name, per_image", [("tiny-qwen3-vl", 100), ("tiny-qwen2.5-vl", 30)])
def test_qwen_goldens_place_the_image_tokens_on_the_images_grid(asked, name, per_image):
    """Qwen's multimodal RoPE: the golden's first step is the forward with 3-D positions from the model's own
    get_rope_index (image tokens on the image's grid, as Edge-LLM's runtime places them), not with text positions,
    which transformers silently falls back to when it is not told where the image tokens are."""
    import torch

    model, tok, tower, processor = asked(name, per_image)
    image = read_image("builtin:checkerboard", "r.toml", "validation.images[0]")
    g = image_golden(model, tok, processor, tower.tokens, "What is it?", image, 1, 4, [])
    inputs = processor(images=[image.pil()], return_tensors="pt")
    ids = torch.tensor([g.input_ids])
    pad = placeholder_id(tok, tower.tokens)
    grid = inputs["image_grid_thw"]
    positions, _ = model.model.get_rope_index(ids, image_grid_thw=grid, mm_token_type_ids=(ids == pad).int())
    assert positions[1:, 0].max() < len(g.input_ids) - 1        # the image's rows and columns share positions
    firsts = {}
    with torch.no_grad():
        text = torch.arange(ids.shape[1]).view(1, 1, -1).expand(3, 1, -1)
        for kind, pos in (("grid", positions), ("text", text)):
            model.model.rope_deltas = None
            logits = model(input_ids=ids, position_ids=pos, pixel_values=inputs["pixel_values"],
                           image_grid_thw=grid).logits[0, -1].float()
            vals, idx = torch.log_softmax(logits, -1).topk(4)
            firsts[kind] = [[int(i), round(float(v), 5)] for i, v in zip(idx, vals, strict=True)]
    assert g.top_logprobs[0] == firsts["grid"] != firsts["text"]


def test_image_references_are_checked_and_named(tmp_path):
    with pytest.raises(PipelineError, match=r"validation.images\[1\] = 'builtin:cat': no builtin image 'cat'"):
        read_image("builtin:cat", "r.toml", "validation.images[1]")
    (tmp_path / "x.gif").write_bytes(b"GIF89a" + bytes(40))
    with pytest.raises(PipelineError, match=r"'file:x.gif' is not a PNG, JPEG or WebP image"):
        read_image("file:x.gif", str(tmp_path / "r.toml"), "validation.images[0]")
    with pytest.raises(PipelineError, match=r"'file:none.png'"):
        read_image("file:none.png", str(tmp_path / "r.toml"), "validation.images[0]")
    png = BUILTIN_IMAGES["red-circle"].png()
    (tmp_path / "half.png").write_bytes(png[: len(png) // 2])
    with pytest.raises(PipelineError, match=r"cannot be decoded as PNG \(OSError: image file is truncated"):
        read_image("file:half.png", str(tmp_path / "r.toml"), "validation.images[0]")
    (tmp_path / "ok.png").write_bytes(png)
    got = read_image("file:ok.png", str(tmp_path / "r.toml"), "validation.images[0]")
    assert got.data == png and got.name.endswith(".png") and got.pil().size == (150, 130)


def test_builtin_images_are_byte_stable_and_decode_to_what_was_drawn():
    import hashlib
    import io

    import numpy as np
    from PIL import Image
    # the bytes do not depend on zlib's build: stored blocks (recorded here, so a change is a visible choice)
    assert hashlib.sha256(BUILTIN_IMAGES["checkerboard"].png()).hexdigest()[:12] == "4a94193cf800"
    for image in BUILTIN_IMAGES.values():
        decoded = np.asarray(Image.open(io.BytesIO(image.png())))
        assert decoded.shape == (image.height, image.width, 3)
        assert (decoded == np.array(image.pixels(), dtype=np.uint8)).all()


def test_recipe_images_are_checked_when_the_recipe_is_read(tmp_path):
    from conftest import REPO

    from pipeline.errors import InputError
    from pipeline.recipe import load_recipe
    src = (REPO / "recipes" / "tiny-qwen3-vl-thor.toml").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(src.replace('images = ["builtin:red-circle", "builtin:flag-stripes"]',
                               'images = ["builtin:red-circle", "builtin:cat", "file:none.png", "builtin:red-circle"]'))
    with pytest.raises(InputError) as e:
        load_recipe(str(bad))
    text = str(e.value)
    assert "validation.images = '4 images': pairs with 3 prompts" in text
    assert "validation.images[1] = 'builtin:cat': no builtin image 'cat'" in text
    assert "validation.images[2] = 'file:none.png'" in text
    good = load_recipe(str(REPO / "recipes" / "tiny-qwen3-vl-thor.toml"))
    assert good.validation.images == ("builtin:red-circle", "builtin:flag-stripes")


def test_images_for_a_text_model_are_refused_naming_the_field(builtin):  # noqa: F811
    from pipeline.contract import VisualLimits
    from pipeline.workstation.image_prompts import image_prompts
    with pytest.raises(PipelineError, match=r"validation.images = \['builtin:red-circle'\], but the model "
                                            r"\(LlamaForCausalLM\) has no visual tower"):
        image_prompts(builtin("tiny-llama"), ("builtin:red-circle",), "r.toml", VisualLimits(4, 1024, 512))


def test_image_agreement_is_whole_against_itself_and_counts_every_changed_pick(asked, builtin):  # noqa: F811
    """Against itself: 1. Against a model whose answers change (its output layer shuffled): the share of the answer
    positions where the picks still agree, counted over both prompts' positions (the tiny random tower barely moves
    the answer positions' picks, so the image side alone cannot show the drop here)."""
    import torch

    from pipeline.workstation.image_prompts import ImagePrompts, image_agreement
    model, tok, tower, processor = asked("tiny-qwen2.5-vl", 30)
    images = ImagePrompts((read_image("builtin:red-circle", "r.toml", "validation.images[0]"),
                           read_image("builtin:checkerboard", "r.toml", "validation.images[1]")),
                          processor, tower.tokens, VisualLimits(4, 4096, 30))
    prompts = ("What is it?", "Describe the picture.")
    assert image_agreement(model, model, tok, images, prompts, 8) == 1.0
    other = load_model(builtin("tiny-qwen2.5-vl"), "cpu")
    with torch.no_grad():
        other.lm_head.weight.copy_(other.lm_head.weight.roll(1, dims=0))     # every token's logit moved to the next
    agreement = image_agreement(model, other, tok, images, prompts, 8)
    assert agreement < 0.5 and agreement * 16 == round(agreement * 16)          # 2 prompts x 8 positions


def test_a_goldens_image_name_that_leaves_images_is_never_taken():
    """The package stage copies each golden's image by its name: only a plain file under images/ is one (a damaged or
    planted goldens.json naming anything else is refused as damaged output)."""
    from pipeline.contract import IMAGE_FILE_RE
    assert IMAGE_FILE_RE.match("images/red-circle.png") and IMAGE_FILE_RE.match("images/0a1b2c3d4e5f6a7b.jpeg")
    for planted in ("images/../recipe.toml", "../x.png", "images/a/b.png", "/etc/passwd", "images/.hidden",
                    "images/", "images/x.png\n", "imagesx.png", "images/" + "a" * 200):
        assert not IMAGE_FILE_RE.match(planted), planted
