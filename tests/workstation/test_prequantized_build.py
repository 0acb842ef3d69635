"""Pre-quantized checkpoints through the pipeline: a ModelOpt FP8 checkpoint (with an FP8 KV cache), an AutoAWQ and a
GPTQ act-order checkpoint, each written here (tests/prequant_checkpoints.py), by `doit build` to kits without a
calibration, then the device half on the recorded boards (AutoAWQ on an Orin Nano on JetPack 7.2, the others on
Thor); and a ModelOpt W4A16_AWQ checkpoint through TensorRT-LLM
0.12 for JetPack 6."""

import json

import pytest
from conftest import Project, device_on_boards, device_report
from prequant_checkpoints import write_autoawq, write_gptq, write_modelopt

pytestmark = pytest.mark.integration

RECIPE = """\
description = "{what}"
targets = {targets}
{backend}
[model]
source = "local"
path = "{path}"

[quantization]
weights = "{weights}"
kv_cache = "{kv}"

[build]
max_batch_size = 1
max_input_len = 64
max_seq_len = 256

[validation]
prompts = ["Hello", "The small computer sat on a shelf"]
max_new_tokens = 12
{base}"""
# recipe -> (writer, weights, kv cache, {target: recorded board}, backend); the GPTQ recipe says weights = "as-is"
# (the format its checkpoint holds), the others name it; the AutoAWQ recipe names its [base_model] (the model it was
# written from), the others compare with the checkpoint's own numerics
AS_IS, WITH_BASE = "pq-gptq-act-order", "pq-autoawq"
CASES = {
    "pq-autoawq": (write_autoawq, "int4_zp", "fp16", {"orin-nano-8gb": "orin-nano-8gb-jp72"}, "edgellm"),
    "pq-gptq-act-order": (lambda s, d: write_gptq(s, d, act_order=True), "int4_zp", "fp16",
                          {"agx-thor": "agx-thor-jp72"}, "edgellm"),
    "pq-modelopt-fp8": (lambda s, d: write_modelopt(s, d, "fp8", "fp8"), "fp8", "fp8",
                        {"agx-thor": "agx-thor-jp72"}, "edgellm"),
    "pq-modelopt-awq": (lambda s, d: write_modelopt(s, d, "int4_awq", "fp16", 64), "int4_awq", "fp16",
                        {"orin-nano-8gb": "orin-nano-8gb-jp62-super"}, "trtllm-0.12"),
}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from pipeline.workstation.tinymodel import materialize
    out = tmp_path_factory.mktemp("pq-base") / "tiny-llama-h128"
    materialize("tiny-llama-h128", out)
    return out


@pytest.fixture(scope="module")
def built(base, tmp_path_factory):
    """One project, the four recipes, built by one `doit build` (one process): (project, its output)."""
    project = Project(tmp_path_factory.mktemp("pq-build") / "proj")
    for name, (write, weights, kv, boards, backend) in CASES.items():
        ckpt = write(base, project.root / "checkpoints" / name)
        (project.recipes / f"{name}.toml").write_text(RECIPE.format(
            what=name, targets=json.dumps(list(boards)), path=ckpt, weights="as-is" if name == AS_IS else weights,
            kv=kv, base=f'[base_model]\nsource = "local"\npath = "{base}"\n' if name == WITH_BASE else "",
            backend=f'backend = "{backend}"\n'))
    return project, project.doit("build", f"recipe={','.join(CASES)}", timeout=900).stdout


def kit_dir(project, name, target, boards) -> object:
    """A recipe's kit for one target (kit@<target> where it has several, kit where one)."""
    return project.artifacts / name / (f"kit@{target}" if len(boards) > 1 else "kit") / f"{name}@{target}"


def quantize_record(project, name) -> dict:
    return json.loads((project.artifacts / name / "quantize" / "quantize.json").read_text())


def test_each_checkpoint_builds_a_kit_without_calibration(built):
    """No calibration ran: each quantize stage says it took the checkpoint's own scales; the zero-point ones say how
    many weights Edge-LLM's INT4 range clips; the ModelOpt ones restored a quantizer per checkpoint scale."""
    project, output = built
    assert "calibrating" not in output
    for name, (_w, weights, kv, boards, _b) in CASES.items():
        q = quantize_record(project, name)
        assert q["method"] == "checkpoint" and q["weights"] == weights and q["kv_cache"] == kv, q
        (line,) = [x for x in output.splitlines() if x.startswith(f"quantize {name}: ")]
        assert "from the checkpoint" in line and "nothing calibrated" in line, line
        for target in boards:
            assert kit_dir(project, name, target, boards).is_dir()
            kit = json.loads((kit_dir(project, name, target, boards) / "MANIFEST.json").read_text())
            assert kit["quant"]["weights"] == weights, (name, kit["quant"])
    for name in ("pq-autoawq", "pq-gptq-act-order"):
        # asymmetric min/max groups: the largest level above the zero is 8 where the zero is 7, which [-8, 7] clips
        assert 0.001 < quantize_record(project, name)["engine_clipped"] < 0.05
    fp8 = quantize_record(project, "pq-modelopt-fp8")
    # 2 layers x (7 weights + 7 inputs + K + V + the query, given scale 1 as Edge-LLM's runtime does without one)
    assert fp8["restored_quantizers"] == 2 * (7 + 7 + 3)


def test_the_accuracy_stage_compares_with_the_base_model_where_the_recipe_names_one(built, base):
    """With [base_model], "original" is the unquantized model the checkpoint was written from: the INT4 rounding
    itself shows in the figures. Without, only the engine's clamp on top of the checkpoint does."""
    project, output = built
    assert f"fetch-base {WITH_BASE}" in output or (project.artifacts / WITH_BASE / "fetch-base").is_dir()

    def report(name):
        return json.loads((project.artifacts / name / "accuracy" / "accuracy.json").read_text())
    with_base, own = report(WITH_BASE), report(AS_IS)
    assert with_base["original"] == (f"the unquantized base model {base} ([base_model]); quantized: the checkpoint "
                                     "(AutoAWQ awq 4-bit, group 64) as the engine computes it")
    assert own["original"].startswith("the checkpoint's own numerics (GPTQ")
    # both checkpoints round the same base to 4 bits in groups of 64; only the one compared with the base shows it
    assert with_base["logit_cosine"] < own["logit_cosine"]
    assert abs(with_base["perplexity_change"]) > abs(own["perplexity_change"])
    fetched = project.artifacts / WITH_BASE / "fetch-base" / "base" / "model.safetensors"
    assert fetched.read_bytes() == (base / "model.safetensors").read_bytes()


def test_kits_validate_on_the_recorded_boards(built, tmp_path_factory):
    """The device half of every kit, on each target's recorded board: the engine's answers agree with the goldens."""
    project, _ = built
    for name, (_w, _weights, _kv, boards, _b) in CASES.items():
        kits = {t: kit_dir(project, name, t, boards) for t in boards}
        for target, (tmp, proc) in device_on_boards(project, kits, boards, tmp_path_factory.mktemp).items():
            report = device_report(tmp, proc)
            assert report.ok and [p.agreement for p in report.prompts] == [1.0, 1.0], (name, target, report.prompts)
