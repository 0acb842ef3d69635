"""Device build commands: trtllm-build for TensorRT-LLM 0.12 and llm_build for Edge-LLM, from the plan."""

import json

import pytest

from pipeline import backends
from pipeline.backends.edgellm import check_llm_build_argv, llm_build_argv
from pipeline.backends.trtllm012 import check_trtllm_012_argv, trtllm_build_argv
from pipeline.contract import BuildLimits


def _plan(project, recipe):
    r = project.cli("plan", recipe, "--json", repo_recipes=True)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    return d if isinstance(d, list) else [d]


def _value(argv, flag):
    return argv[argv.index(flag) + 1]


def test_orin_nano_plan_has_a_012_valid_build_command_sized_from_the_plan(project):
    (plan,) = _plan(project, "llama3.2-3b-orin-nano")
    argv = plan["device_build_commands"][0]
    assert argv[0] == "trtllm-build" and check_trtllm_012_argv(argv) == []
    lim = plan["limits"]
    for flag, key in (("--max_batch_size", "max_batch_size"), ("--max_input_len", "max_input_len"),
                      ("--max_seq_len", "max_seq_len"), ("--max_num_tokens", "max_num_tokens")):
        assert int(_value(argv, flag)) == lim[key]
    assert int(_value(argv, "--max_batch_size")) < 256 and int(_value(argv, "--max_num_tokens")) <= 8192
    assert _value(argv, "--context_fmha") == "enable" and _value(argv, "--paged_kv_cache") == "enable"
    assert _value(argv, "--workers") == "1" and _value(argv, "--gemm_plugin") == "float16"
    i = argv.index("--use_fused_mlp")
    assert i == len(argv) - 1 or argv[i + 1].startswith("--")          # a bare switch in 0.12


def test_thor_plan_builds_with_llm_build_at_batch_two(project):
    plans = _plan(project, "llama3.1-8b-thor-nvfp4")
    for plan in plans:
        argv = plan["device_build_commands"][0]
        assert plan["backend"] == "edgellm" and argv[0] == "llm_build" and check_llm_build_argv(argv) == []
        assert _value(argv, "--maxBatchSize") == "2" and plan["limits"]["max_batch_size"] == 2
        assert int(_value(argv, "--maxKVCacheCapacity")) == plan["limits"]["max_seq_len"]


def test_edgellm_plan_at_batch_one_is_planned_and_built_at_two(project, tmp_path):
    from pipeline.plan.perf import known_model_configs

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(known_model_configs()["meta-llama/Llama-3.1-8B-Instruct"]))
    r = project.cli("plan", "--model-config", str(cfg), "--quant", "fp8", "--target", "agx-thor", "--batch", "1",
                    "--json")
    plan = json.loads(r.stdout)
    assert plan["limits"]["max_batch_size"] == 2 and _value(plan["device_build_commands"][0], "--maxBatchSize") == "2"
    assert any("batch 1 fail at run time" in w for w in plan["warnings"])


def test_refused_plan_has_no_build_command(project, tmp_path):
    from pipeline.plan.perf import known_model_configs

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(known_model_configs()["meta-llama/Llama-2-70b-hf"]))
    r = project.cli("plan", "--model-config", str(cfg), "--quant", "fp16", "--target", "orin-nano-8gb", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["device_build_commands"] is None


def test_012_flag_check_names_what_is_wrong():
    assert check_trtllm_012_argv(["trtllm-build", "--use_fused_mlp", "enable"]) == [
        "--use_fused_mlp is a bare switch in trtllm-build 0.12; it takes no value (got 'enable')"]
    assert check_trtllm_012_argv(["trtllm-build", "--use_flash_attn"]) == [
        "trtllm-build 0.12 has no flag --use_flash_attn (use --context_fmha enable)"]
    assert check_trtllm_012_argv(["trtllm-build", "--kv_cache_type", "paged"])[0].startswith(
        "trtllm-build 0.12 has no flag --kv_cache_type (0.13+")
    assert check_trtllm_012_argv(["trtllm-build", "--max_batch_size", "many"]) == [
        "--max_batch_size takes an integer, got 'many'"]
    assert check_trtllm_012_argv(["trtllm-build", "--context_fmha", "on"]) == [
        "--context_fmha takes one of enable/disable, got 'on'"]
    assert check_llm_build_argv(["llm_build", "--onnxDir", "x"]) == ["llm_build needs --engineDir"]


def test_argv_builders_take_the_plan_limits():
    limits = BuildLimits(max_batch_size=2, max_input_len=512, max_seq_len=1024, max_num_tokens=1024)
    assert _value(trtllm_build_argv(limits, "/k/checkpoint", "/k/engine"), "--checkpoint_dir") == "/k/checkpoint"
    assert llm_build_argv(BuildLimits(1, 512, 1024, 1024))[-1] == "2"


def test_each_backend_accepts_its_own_commands_and_refuses_other_programs():
    limits = BuildLimits(2, 512, 1024, 1024)
    for b in backends.REGISTRY.values():
        for argv in b.build_commands(limits, None):
            assert b.check_argv(argv) == [], (b.name, argv)
        assert b.check_argv(["sh", "-c", "id"]) == [f"sh is not a {b.label} builder (allowed: {', '.join(b.builders)})"]
        assert b.check_argv([]) and b.payload in ("checkpoint", "onnx")
    assert backends.get("edgellm").check_argv(["trtllm-build", "--workers", "1"])[0].startswith("trtllm-build is not")


def test_backend_names_are_compared_only_in_the_registry():
    import re
    from pathlib import Path

    root = Path(backends.__file__).parents[1]
    # jetson-board/1 had a field named "edgellm" (the installed version); its upgrade names it, as a field
    allowed = {("contract/device.py", '_BOARD_1_PACKAGES = {"tensorrt_llm": "tensorrt_llm", "edgellm": '
                                      '"tensorrt_edgellm"}')}
    hits = [f"{p.relative_to(root)}:{i}" for p in root.rglob("*.py") if "backends" not in p.parts
            for i, line in enumerate(p.read_text().splitlines(), 1)
            if re.search(r'["\'](trtllm-0\.12|edgellm)["\']', line)
            and (p.relative_to(root).as_posix(), line.strip()) not in allowed]
    assert hits == []


def test_unknown_backend_is_a_clear_error():
    from pipeline.errors import PipelineError
    with pytest.raises(PipelineError, match="(?s)unknown backend 'tensorrt-llm'.*known backends: trtllm-0.12, edgellm"):
        backends.get("tensorrt-llm")


def test_every_backend_has_its_exporter_and_its_runner():
    """The halves register their steps per backend beside the code that runs them: none may be missing."""
    from pipeline.device.runners import RUNNERS
    from pipeline.runtime.engines import SESSIONS
    from pipeline.workstation.exporters import EXPORTERS
    assert set(EXPORTERS) == set(RUNNERS) == set(SESSIONS) == set(backends.REGISTRY)
    for b in backends.REGISTRY.values():
        assert b.staged(b.build_commands(BuildLimits.of(2, 64, 128), None)[0], "/w/engine.partial").count(
            "/w/engine.partial") == 1 and b.output_flag in b.build_commands(BuildLimits.of(2, 64, 128), None)[0]
