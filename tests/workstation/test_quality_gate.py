"""The quality gate before signing: the recipe's limits against the measured accuracy, advice from measurements."""

import dataclasses

import pytest
from conftest import REPO, Project

from pipeline import contract
from pipeline.errors import PipelineError
from pipeline.graph.quality import GateLimits, gate, misses_of

LIMITS = GateLimits(max_perplexity_increase=0.25, min_top1_agreement=0.7)


def acc(weights, change, top1) -> contract.AccuracyReport:
    return contract.AccuracyReport("heldout-en", 100, 1, 10.0, 10.0 * (1 + change), change, [change, change], 0.99,
                                   top1, weights=weights)


def test_a_miss_says_which_figure_by_how_much_and_which_formats_measured_better():
    assert misses_of(acc("int4_awq", 0.10, 0.9), LIMITS) == []
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


@pytest.mark.parametrize("change,top1", [(float("nan"), 0.9), (0.1, float("nan")), (float("inf"), 1.0),
                                         (float("-inf"), 0.9)])
def test_a_measurement_that_is_not_finite_fails_the_gate_even_when_accepted(change, top1):
    """#66: a NaN passed every comparison (NaN > limit is false) and a kit was signed from NaN logits."""
    report = acc("int4_awq", change, top1)
    assert misses_of(report, LIMITS)
    for accept in (False, True):
        with pytest.raises(PipelineError, match="the quantized model's logits are not finite, and no kit is signed"):
            gate(report, LIMITS, {}, "r.toml", accept=accept)


def test_the_limits_hold_at_their_edges():
    """A measurement exactly at a limit passes; the smallest step past it misses, by that step."""
    assert misses_of(acc("int4_awq", 0.25, 0.7), LIMITS) == []
    (top1,) = misses_of(acc("int4_awq", 0.25, 0.699), LIMITS)
    assert top1 == "top-1 agreement 69.9% is below min_top1_agreement 70% by 0.1 points"
    (ppl,) = misses_of(acc("int4_awq", 0.251, 0.7), LIMITS)
    assert ppl == "perplexity +25.1% on heldout-en exceeds max_perplexity_increase +25% by 0.1 points"


def test_a_vision_language_models_image_prompts_are_held_to_the_same_top1_limit_at_its_edge():
    """The image prompts' agreement (along the original's answers) meets min_top1_agreement exactly or misses by the
    step past it; a text recipe's report has none and is judged on the held-out text alone."""
    at_edge = dataclasses.replace(acc("fp8", 0.01, 0.95), image_prompts=2, image_top1_agreement=0.7)
    assert misses_of(at_edge, LIMITS) == []
    (miss,) = misses_of(dataclasses.replace(at_edge, image_top1_agreement=0.6875), LIMITS)
    assert miss == "top-1 agreement on the 2 image prompts 68.8% is below min_top1_agreement 70% by 1.2 points"
    assert acc("fp8", 0.01, 0.95).image_top1_agreement is None


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


def test_the_advice_reads_only_reports_that_read_as_the_contract_says(tmp_path):
    """The gate's advice finds the same model's other formats on disk: a report planted or damaged there (a field
    of another type, an older format, a FIFO) is no measurement, never a traceback."""
    import json
    import os

    from pipeline.graph.quality import measured_formats

    def put(name: str, report: contract.AccuracyReport | None, edit=lambda r: None) -> None:
        d = tmp_path / "accuracy" / name
        d.mkdir(parents=True)
        if report is None:
            os.mkfifo(d / contract.ACCURACY_JSON)
            return
        record = report.to_dict()
        edit(record)
        (d / contract.ACCURACY_JSON).write_text(json.dumps(record))
    good = dataclasses.replace(acc("int8_wo", 0.001, 0.99), model_digest="m")
    put("a", good)
    put("b", dataclasses.replace(acc("int8_sq", 0.01, 0.95), model_digest="m"),
        lambda r: r.update(top1_agreement="0.95"))
    put("c", dataclasses.replace(acc("fp8", 0.01, 0.95), model_digest="m"), lambda r: r.pop("format"))
    put("d", None)
    put("e", dataclasses.replace(acc("nvfp4", 0.01, 0.95), model_digest="other model"))
    assert measured_formats(tmp_path, "m", "heldout-en") == {"int8_wo": good}
    assert measured_formats(tmp_path, "m", "another text") == {}
