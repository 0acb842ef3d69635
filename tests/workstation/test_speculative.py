"""EAGLE-3 speculative decoding through the edgellm backend: recipe, draft checks, plan (memory and the two
llm_build commands), export of base + draft ONNX, and the device half building both engines (test doubles of
llm_build / llm_inference: TensorRT cannot exist in CI)."""

import json
import subprocess
import sys

import pytest
from conftest import DOUBLES, FIX, REPO, device, device_command

from pipeline.errors import InputError, PipelineError

DRAFT = '\n[draft]\nmethod = "eagle3"\nsource = "builtin"\nname = "tiny-llama-eagle3"\n'


def thor_recipe(extra: str = DRAFT) -> str:
    text = (REPO / "recipes" / "tiny-llama-cpu.toml").read_text()
    return text.replace('targets = ["orin-nano-8gb"]', 'targets = ["agx-thor"]').replace(
        'weights = "int4_awq"', 'weights = "fp8"').replace("group_size = 64\n", "") + extra


def parse(text: str, tmp_path):
    from pipeline.recipe import load_recipe
    path = tmp_path / "r.toml"
    path.write_text(text)
    return load_recipe(str(path))


def test_draft_table_errors_name_field_and_fix(tmp_path):
    with pytest.raises(InputError) as e:
        parse(thor_recipe('\n[draft]\nsource = "builtin"\nname = "tiny-llama-eagle3"\n'), tmp_path)
    assert "draft.method" in str(e.value) and 'method = "eagle3"' in str(e.value)
    with pytest.raises(InputError) as e:
        parse(thor_recipe('\n[draft]\nmethod = "eagle3"\nsource = "hf"\nrepo = "a/b"\nrevision = "main"\n'), tmp_path)
    assert "draft.revision = 'main': is not a 40-character commit hash" in str(e.value)
    assert "draft.allow_branch = true" in str(e.value)
    with pytest.raises(InputError, match="draft.name = 'tiny-eagle': unknown builtin draft"):
        parse(thor_recipe('\n[draft]\nmethod = "eagle3"\nsource = "builtin"\nname = "tiny-eagle"\n'), tmp_path)
    with pytest.raises(InputError, match="draft.method = 'medusa': is not one of the allowed values"):
        parse(thor_recipe(DRAFT.replace("eagle3", "medusa")), tmp_path)
    assert parse(thor_recipe(""), tmp_path).draft is None


def test_plan_of_the_eagle3_recipe_counts_the_draft_and_builds_two_engines():
    from pipeline.backends.edgellm import check_llm_build_argv
    from pipeline.plan.perf import known_model_configs
    from pipeline.plan.speculative import draft_shape

    out = subprocess.run([sys.executable, "-m", "pipeline", "plan", "llama3.1-8b-thor-nvfp4-eagle3", "--json"],
                         capture_output=True, text=True, cwd=REPO, check=True).stdout
    plan = json.loads(out)
    base = json.loads(subprocess.run([sys.executable, "-m", "pipeline", "plan", "llama3.1-8b-thor-nvfp4", "--json",
                                      "--target", "agx-thor"], capture_output=True, text=True, cwd=REPO,
                                     check=True).stdout)
    spec = plan["speculative"]
    # the draft's own tensors: fc 4096 x 12288, one layer with 8192-wide q/k/v inputs, lm_head 32000 x 4096
    shape = draft_shape(known_model_configs()["yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"], "t")
    assert shape.params == 424_721_664 and spec["draft_params"] == shape.params
    assert spec["memory"]["weights"] == 2 * shape.params                       # fp16: ~811 MiB, as published
    assert plan["memory"]["draft"] == spec["memory"]["total"] > spec["memory"]["weights"]
    assert plan["memory"]["total"] - base["memory"]["total"] == spec["memory"]["total"]
    assert plan["backend"] == "edgellm" and plan["ok"]
    base_argv, draft_argv = plan["device_build_commands"]
    assert plan["device_build_commands"][0] == base_argv
    assert base_argv[:3] == ["llm_build", "--onnxDir", "onnx/base"] and base_argv[-1] == "--specBase"
    assert draft_argv[:3] == ["llm_build", "--onnxDir", "onnx/draft"] and draft_argv[-1] == "--specDraft"
    for argv in (base_argv, draft_argv):
        assert not check_llm_build_argv(argv)
        assert argv[argv.index("--maxDraftTreeSize") + 1] == "60" == argv[argv.index("--maxVerifyTreeSize") + 1]
    assert check_llm_build_argv(["llm_build", "--onnxDir", "o", "--engineDir", "e", "--eagleBase"]) == [
        "llm_build has no flag --eagleBase (deprecated alias: use --specBase)"]


