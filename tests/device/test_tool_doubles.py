"""The builder doubles parse their command lines as the real tools do (tests/doubles/python/toolflags.py, from the
tools' sources as FACTS.md records them), independently of the project's flag tables: the argv the project emits
passes them, and a flag the real tool does not take fails there even if the project's own table took it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.backends.edgellm import build_commands as edgellm_commands
from pipeline.backends.trtllm012 import trtllm_build_argv
from pipeline.contract import BuildLimits

BIN = Path(__file__).parents[1] / "doubles" / "bin"
REPO = Path(__file__).parents[2]


def run(tool: str, args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, str(BIN / tool), *args], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env=env)


def test_the_trtllm_build_argv_the_project_emits_is_one_0_12_takes(tmp_path):
    argv = trtllm_build_argv(BuildLimits.of(2, 128, 256), str(tmp_path / "none"), str(tmp_path / "engine"))
    proc = run("trtllm-build", argv[1:], tmp_path)
    assert "unrecognized arguments" not in proc.stderr and "invalid choice" not in proc.stderr, proc.stderr
    assert proc.returncode != 0 and "none" in proc.stderr          # it got past the flags, to the checkpoint


@pytest.mark.parametrize("extra, message", [
    (["--use_fused_mlp", "enable"], "unrecognized arguments: enable"),     # a bare switch in 0.12
    (["--kv_cache_type", "paged"], "unrecognized arguments: --kv_cache_type paged"),
    (["--use_flash_attn"], "unrecognized arguments: --use_flash_attn"),
    (["--context_fmha", "on"], "argument --context_fmha: invalid choice: 'on'"),
    (["--gemm_plugin", "fp16"], "argument --gemm_plugin: invalid choice: 'fp16'"),
])
def test_trtllm_build_refuses_what_0_12_refuses(tmp_path, extra, message):
    proc = run("trtllm-build", ["--checkpoint_dir", "c", "--output_dir", "o", *extra], tmp_path)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_the_llm_build_argvs_the_project_emits_are_ones_llm_build_takes(tmp_path):
    from types import SimpleNamespace
    limits = BuildLimits.of(2, 128, 256)
    argvs = edgellm_commands(limits, None)
    for method in ("eagle3", "mtp"):        # what build_commands reads of a Speculative
        argvs += edgellm_commands(limits, SimpleNamespace(method=method, max_draft_tree_size=3,
                                                          max_verify_tree_size=4))
    for argv in argvs:
        proc = run("llm_build", argv[1:], tmp_path)
        assert "unrecognized option" not in proc.stderr and "invalid value" not in proc.stderr, (argv, proc.stderr)


@pytest.mark.parametrize("args, message", [
    (["--onnxDir", "x", "--engineDir", "e", "--maxBatchsize", "2"], "unrecognized option '--maxBatchsize'"),
    (["--onnxDir", "x", "--engineDir", "e", "--maxInputLen", "many"], "invalid value for --maxInputLen"),
    (["--onnxDir", "x"], "--engineDir is required"),
    (["--onnxDir", "x", "--engineDir", "e", "--specBase", "--specDraft"], "exclusive"),
])
def test_llm_build_refuses_what_it_does_not_take(tmp_path, args, message):
    proc = run("llm_build", args, tmp_path)
    assert proc.returncode == 1 and message in proc.stderr, proc.stderr
