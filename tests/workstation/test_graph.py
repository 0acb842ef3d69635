"""The doit graph, run as a user runs it (`doit ...` in a subprocess) against scratch recipes and artifacts."""

import json
import os
import signal
import struct
import subprocess
import sys
import time

import pytest
from conftest import REPO, local_recipe, write_checkpoint

pytestmark = pytest.mark.integration   # runs doit or the device half as subprocesses


def manifest(project, recipe, stage):
    return json.loads((project.artifacts / recipe / stage / "stage.json").read_text())


def test_unknown_command_line_variable_is_rejected(project, checkpoint):
    local_recipe(project.recipes / "a.toml", checkpoint)
    proc = project.doit("build", "recipie=a", check=False)
    assert proc.returncode == 2
    assert "unknown command-line variable(s): recipie; known: recipe=..." in proc.stderr
    proc = project.doit("build", "recipe=nope", check=False)
    assert proc.returncode == 2 and "no recipe 'nope'" in proc.stderr


def test_bad_recipe_is_reported_before_any_work(project, checkpoint):
    local_recipe(project.recipes / "a.toml", checkpoint)
    bad = project.recipes / "bad.toml"
    bad.write_text((project.recipes / "a.toml").read_text().replace('weights = "int4_awq"', 'weights = "int3"'))
    proc = project.doit("build", "recipe=bad", check=False)
    assert proc.returncode == 2
    assert f"{bad}: quantization.weights = 'int3': is not one of the allowed values" in proc.stderr
    assert not (project.artifacts / "stages").exists()


def ran(out: str, stage: str, label: str) -> bool:
    """The stage printed its line (it ran, rather than being up to date)."""
    return any(line.startswith(f"{stage:<9}{label}: ") for line in out.splitlines())


def test_list_shows_per_recipe_and_per_target_stage_tasks(project, checkpoint):
    local_recipe(project.recipes / "a.toml", checkpoint)
    local_recipe(project.recipes / "b.toml", checkpoint, targets=("orin-nano-8gb", "agx-orin-64gb"))
    out = project.doit("list").stdout
    for task in ("build:a", "fetch:a", "plan:a", "build:b", "fetch:b", "plan:b@orin-nano-8gb", "plan:b@agx-orin-64gb"):
        assert f"\n{task} " in "\n" + out, task


def test_build_noop_and_only_affected_stages_rerun(project, checkpoint):
    recipe = local_recipe(project.recipes / "a.toml", checkpoint)
    first = project.doit("build", "recipe=a")
    assert ran(first.stdout, "fetch", "a") and "fits" in first.stdout
    fetch0, plan0 = manifest(project, "a", "fetch"), manifest(project, "a", "plan")
    assert fetch0["files"]["model/model.safetensors"]["size"] == (checkpoint / "model.safetensors").stat().st_size
    plan_json = json.loads((project.artifacts / "a" / "plan" / "plan.json").read_text())
    assert plan_json["fits"] is True and plan_json["target"] == "orin-nano-8gb"

    again = project.doit("build", "recipe=a")
    assert not ran(again.stdout, "fetch", "a")
    assert manifest(project, "a", "plan")["created"] == plan0["created"]   # plan ran, rewrote nothing

    quantize0, goldens0 = manifest(project, "a", "quantize"), manifest(project, "a", "goldens")
    recipe.write_text(recipe.read_text().replace('prompts = ["Hello"]', 'prompts = ["Bonjour"]'))
    out = project.doit("build", "recipe=a").stdout
    assert not ran(out, "quantize", "a") and not ran(out, "export", "a") and ran(out, "goldens", "a")
    assert manifest(project, "a", "fetch") == fetch0 and manifest(project, "a", "plan") == plan0
    assert manifest(project, "a", "quantize") == quantize0
    assert manifest(project, "a", "goldens")["id"] != goldens0["id"]

    recipe.write_text(recipe.read_text().replace("max_seq_len = 256", "max_seq_len = 384"))
    out = project.doit("build", "recipe=a").stdout
    assert not ran(out, "fetch", "a") and "seq 384" in out and not ran(out, "quantize", "a")
    assert manifest(project, "a", "fetch") == fetch0 and manifest(project, "a", "plan")["id"] != plan0["id"]

    (checkpoint / "config.json").write_text((checkpoint / "config.json").read_text().replace('"rms_norm_eps": 1e-05',
                                                                                             '"rms_norm_eps": 1e-06'))
    out = project.doit("build", "recipe=a").stdout
    assert ran(out, "fetch", "a") and ran(out, "quantize", "a")   # the local source changed: fetched again
    assert manifest(project, "a", "fetch")["content_digest"] != fetch0["content_digest"]


