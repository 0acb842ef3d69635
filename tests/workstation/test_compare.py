"""`python -m pipeline compare`: each format quantized from one fetch, measured, planned; table, JSON and PNG."""

import dataclasses
import json
import os

import pytest
from conftest import REPO, Project, local_recipe

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    project = Project(tmp_path_factory.mktemp("compare") / "proj")
    # the embedded default (a tiny Llama trained on the shipped corpus, with a chat template), on an Orin and a Thor
    recipe = (REPO / "recipes" / "tiny-llama-cpu.toml").read_text()
    (project.recipes / "cmp.toml").write_text(recipe.replace('targets = ["orin-nano-8gb"]',
                                                             'targets = ["orin-nano-8gb", "agx-thor"]'))
    proc = project.cli("compare", "cmp", "--formats", "int4_awq,int8_wo,fp16,nvfp4", "--json")
    assert proc.returncode == 0, proc.stderr
    return project, json.loads(proc.stdout), proc.stderr


def rows(result, target):
    (t,) = [t for t in result["targets"] if t["target"] == target]
    return {r["weights"]: r for r in t["rows"]}


def test_each_format_is_measured_against_the_original_on_the_heldout_text(compared):
    project, result, _ = compared
    assert result["format"] == "jetson-compare/1" and result["heldout"] == "heldout-long-en"
    assert result["heldout_tokens"] > 4000
    orin = rows(result, "orin-nano-8gb")
    # fp16 is the original model itself (fp32 on the CPU): no change at all
    assert orin["fp16"]["measured"]["perplexity_change"] == 0.0
    assert orin["fp16"]["measured"]["top1_agreement"] == 1.0
    wo, awq = orin["int8_wo"]["measured"], orin["int4_awq"]["measured"]
    assert abs(wo["perplexity_change"]) < 0.01 and wo["top1_agreement"] > 0.95
    assert awq["top1_agreement"] < wo["top1_agreement"]        # 4 bits lose more than 8
    for m in (wo, awq):
        lo, hi = m["interval"]
        assert lo <= m["perplexity_change"] <= hi and m["seconds"] > 0
    # the recorded figures are the accuracy stages' own
    stages = {json.loads(p.read_text())["weights"]: json.loads(p.read_text())
              for p in (project.artifacts / "stages").glob("accuracy/*/accuracy.json")}
    assert stages["int4_awq"]["perplexity_change"] == awq["perplexity_change"]


def test_each_target_gets_its_own_plan_and_formats_a_target_cannot_build_are_said(compared):
    _, result, _ = compared
    orin, thor = rows(result, "orin-nano-8gb"), rows(result, "agx-thor")
    assert orin["int4_awq"]["memory_bytes"] < orin["int8_wo"]["memory_bytes"] < orin["fp16"]["memory_bytes"]
    assert all(r["fits"] and r["decode_tok_s"] > 0 for w, r in orin.items() if w != "nvfp4")
    # NVFP4: no FP4 tensor cores on Orin (SM 8.7); Thor builds it, but it calibrates on a GPU only
    assert not orin["nvfp4"]["planned"] and "SM" in orin["nvfp4"]["note"] and orin["nvfp4"]["measured"] is None
    assert thor["nvfp4"]["planned"] and thor["nvfp4"]["measured"] is None
    assert "CUDA GPU" in thor["nvfp4"]["note"]
    # Edge-LLM on Thor builds no int8_wo: not planned there, though measured for Orin
    assert not thor["int8_wo"]["planned"] and thor["int8_wo"]["measured"] is None


def test_the_table_json_and_chart_are_written(compared):
    from matplotlib.image import imread

    from pipeline.graph.compare import render

    project, result, stderr = compared
    out = project.artifacts / "cmp" / "compare"
    assert json.loads((out / "compare.json").read_text()) == result
    png = out / "compare.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    h, w, _ = imread(png).shape
    assert w > 1.8 * h                      # two targets: two panels side by side
    assert f"wrote {out / 'compare.json'}" in stderr
    table = render(result, "int4_awq")
    assert "* int4_awq" in table and "Jetson Orin Nano 8GB" in table and "AGX Thor" in table
    assert "fastest that fits within the quality limits: int4_awq" in table


