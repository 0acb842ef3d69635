"""The quality gate before signing: the recipe's limits against the measured accuracy, advice from measurements."""

import pytest
from conftest import REPO, Project

from pipeline.errors import PipelineError
from pipeline.graph.quality import GateLimits, gate, misses

LIMITS = GateLimits(max_perplexity_increase=0.25, min_top1_agreement=0.7)


def acc(weights, change, top1):
    return {"weights": weights, "perplexity_change": change, "top1_agreement": top1, "heldout": "heldout-en"}


def test_a_miss_says_which_figure_by_how_much_and_which_formats_measured_better():
    assert misses(acc("int4_awq", 0.10, 0.9), LIMITS) == []
    others = {"int8_wo": acc("int8_wo", 0.0003, 0.99), "int8_sq": acc("int8_sq", 0.31, 0.8),
              "fp16": acc("fp16", 0.0, 1.0)}
    with pytest.raises(PipelineError) as e:
        gate(acc("int4_awq", 0.46, 0.65), LIMITS, others, "r.toml", accept=False)
    text = str(e.value)
    assert "perplexity +46.0% on heldout-en exceeds max_perplexity_increase +25% by 21.0 points" in text
    assert "top-1 agreement 65.0% is below min_top1_agreement 70% by 5.0 points" in text
    assert "within the limits on this model: fp16 (perplexity +0.0%, top-1 100%), int8_wo (perplexity +0.0%, " \
           "top-1 99%)" in text and "int8_sq" not in text.split("model:")[1]
    assert "accept-quality=1" in e.value.hint
    line = gate(acc("int4_awq", 0.46, 0.65), LIMITS, {}, "r.toml", accept=True)
    assert line is not None and line.startswith("signed anyway (accept_quality): int4_awq misses")


def test_the_limits_hold_at_their_edges():
    """A measurement exactly at a limit passes; the smallest step past it misses, by that step."""
    assert misses(acc("int4_awq", 0.25, 0.7), LIMITS) == []
    (top1,) = misses(acc("int4_awq", 0.25, 0.699), LIMITS)
    assert top1 == "top-1 agreement 69.9% is below min_top1_agreement 70% by 0.1 points"
    (ppl,) = misses(acc("int4_awq", 0.251, 0.7), LIMITS)
    assert ppl == "perplexity +25.1% on heldout-en exceeds max_perplexity_increase +25% by 0.1 points"


@pytest.mark.integration
def test_the_package_stage_refuses_to_sign_below_the_gate(tmp_path):
    project = Project(tmp_path / "proj")
    text = (REPO / "recipes" / "tiny-llama-cpu.toml").read_text()
    strict = text.replace("[validation]", "[validation]\nmin_top1_agreement = 0.99")
    assert strict != text
    (project.recipes / "strict.toml").write_text(strict)
    (project.recipes / "wo.toml").write_text(strict.replace('weights = "int4_awq"', 'weights = "int8_wo"'))
    project.doit("build", "recipe=wo", check=False)          # measures int8_wo on the same model
    proc = project.doit("build", "recipe=strict", check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "int4_awq misses the recipe's quality gate: top-1 agreement" in proc.stderr
    assert "below min_top1_agreement 99%" in proc.stderr
    assert not (project.artifacts / "strict" / "kit").exists()
    ok = project.doit("build", "recipe=strict", "accept-quality=1")
    assert "warning: signed anyway (accept_quality): int4_awq misses" in ok.stdout
    assert (project.artifacts / "strict" / "kit" / "strict@orin-nano-8gb" / "SHA256SUMS.minisig").is_file()