def test_plan_refuses_a_draft_on_tensorrt_llm_and_a_draft_of_another_base(tmp_path):
    from pipeline.recipe import config_for, plan_recipe

    orin = (REPO / "recipes" / "tiny-llama-cpu.toml").read_text() + DRAFT
    r = parse(orin, tmp_path)
    plan = plan_recipe(r, "orin-nano-8gb", *config_for(r, r.model))
    assert not plan.ok and "EAGLE-3 draft engines" in plan.refused[-1] and "backend = 'edgellm'" in plan.refused[-1]
    assert plan.to_dict()["device_build_commands"] is None

    other = parse(thor_recipe().replace('name = "tiny-llama"', 'name = "tiny-llama-h96"'), tmp_path)
    plan = plan_recipe(other, "agx-thor", *config_for(other, other.model))
    why = " ".join(plan.refused)
    assert "trained on a base of hidden size 64; this base has 96" in why
    assert "the draft's hidden size 64 differs from the base's 96" in why


def test_draft_checkpoint_is_checked_and_bin_weights_are_converted(tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    from pipeline.workstation.drafts import check_draft_checkpoint, ensure_safetensors
    from pipeline.workstation.tinymodel import materialize_draft

    good = tmp_path / "d"
    materialize_draft("tiny-llama-eagle3", good)
    shape = check_draft_checkpoint(good, "r.toml")
    assert (shape.hidden_size, shape.draft_vocab_size, shape.target_hidden_size) == (64, 256, 64)
    tensors = load_file(str(good / "model.safetensors"))
    d2t = tensors["d2t"]
    targets = d2t + torch.arange(256)                       # offsets into the base vocabulary, strictly increasing
    assert d2t.dtype == torch.int64 and bool((targets[1:] > targets[:-1]).all()) and int(targets[-1]) < 1000

    # pytorch_model.bin (how many drafts ship) becomes model.safetensors, tensor for tensor
    binary = tmp_path / "b"
    binary.mkdir()
    (binary / "config.json").write_text((good / "config.json").read_text())
    torch.save(tensors, binary / "pytorch_model.bin")
    assert ensure_safetensors(binary) == "pytorch_model.bin" and not (binary / "pytorch_model.bin").exists()
    again = load_file(str(binary / "model.safetensors"))
    assert set(again) == set(tensors) and all(torch.equal(again[k], tensors[k]) for k in tensors)

    tensors["fc.weight"] = tensors["fc.weight"][:, :128].contiguous()
    save_file(tensors, str(good / "model.safetensors"))
    with pytest.raises(PipelineError, match=r"fc.weight is \[64, 128\], config says \[64, 192\]"):
        check_draft_checkpoint(good, "r.toml")
    cfg = json.loads((good / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLM"]
    del cfg["draft_vocab_size"]
    (good / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PipelineError, match="not an EAGLE-3 draft"):
        check_draft_checkpoint(good, "r.toml")


@pytest.mark.integration
def test_eagle3_recipe_exports_base_and_draft_and_the_device_builds_both(project, tmp_path):
    """doit through package: the kit carries onnx/base (EAGLE-3 base: hidden_states out) and onnx/draft; on the
    recorded Thor, llm_build runs twice with the plan's argvs and llm_inference with --specDecode, whose double runs
    the base graph (tree attention over a single chain) and answers the goldens; the acceptance rate is Edge-LLM's
    own profile figure, and the bundle is made."""
    from safetensors.torch import load_file

    (project.recipes / "tiny-eagle.toml").write_text(thor_recipe())
    project.doit("package", "recipe=tiny-eagle", timeout=900)
    art = project.artifacts / "tiny-eagle"
    manifest = json.loads((art / "export" / "stage.json").read_text())["export"]
    spec = manifest["speculative"]
    assert spec["method"] == "eagle3" and spec["draft_weights"] == "fp16" and spec["draft_vocab_size"] == 256
    assert manifest["onnx"]["outputs"] == ["logits", "hidden_states", "present_key_values_0", "present_key_values_1"]
    assert {"hidden_states_input", "hidden_states_from_draft"} <= set(spec["draft_onnx"]["inputs"])
    onnx = art / "export" / "onnx"
    base_cfg = json.loads((onnx / "base" / "config.json").read_text())
    draft_cfg = json.loads((onnx / "draft" / "config.json").read_text())
    assert (base_cfg["engine_role"], draft_cfg["engine_role"]) == ("base", "draft")
    assert draft_cfg["base_model_hidden_size"] == 3 * base_cfg["hidden_size"] == 192
    assert spec["base_hidden_state_layers"] == base_cfg["eagle_hidden_state_layers"]
    exported = load_file(str(onnx / "draft" / "d2t.safetensors"))["d2t"]
    fetched = load_file(str(art / "fetch-draft" / "draft" / "model.safetensors"))["d2t"]
    assert exported.tolist() == fetched.tolist()          # the vocabulary map reaches the device unchanged
    assert not (onnx / "draft" / "embedding.safetensors").exists()   # the draft reads the base's embedding

    kit = art / "kit" / "tiny-eagle@agx-thor"
    files = {f["path"] for f in json.loads((kit / "MANIFEST.json").read_text())["files"]}
    assert {"onnx/base/model.onnx", "onnx/base/embedding.safetensors", "onnx/draft/model.onnx",
            "onnx/draft/d2t.safetensors"} <= files
    proc = device(project, kit, tmp_path, board="agx-thor-jp70", LLM_BUILD_DOUBLE_RECORD=str(tmp_path / "b.jsonl"))
    assert (FIX / "agx-thor-jp70").is_dir() and (DOUBLES / "bin" / "llm_build").is_file()
    assert proc.returncode == 0, proc.stderr
    plan = json.loads((art / "plan" / "plan.json").read_text())
    recorded = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    staging = str(tmp_path / "work" / "engine.partial")
    assert recorded == [[staging if a == "engine" else a for a in argv] for argv in plan["device_build_commands"]]
    engine = tmp_path / "work" / "engine"
    assert {"spec_base.engine", "base_config.json", "spec_draft.engine", "draft_config.json",
            "d2t.safetensors"} <= {p.name for p in engine.iterdir()}
    assert "--specDecode" in (tmp_path / "work" / "validate-0.log").read_text().splitlines()[0]
    report = json.loads((tmp_path / "out" / "tiny-eagle@agx-thor.report" / "report.json").read_text())
    assert report["checks"][0]["check"] == "text agreement with goldens (worst prompt)" and report["ok"]
    assert report["checks"][0]["measured"] == 1.0
    profile = json.loads((tmp_path / "work" / "profile-0.json").read_text())
    # the double decodes with the base alone: one token per base step, Edge-LLM's average_acceptance_rate 1.0
    assert profile["eagle_generation"]["average_acceptance_rate"] == 1.0 == report["measured"]["acceptance"]
    assert report["prompts"][0]["decode_tok_s"] == \
        profile["eagle_generation"]["overall_tokens_per_second_excluding_base_prefill"]
    assert "| draft acceptance | 1.00 tokens/step | not predicted |" in \
        (tmp_path / "out" / "tiny-eagle@agx-thor.report" / "report.md").read_text()
    bundle = tmp_path / "out" / "tiny-eagle@agx-thor-sm110-trt10.13.3.9"
    assert (bundle / "MANIFEST.json").is_file()
    # serve refuses it, naming why: Edge-LLM 0.11's RequestEngine runs no speculative engine in flight
    _, env = device_command(project, kit, tmp_path)
    r = subprocess.run([sys.executable, "-m", "pipeline", "serve", str(bundle), "--root", str(tmp_path / "board"),
                        "--work", str(tmp_path / "serve"), "--pubkey", str(project.root / "home" / "signing.pub")],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "does not serve eagle3 speculative engines" in r.stderr and "without [draft]" in r.stderr


def test_draft_trained_on_other_base_layers_is_warned_about():
    from pipeline.plan.perf import known_model_configs
    from pipeline.plan.shapes import shape_from_config
    from pipeline.plan.speculative import draft_shape, edgellm_tapped_layers, pairing_warnings

    base = shape_from_config(known_model_configs()["meta-llama/Llama-3.1-8B-Instruct"])
    cfg = dict(known_model_configs()["yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"])
    assert edgellm_tapped_layers(32) == [1, 15, 28]
    assert pairing_warnings(draft_shape(cfg, "t"), base, "d") == []            # says nothing: EAGLE-3's default
    assert pairing_warnings(draft_shape(cfg | {"target_layer_ids": [1, 15, 28]}, "t"), base, "d") == []
    [w] = pairing_warnings(draft_shape(cfg | {"target_layer_ids": [2, 16, 29]}, "t"), base, "d")
    assert "trained on base layers [2, 16, 29]" in w and "layers [1, 15, 28] of this 32-layer base" in w