def test_a_second_compare_measures_nothing_again(compared):
    from pipeline.graph.framework import MANIFEST

    project, result, _ = compared
    manifests = sorted(project.artifacts.glob(f"stages/*/*/{MANIFEST}"))
    # fetch, and quantize + accuracy for each of int4_awq, int8_wo, fp16 (nvfp4 is measured nowhere here)
    assert {p.parent.parent.name for p in manifests} == {"fetch", "quantize", "accuracy"} and len(manifests) == 7
    before = {p: p.stat().st_mtime_ns for p in manifests}
    proc = project.cli("compare", "cmp", "--formats", "int4_awq,int8_wo,fp16,nvfp4", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == result
    assert {p: p.stat().st_mtime_ns for p in manifests} == before
    assert sorted(project.artifacts.glob(f"stages/*/*/{MANIFEST}")) == manifests


def test_compare_shares_the_builds_stages():
    from pipeline.graph.compare import variant
    from pipeline.graph.stage import RecipeGraph
    from pipeline.graph.stages import ACCURACY, QUANTIZE
    from pipeline.recipe import load_recipe

    def quantize_spec(recipe):
        return RecipeGraph(recipe).spec(QUANTIZE)

    def accuracy_spec(recipe):
        return RecipeGraph(recipe).spec(ACCURACY)

    recipe = load_recipe("tiny-llama-cpu")
    same = variant(recipe, recipe.weights)
    assert quantize_spec(same).id == quantize_spec(recipe).id and accuracy_spec(same).id == accuracy_spec(recipe).id
    other = variant(recipe, "int8_wo")
    edited = dataclasses.replace(recipe, quantization=dataclasses.replace(recipe.quantization, weights="int8_wo",
                                                                                group_size=None))
    assert accuracy_spec(other).id == accuracy_spec(edited).id != accuracy_spec(recipe).id


def test_an_unknown_format_is_refused_before_any_work(tmp_path):
    project = Project(tmp_path / "proj")
    local_recipe(project.recipes / "cmp.toml", tmp_path / "missing-ckpt")
    proc = project.cli("compare", "cmp", "--formats", "int4_awq,int3")
    assert proc.returncode == 2
    assert "error: --formats 'int4_awq,int3': unknown format 'int3'" in proc.stderr
    assert "fp16, int4_awq" in proc.stderr and "Traceback" not in proc.stderr
    assert not project.artifacts.exists() or not any(os.scandir(project.artifacts))
    proc = project.cli("compare", "cmp", "--formats", " , ")
    assert proc.returncode == 2 and "error: --formats ' , ': empty" in proc.stderr


def test_recommendation_is_the_fastest_format_that_fits_within_the_limits():
    from pipeline.graph.compare import recommendation

    def row(w, fits, tok_s, ppl, top1):
        return {"weights": w, "fits": fits, "decode_tok_s": tok_s,
                "measured": {"perplexity_change": ppl, "top1_agreement": top1}}
    limits = {"max_perplexity_increase": 0.25, "min_top1_agreement": 0.7}
    target = {"rows": [row("fp16", False, 10.0, 0.0, 1.0), row("int8_wo", True, 18.0, 0.01, 0.97),
                       row("int4_awq", True, 30.0, 0.40, 0.8), row("int8_sq", True, 20.0, 0.05, 0.6)]}
    assert recommendation(target, limits) == "fastest that fits within the quality limits: int8_wo (~18 tok/s)"
    target["rows"] = target["rows"][2:]
    assert recommendation(target, limits).startswith("no compared format both fits")
