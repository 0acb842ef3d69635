"""Shared fixtures: a small but valid Hugging Face checkpoint made with numpy (no torch), and doit runners."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def write_checkpoint(path: Path, hidden=64, layers=2, heads=4, kv_heads=2, inter=128, vocab=320, seed=0) -> Path:
    """A Llama checkpoint directory with random fp32 weights (safetensors' numpy API) and a real BPE tokenizer."""
    import numpy as np
    from safetensors.numpy import save_file

    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    hd = hidden // heads
    t = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,),
         "lm_head.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t.update({p + "self_attn.q_proj.weight": (heads * hd, hidden),
                  p + "self_attn.k_proj.weight": (kv_heads * hd, hidden),
                  p + "self_attn.v_proj.weight": (kv_heads * hd, hidden),
                  p + "self_attn.o_proj.weight": (hidden, heads * hd),
                  p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
                  p + "mlp.down_proj.weight": (hidden, inter), p + "input_layernorm.weight": (hidden,),
                  p + "post_attention_layernorm.weight": (hidden,)})
    save_file({k: (rng.standard_normal(s) * 0.02).astype(np.float32) for k, s in t.items()},
              str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "intermediate_size": inter, "vocab_size": vocab, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False, "rope_theta": 10000.0, "torch_dtype": "float32", "eos_token_id": 1}))
    from transformers import PreTrainedTokenizerFast

    from pipeline.workstation.tinymodel import train_tokenizer
    PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(vocab), bos_token="<|bos|>", eos_token="<|eos|>",
                            pad_token="<|pad|>").save_pretrained(path)
    return path


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    return write_checkpoint(tmp_path / "ckpt")


LOCAL_RECIPE = """\
description = "test recipe"
targets = {targets}

[model]
source = "local"
path = "{path}"

[quantization]
weights = "{weights}"
kv_cache = "fp16"

[build]
max_batch_size = 1
max_input_len = 64
max_seq_len = {max_seq}

[validation]
prompts = {prompts}
"""


def local_recipe(path: Path, checkpoint: Path, targets=("orin-nano-8gb",), weights="int4_awq", max_seq=256,
                 prompts=("Hello",)) -> Path:
    path.write_text(LOCAL_RECIPE.format(targets=json.dumps(list(targets)), path=checkpoint, weights=weights,
                                        max_seq=max_seq, prompts=json.dumps(list(prompts))))
    return path


class Project:
    """A scratch recipes/ + artifacts/ pair that the repo's dodo.py is pointed at."""

    def __init__(self, root: Path):
        self.root = root
        self.recipes = root / "recipes"
        self.artifacts = root / "artifacts"
        self.recipes.mkdir(parents=True, exist_ok=True)

    @property
    def env(self) -> dict:
        env = dict(os.environ, PIPELINE_RECIPES=str(self.recipes), PIPELINE_ARTIFACTS=str(self.artifacts),
                   JETSON_PIPELINE_HOME=str(self.root / "home"))
        env.pop("PIPELINE_ROOT", None)
        return env

    def doit(self, *args, check=True, timeout=600) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), *args], env=self.env,
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"doit {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def cli(self, *args, repo_recipes=False) -> subprocess.CompletedProcess:
        env = self.env
        if repo_recipes:
            env.pop("PIPELINE_RECIPES")
        return subprocess.run([sys.executable, "-m", "pipeline", *args], env=env, capture_output=True,
                              text=True, cwd=REPO, timeout=300)


@pytest.fixture
def project(tmp_path) -> Project:
    return Project(tmp_path / "proj")


@pytest.fixture(autouse=True)
def _isolated_keys(tmp_path, monkeypatch):
    """Signing keys and trusted keys live under a temporary home, never in ~/.config."""
    monkeypatch.setenv("JETSON_PIPELINE_HOME", str(tmp_path / "jetson-pipeline-home"))


def small_disk(monkeypatch, free_blocks: int, block: int = 4096) -> None:
    """os.statvfs reports `free_blocks` free blocks of `block` bytes everywhere (a nearly full disk)."""
    real = os.statvfs

    def small(path):
        s = real(path)
        return os.statvfs_result((s.f_bsize, block, s.f_blocks, free_blocks, free_blocks, s.f_files, s.f_ffree,
                                  s.f_favail, s.f_flag, s.f_namemax))
    monkeypatch.setattr(os, "statvfs", small)