def test_recipes_share_the_download(project, checkpoint):
    local_recipe(project.recipes / "a.toml", checkpoint)
    local_recipe(project.recipes / "b.toml", checkpoint, max_seq=512)
    project.doit("build", "recipe=a")
    out = project.doit("build", "recipe=b").stdout
    assert not ran(out, "fetch", "b") and not ran(out, "quantize", "b") and not ran(out, "export", "b")
    assert (project.artifacts / "a" / "fetch").resolve() == (project.artifacts / "b" / "fetch").resolve()


def test_refused_plan_stops_the_chain_before_the_download(project, checkpoint):
    local_recipe(project.recipes / "f.toml", checkpoint, weights="fp8")
    proc = project.doit("build", "recipe=f", check=False)
    assert proc.returncode != 0
    assert "plan for orin-nano-8gb refused" in proc.stderr and "FP8 (E4M3) needs SM >= 8.9" in proc.stderr
    assert not (project.artifacts / "stages" / "fetch").exists()


def _sparse_checkpoint(path, gib=1.5):
    """A checkpoint of more than `gib` GiB whose every tensor is the config's (fetch refuses any other), all zeros
    and written sparse: hashing it takes seconds. The tiny checkpoint's tokenizer, its config widened (2048 wide,
    8192-wide MLP) with as many layers as the size takes."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    write_checkpoint(path)
    config = json.loads((path / "config.json").read_text())
    per_layer = (4 * 2048 * 2048 + 3 * 2048 * 8192) * 2
    config.update(hidden_size=2048, intermediate_size=8192, num_attention_heads=16, num_key_value_heads=16,
                  head_dim=128, num_hidden_layers=int(gib * 2**30 // per_layer) + 1)
    (path / "config.json").write_text(json.dumps(config))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(LlamaConfig(**{k: v for k, v in config.items()
                                                                  if k not in ("architectures", "model_type")}))
    header, offset = {}, 0
    for name, t in model.state_dict().items():
        n = t.numel() * 2
        header[name] = {"dtype": "F16", "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    (path / "model.safetensors").unlink()
    with open(path / "model.safetensors", "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        fh.truncate(8 + len(raw) + offset)
    return path


def test_kill_9_mid_stage_resumes_at_that_stage(project, tmp_path):
    ckpt = _sparse_checkpoint(tmp_path / "big")
    local_recipe(project.recipes / "k.toml", ckpt)
    env = project.env
    proc = subprocess.Popen([sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "fetch", "recipe=k"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    fetch_parent = project.artifacts / "stages" / "fetch"
    deadline = time.time() + 60
    while not list(fetch_parent.glob(".*.partial-*")) and time.time() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert list(fetch_parent.glob(".*.partial-*")), "fetch never started"
    assert not (project.artifacts / "k" / "fetch").exists()
    plan0 = manifest(project, "k", "plan")
    out = project.doit("fetch", "recipe=k").stdout
    assert ran(out, "fetch", "k")
    assert manifest(project, "k", "plan")["created"] == plan0["created"]
    assert manifest(project, "k", "fetch")["files"]["model/model.safetensors"]["size"] > 1.5 * 2**30
    assert not list(fetch_parent.glob(".*.partial-*"))


def test_default_recipe_builds_every_orin_format_offline_on_cpu(project, monkeypatch):
    """fetch -> plan -> quantize -> export -> goldens -> accuracy for the default recipe in each Orin format,
    and for a tiny model whose hidden size (96) is not a multiple of 128 (group size 32 is chosen)."""
    default = (REPO / "recipes" / "tiny-llama-cpu.toml").read_text()
    variants = {"tiny-llama-cpu": default}
    for w in ("int8_sq", "int8_wo", "fp16"):
        variants[f"tiny-{w}"] = default.replace('weights = "int4_awq"', f'weights = "{w}"').replace(
            "group_size = 64\n", "")
    variants["tiny-h96"] = default.replace('name = "tiny-llama"', 'name = "tiny-llama-h96"').replace(
        "group_size = 64\n", "")
    for name, text in variants.items():
        (project.recipes / f"{name}.toml").write_text(text)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    project.doit("build", "recipe=" + ",".join(variants), timeout=1200)

    from safetensors import safe_open
    from tokenizers import Tokenizer
    model = project.artifacts / "tiny-llama-cpu" / "fetch" / "model"
    config = json.loads((model / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["hidden_size"] == 64
    with safe_open(str(model / "model.safetensors"), "np") as f:
        assert f.get_tensor("model.layers.0.self_attn.k_proj.weight").shape == (32, 64)
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    assert tok.decode(tok.encode("To bake bread you need").ids) == "To bake bread you need"
    algos = {"tiny-llama-cpu": "W4A16_AWQ", "tiny-int8_sq": "W8A8_SQ_PER_CHANNEL", "tiny-int8_wo": "W8A16",
             "tiny-fp16": None, "tiny-h96": "W4A16_AWQ"}
    for name, algo in algos.items():
        art = project.artifacts / name
        ckpt = json.loads((art / "export" / "checkpoint" / "config.json").read_text())
        assert ckpt["quantization"]["quant_algo"] == algo, name
        check = manifest(project, name, "export")["export"]["reader_check"]
        assert check["logit_cosine"] >= 0.999 and check["top1_agreement"] >= 0.99, (name, check)
        goldens = json.loads((art / "goldens" / "goldens.json").read_text())
        assert [p["prompt"] for p in goldens["prompts"]] == ["The small computer sat on a shelf",
                                                             "To bake bread you need", "What is the capital of France?"]
        for p in goldens["prompts"]:
            assert 1 <= len(p["output_ids"]) <= 16 and len(p["top_logprobs"]) == len(p["output_ids"])
            assert [step[0][0] for step in p["top_logprobs"]] == p["output_ids"]    # greedy = top-1 each step
        acc = json.loads((art / "accuracy" / "accuracy.json").read_text())
        assert acc["tokens"] > 400 and acc["perplexity_quantized"] > 1
        assert (art / "accuracy" / "accuracy.md").read_text().startswith(f"# Accuracy: {name}")
    assert json.loads((project.artifacts / "tiny-h96" / "plan" / "plan.json").read_text())["quant"]["group_size"] == 32
    fp16 = json.loads((project.artifacts / "tiny-fp16" / "accuracy" / "accuracy.json").read_text())
    assert fp16["logit_cosine"] == 1.0 and fp16["perplexity_change"] == 0.0     # nothing was quantized
    # the default recipe's model memorised the shipped corpus: its golden continues the sentence it was trained on
    golden = json.loads((project.artifacts / "tiny-llama-cpu" / "goldens" / "goldens.json").read_text())
    assert golden["prompts"][1]["text"].startswith(" flour, water, salt and yeast")
    fetched = project.artifacts / "tiny-int8_sq" / "fetch"
    assert fetched.resolve() == (project.artifacts / "tiny-fp16" / "fetch").resolve()

    # the default recipe's kit: stock tools verify it, and it holds what the device needs
    kit = project.artifacts / "tiny-llama-cpu" / "kit" / "tiny-llama-cpu@orin-nano-8gb"
    assert subprocess.run(["sha256sum", "-c", "--strict", "SHA256SUMS"], cwd=kit, capture_output=True).returncode == 0
    pub = project.root / "home" / "signing.pub"
    r = subprocess.run(["minisign", "-Vm", "SHA256SUMS", "-p", str(pub)], cwd=kit, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    m = json.loads((kit / "MANIFEST.json").read_text())
    assert m["kind"] == "kit" and m["sm"] == "8.7" and m["backend"] == "trtllm-0.12"
    assert m["stack"]["tensorrt"] == "10.3" and m["quant"]["weights"] == "int4_awq"
    assert {"checkpoint/config.json", "checkpoint/rank0.safetensors", "tokenizer/tokenizer.json", "goldens.json",
            "recipe.toml", "plan.json", "accuracy.json", "stages.json"} <= {f["path"] for f in m["files"]}
    out = project.root / "unpacked"
    proc = project.cli("unpack", str(kit), str(out), "--pubkey", str(pub))
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "goldens.json").read_text()) == golden


THIRD_PARTY = ("Warning", "warn(", "Loading weights", "Inserted", "quantizers", "tensorrt_llm", "awq_lite",
               "Padding vocab", "current rank", "%|", "Python Task failed", "TaskFailed", "<function")


def test_build_prints_one_line_per_stage_and_logs_the_rest(project, checkpoint):
    local_recipe(project.recipes / "q.toml", checkpoint)
    proc = project.doit("build", "recipe=q")
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) <= 15, lines
    assert not [line for line in lines if any(t in line for t in THIRD_PARTY)], lines
    for stage in ("plan", "fetch", "quantize", "export", "goldens", "accuracy", "package", "build"):
        assert ran(proc.stdout, stage, "q"), (stage, proc.stdout)
    assert "on the Jetson: python -m pipeline device /media/usb/q@orin-nano-8gb" in proc.stdout
    quantize_log = (project.artifacts / "q" / "logs" / "quantize.log").read_text()
    assert "Inserted" in quantize_log          # ModelOpt's own output, kept beside the outputs
    assert "Enable lm_head quantization" in (project.artifacts / "q" / "logs" / "export.log").read_text()
    again = project.doit("build", "recipe=q")
    assert [line for line in again.stdout.splitlines() if not line.startswith(" ")] == [
        line for line in again.stdout.splitlines() if line.startswith(("plan ", "build "))]   # only plan and build
    # a key that cannot be computed (the signing key damaged: the kit's key holds its id) is the stage's one error
    # line, where doit's up-to-date check used to print its traceback
    (project.root / "home" / "signing.key").write_text("untrusted comment: damaged\nnot a key\n")
    damaged = project.doit("build", "recipe=q", check=False)
    errors = [line for line in damaged.stderr.splitlines() if line.startswith("error:")]
    assert damaged.returncode != 0 and len(errors) == 1 and errors[0].startswith("error: package q") and \
        "signing.key" in errors[0], damaged.stderr
    assert "Traceback" not in damaged.stdout + damaged.stderr


def test_a_failed_stage_is_one_error_line_with_its_hint_and_log(project, checkpoint):
    local_recipe(project.recipes / "f.toml", checkpoint, weights="fp8")
    proc = project.doit("build", "recipe=f", check=False)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode != 0 and len(errors) == 1, proc.stderr
    assert errors[0].startswith("error: plan f: ") and "FP8 (E4M3) needs SM >= 8.9" in errors[0]
    assert "  hint: " in proc.stderr and f"  log: {project.artifacts / 'f' / 'logs' / 'plan.log'}" in proc.stderr
    assert not [t for t in THIRD_PARTY if t in proc.stdout + proc.stderr]
    assert "via no backend" not in proc.stdout + proc.stderr and "via None" not in proc.stdout + proc.stderr


def test_an_invalid_recipe_is_named_and_the_valid_ones_go_on(project, checkpoint):
    local_recipe(project.recipes / "a.toml", checkpoint)
    bad = project.recipes / "bad.toml"
    bad.write_text((project.recipes / "a.toml").read_text().replace('weights = "int4_awq"', 'weights = "int3"'))
    listed = project.doit("list")
    assert "\nbuild:a " in "\n" + listed.stdout and "\nbuild:bad " in "\n" + listed.stdout
    assert listed.stderr.count(f"{bad}: quantization.weights = 'int3'") == 1
    built = project.doit("build", check=False)
    assert built.returncode != 0 and (project.artifacts / "a" / "kit" / "a@orin-nano-8gb" / "MANIFEST.json").is_file()
    assert "error: recipe bad is invalid and was not built" in built.stderr
    empty = project.doit("build", "recipe=", check=False)
    assert empty.returncode == 2 and "recipe= is empty" in empty.stderr
