"""The image side of a vision-language model (families/visual.py): the tokens an image becomes, against the
processors (PIL backends) of transformers 5.14 that the checkpoints ship configs for (Qwen2-VL's smart_resize and image
processor, GOT-OCR2's tiler that InternVL uses), over image sizes from a thumbnail to a 4K frame."""

from __future__ import annotations

import pytest

from pipeline.families.visual import INTERNVL3, QWEN2_5_VL, QWEN3_VL, PatchMerger, Tiles

SIZES = [(1, 1), (28, 28), (56, 56), (100, 3000), (224, 224), (240, 320), (333, 517), (448, 448), (480, 640),
         (720, 1280), (1080, 1920), (1024, 1024), (2160, 3840), (3000, 100), (449, 896), (897, 448)]


@pytest.mark.parametrize("tower", [QWEN2_5_VL, QWEN3_VL], ids=["qwen2.5-vl", "qwen3-vl"])
def test_a_qwen_image_is_the_tokens_its_processor_makes(tower: PatchMerger):
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil, smart_resize

    processor = Qwen2VLImageProcessorPil(patch_size=tower.patch, merge_size=tower.merge,
                                      size={"shortest_edge": tower.min_pixels, "longest_edge": tower.max_pixels})
    for h, w in SIZES:
        assert tower.resized(h, w) == smart_resize(h, w, tower.factor, tower.min_pixels, tower.max_pixels)
        if h * w <= 2_000_000:      # the processor itself, on a real array (the largest take seconds)
            grid = processor(images=Image.new("RGB", (w, h)), return_tensors="np")["image_grid_thw"][0]
            assert tower.patches(h, w) == grid[1] * grid[2]
            assert tower.image_tokens(h, w) == grid[1] * grid[2] // tower.merge ** 2
    assert tower.image_tokens(2160, 3840) <= tower.max_image_tokens()


def test_the_qwen_bounds_are_each_models_own():
    # 1080p on Qwen2.5-VL: 1092 x 1932 is past 28*28*1280 pixels, so scaled by sqrt(2073600 / 1003520) and floored
    # to multiples of 28: 728 x 1316, 26 x 47 tokens. On Qwen3-VL it fits: 1088 x 1920, 34 x 60. A 1-pixel image
    # is scaled up to 65,536 pixels: 256 x 256, 8 x 8.
    assert QWEN2_5_VL.image_tokens(1080, 1920) == 1222 and QWEN2_5_VL.max_image_tokens() == 1280
    assert QWEN3_VL.image_tokens(1080, 1920) == 2040 and QWEN3_VL.image_tokens(1, 1) == 64
    with pytest.raises(ValueError, match="aspect ratio must be below 200"):
        QWEN3_VL.image_tokens(10, 2010)


def test_an_internvl_image_is_the_tiles_its_processor_cuts():
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

    processor = GotOcr2ImageProcessorPil(size={"height": 448, "width": 448}, crop_to_patches=True, min_patches=1,
                                      max_patches=12)
    for h, w in SIZES:
        assert INTERNVL3.crops(h, w) == processor.get_number_of_image_patches(h, w)
        assert INTERNVL3.image_tokens(h, w) == 256 * INTERNVL3.crops(h, w)
    assert INTERNVL3.per_tile == 256 and INTERNVL3.max_image_tokens() == 13 * 256
    assert INTERNVL3.grid(1080, 1920) == (4, 2) and INTERNVL3.crops(448, 448) == 1


def test_a_single_tile_tower_has_no_thumbnail():
    one = Tiles(tile=448, patch=14, scale=0.5, max_tiles=1)
    assert one.crops(1080, 1920) == 1 and one.max_image_tokens() == 256


def test_one_images_placeholder_is_expanded_and_any_other_count_refused():
    from pipeline.errors import PipelineError
    from pipeline.families.visual import expand_one
    assert expand_one([1, 9, 2], 9, 3) == [1, 9, 9, 9, 2]
    for ids in ([1, 2], [9, 1, 9]):
        with pytest.raises(PipelineError, match=rf"the chat template placed {ids.count(9)} image placeholders for "
                                                r"one image"):
            expand_one(ids, 9, 3)
