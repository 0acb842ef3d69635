"""The held-out text and the perplexity change's interval."""

import pytest

from pipeline.errors import PipelineError
from pipeline.workstation.evaluate import HELDOUT, bootstrap_interval, heldout_text


def test_shipped_heldout_text_is_long_and_not_the_calibration_text():
    name, text = heldout_text(f"builtin:{HELDOUT}", "recipes/x.toml")
    _, calib = heldout_text("builtin:calib-en", "recipes/x.toml")
    assert name == "heldout-long-en" and len(text.split()) >= 3500          # ~4,800 Llama-3 tokens
    sentences = {s.strip() for s in calib.split(".") if len(s.strip()) > 30}
    assert not any(s in text for s in sentences)                            # no calibration sentence reused


def test_a_recipe_names_its_own_heldout_file(tmp_path):
    (tmp_path / "domain.txt").write_text("Torque the wheel nuts in a star pattern. " * 50)
    name, text = heldout_text("file:domain.txt", str(tmp_path / "r.toml"))
    assert name == "domain.txt" and text.startswith("Torque")
    with pytest.raises(PipelineError, match=r"validation.heldout = 'file:missing.txt': cannot read"):
        heldout_text("file:missing.txt", str(tmp_path / "r.toml"))


def test_bootstrap_interval_contains_the_change_and_shrinks_with_more_windows():
    import math
    import random
    rng = random.Random(1)
    # windows whose quantized nll is 5% +- noise above the original's: per-token change exp(0.05/100)
    windows = [(100.0, 100.0 + 5 + rng.gauss(0, 4), 100) for _ in range(40)]
    lo, hi = bootstrap_interval(windows)
    point = math.exp(sum(w[1] - w[0] for w in windows) / sum(w[2] for w in windows)) - 1
    assert lo < point < hi and lo > 0                                        # a real loss: 0 is outside
    lo4, hi4 = bootstrap_interval(windows * 4)
    assert hi4 - lo4 < hi - lo
    noise = [(100.0, 100.0 + rng.gauss(0, 4), 100) for _ in range(40)]
    lo, hi = bootstrap_interval(noise)
    assert lo < 0 < hi                                                      # noise: the interval holds 0


def test_a_heldout_path_that_is_a_fifo_is_an_error_not_a_hang(tmp_path):
    import os
    os.mkfifo(tmp_path / "pipe.txt")
    with pytest.raises(PipelineError, match=r"validation.heldout = 'file:pipe.txt': cannot read .*not a regular file"):
        heldout_text("file:pipe.txt", str(tmp_path / "r.toml"))
