import pytest
from conftest import write_checkpoint

from pipeline.errors import InputError, PipelineError
from pipeline.recipe import parse_recipe
from pipeline.workstation.fetch import fetch_local
from pipeline.workstation.safetensors_check import check_safetensors


def test_truncated_or_corrupt_safetensors_are_refused(tmp_path):
    ckpt = write_checkpoint(tmp_path / "ckpt")
    f = ckpt / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[:-100])
    with pytest.raises(PipelineError,
                       match="not a valid safetensors file: tensor .* lies outside the .*-byte data section"):
        check_safetensors(f)
    with pytest.raises(PipelineError, match="truncated or corrupt"):
        fetch_local(ckpt, tmp_path / "out", "r.toml")
    f.write_bytes(b"\xff" * 8 + data[8:])
    with pytest.raises(PipelineError, match="header length .* does not fit in a .*-byte file"):
        check_safetensors(f)


def test_local_source_must_be_a_checkpoint_directory(tmp_path):
    with pytest.raises(PipelineError, match="model.path .*nope is not a directory"):
        fetch_local(tmp_path / "nope", tmp_path / "out", "r.toml")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(PipelineError, match="no .safetensors weights in"):
        fetch_local(tmp_path / "empty", tmp_path / "out", "r.toml")


def test_unknown_builtin_model_is_a_recipe_error():
    data = {"targets": ["orin-nano-8gb"], "model": {"source": "builtin", "name": "tiny-gpt"},
            "quantization": {"weights": "fp16"}, "validation": {"prompts": ["hi"]}}
    with pytest.raises(InputError, match="model.name = 'tiny-gpt': unknown builtin model"):
        parse_recipe(data, "r.toml")


@pytest.mark.integration
@pytest.mark.parametrize("damage,message", [
    ("remove", "has no tokenizer (tokenizer.json, tokenizer.model, vocab.json)"),
    ("garbage", "does not load"),
])
def test_a_checkpoint_without_a_usable_tokenizer_is_refused_at_fetch(project, checkpoint, damage, message):
    from conftest import local_recipe
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if damage == "remove":
            (checkpoint / f).unlink(missing_ok=True)
        elif f == "tokenizer.json":
            (checkpoint / f).write_text('{"version": "1.0", "model": {"type": "nonsense"}}')
    local_recipe(project.recipes / "t.toml", checkpoint)
    proc = project.doit("build", "recipe=t", check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "error: fetch t:" in proc.stderr and message in proc.stderr, proc.stderr
    assert not (project.artifacts / "stages" / "quantize").exists()


@pytest.mark.integration
def test_edgellm_without_a_chat_template_is_refused_before_calibration(project, checkpoint):
    from conftest import local_recipe
    local_recipe(project.recipes / "e.toml", checkpoint, targets=("agx-thor",))
    proc = project.doit("build", "recipe=e", check=False)
    assert proc.returncode != 0
    assert "renders prompts with the tokenizer's chat template, and this model's tokenizer has none" in proc.stderr
    assert not list((project.artifacts / "stages").glob("quantize/*/stage.json"))      # nothing was calibrated


def test_a_link_out_of_the_model_directory_is_refused_before_anything_reads_through_it(tmp_path):
    """#66: an outside file was copied into staging before a later check refused it. A hub cache snapshot's links
    into its own blobs/ stay allowed (how the hub cache stores every file)."""
    import os
    import shutil
    ckpt = write_checkpoint(tmp_path / "ckpt")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.move(ckpt / "config.json", outside / "config.json")
    os.symlink(outside / "config.json", ckpt / "config.json")
    with pytest.raises(PipelineError, match=r"config.json: a link to .*elsewhere/config.json, outside the model "
                                            r"directory .*: nothing is read through it"):
        fetch_local(ckpt, tmp_path / "out", "r.toml")
    assert not (tmp_path / "out").exists()
    # the hub cache's layout: snapshots/<rev>/<file> -> ../../blobs/<hash>
    repo = tmp_path / "models--org--tiny"
    snap, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    blobs.mkdir(parents=True)
    shutil.copytree(ckpt, snap, symlinks=False)
    for f in list(snap.iterdir()):
        shutil.move(f, blobs / f.name)
        os.symlink(os.path.relpath(blobs / f.name, snap), f)
    fetch_local(snap, tmp_path / "out2", "r.toml")
    assert (tmp_path / "out2" / "model.safetensors").stat().st_size == (blobs / "model.safetensors").stat().st_size


def test_an_expert_past_the_configs_count_is_refused_at_fetch_naming_it(tmp_path):
    """transformers gathers a checkpoint's per-expert tensors into its fused experts by index: one past the config's
    count made its conversion fail with a pointer to a report nobody saw; fetch names the tensor and the count."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from pipeline.workstation.fetch import check_checkpoint
    torch.manual_seed(0)
    config = Qwen3MoeConfig(hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_experts=4,
                            num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=8, vocab_size=64, max_position_embeddings=128)
    Qwen3MoeForCausalLM(config).save_pretrained(tmp_path / "moe")
    check_checkpoint(tmp_path / "moe", "r.toml")            # as saved: every expert where the config puts it
    tensors = load_file(str(tmp_path / "moe" / "model.safetensors"))
    assert "model.layers.1.mlp.experts.3.up_proj.weight" in tensors      # the hub's per-expert layout
    tensors["model.layers.1.mlp.experts.4.up_proj.weight"] = torch.zeros(16, 32)
    save_file(tensors, str(tmp_path / "moe" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(PipelineError) as err:
        check_checkpoint(tmp_path / "moe", "r.toml")
    assert err.value.message.endswith("describes: model.layers.1.mlp.experts.4.up_proj.weight: experts index 4, and "
                                      "the config has 4 (0-3)"), err.value.message
