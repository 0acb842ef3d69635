"""Hostile and unlucky input to the workstation half: recipes and command lines, calibration and held-out text,
config.json files, model and draft directories. One test per class, parametrized over its cases.

The command line runs in-process under a 20 s alarm (conftest.run: a hang fails the test); `doit build` runs as a
user runs it, with a timeout. Every case asserts: exit 2, one `error:` line naming the file and field or line, a
hint, no traceback, nothing changed outside the directories the command was told to write, and (for the graph)
that the refusal came before any expensive work: no stage after the one that refused has output.
"""

from __future__ import annotations

import json
import os
import pickle
import struct
from pathlib import Path

import pytest
from conftest import REPO, Project, local_recipe, one_error, refused, snapshot, write_checkpoint

TINY = (REPO / "recipes" / "tiny-llama-cpu.toml").read_text()


# ------------------------------------------------------------------------------------------ recipes and the CLI
def _edit(old: str, new: str):
    def edit(text: str) -> str:
        assert old in text
        return text.replace(old, new, 1)
    return edit


RECIPE_CASES = {
    "nan threshold": (_edit("min_token_agreement = 0.9", "min_token_agreement = nan"),
                      "validation.min_token_agreement = nan: must be a finite number"),
    "inf threshold": (_edit("min_token_agreement = 0.9", "min_token_agreement = 0.9\nmax_perplexity_increase = inf"),
                      "validation.max_perplexity_increase = inf: must be a finite number"),
    "seed 2**64": (_edit("seq_len = 64", "seq_len = 64\nseed = 18446744073709551616"),
                   "quantization.calibration.seed = 18446744073709551616: must be at most 4294967295"),
    "seq 10**7": (_edit("max_seq_len = 256", "max_seq_len = 10000000"),
                  "build.max_seq_len = 10000000: must be at most 1048576"),
    "batch 100000": (_edit("max_batch_size = 2", "max_batch_size = 100000"),
                     "build.max_batch_size = 100000: must be at most"),
    "negative samples": (_edit("samples = 8", "samples = -8"), "quantization.calibration.samples = -8"),
    "prompt of 20000 characters": (_edit('prompts = ["The small', 'prompts = ["' + "x" * 20000 + '", "The small'),
                                   "validation.prompts"),
    "deep nesting": (lambda t: t + "\nx = " + "[" * 5000 + "]" * 5000 + "\n", "too deeply"),
    "ssh host that is an option": (_edit('builder = "offline"', 'builder = "ssh://nvidia@-oProxyCommand=touch"'),
                                   "build.builder = 'ssh://nvidia@-oProxyCommand=touch'"),
    "ssh user that is an option": (_edit('builder = "offline"', 'builder = "ssh://-oProxyCommand=x@orin"'),
                                   "build.builder = 'ssh://-oProxyCommand=x@orin'"),
}


@pytest.mark.parametrize("case", list(RECIPE_CASES))
def test_hostile_recipe_contents_are_refused_with_the_field(tmp_path, capsys, monkeypatch, case):
    monkeypatch.setenv("PIPELINE_ARTIFACTS", str(tmp_path / "artifacts"))
    edit, match = RECIPE_CASES[case]
    recipe = tmp_path / "r.toml"
    recipe.write_text(edit(TINY))
    err = refused(capsys, tmp_path, None, ["plan", recipe], match)
    assert str(recipe) in err


def _raw(data: bytes):
    def make(path: Path) -> None:
        path.write_bytes(data)
    return make


def _sparse(path: Path) -> None:
    with open(path, "wb") as fh:
        fh.truncate(3 * 2**30)


RECIPE_FILES = {
    "not UTF-8": (_raw(TINY.replace("Tiny", "Tiny \xe9").encode("latin-1")), "not UTF-8"),
    "binary": (_raw(bytes(range(256)) * 8), "not UTF-8"),
    "3 GB sparse": (_sparse, "bytes, more than the"),
    "FIFO": (lambda p: os.mkfifo(p), "not a regular file"),
    "/dev/zero": (lambda p: os.symlink("/dev/zero", p), "not a regular file"),
    "directory": (lambda p: p.mkdir(), "not a regular file"),
    "link loop": (lambda p: os.symlink(p, p), "r.toml"),
}


@pytest.mark.parametrize("case", list(RECIPE_FILES))
def test_a_recipe_file_that_is_no_text_file_is_refused(tmp_path, capsys, monkeypatch, case):
    monkeypatch.setenv("PIPELINE_ARTIFACTS", str(tmp_path / "artifacts"))
    make, match = RECIPE_FILES[case]
    make(tmp_path / "r.toml")
    refused(capsys, tmp_path, None, ["plan", tmp_path / "r.toml"], match)


def test_a_recipe_name_too_long_for_a_stage_directory_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PIPELINE_ARTIFACTS", str(tmp_path / "artifacts"))
    recipe = tmp_path / ("r" * 240 + ".toml")
    recipe.write_text(TINY)
    err = refused(capsys, tmp_path, None, ["plan", recipe], "recipe name")
    assert "64" in err


def test_compare_with_no_formats_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PIPELINE_ARTIFACTS", str(tmp_path / "artifacts"))
    (tmp_path / "r.toml").write_text(TINY)
    refused(capsys, tmp_path, None, ["compare", tmp_path / "r.toml", "--formats", ""], "--formats")
    assert not (tmp_path / "artifacts" / "r").exists()


# ------------------------------------------------------------------------------------------------ config.json
def _config(**override) -> dict:
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 320,
         "max_position_embeddings": 512}
    return {k: v for k, v in (c | override).items() if v is not None}


def _json(value) -> bytes:
    return json.dumps(value).encode()


CONFIG_CASES = {
    "a list": (_raw(b"[1, 2]"), "is a JSON list, not a config object"),
    "architectures a string": (_raw(_json(_config(architectures="LlamaForCausalLM"))), "architectures"),
    "architectures of numbers": (_raw(_json(_config(architectures=[1]))), "architectures"),
    "10**400 layers": (_raw(_json(_config(num_hidden_layers=10**400))), "num_hidden_layers"),
    "1e400 hidden": (_raw(_json(_config()).replace(b'"hidden_size": 64', b'"hidden_size": 1e400')), "hidden_size"),
    "NaN": (_raw(_json(_config()).replace(b'"hidden_size": 64', b'"hidden_size": NaN')), "hidden_size"),
    "boolean layers": (_raw(_json(_config(num_hidden_layers=True))), "num_hidden_layers"),
    "deep nesting": (_raw(b'{"a": ' + b"[" * 100000 + b"]" * 100000 + b"}"), "config"),
    "not UTF-8": (_raw(_json(_config(model_type="llam\udce9"))[:-1].replace(b"\\udce9", b"\xe9") + b"}"), "UTF-8"),
    "3 GB sparse": (_sparse, "bytes, more than the"),
    "FIFO": (lambda p: os.mkfifo(p), "not a regular file"),
    "/dev/zero": (lambda p: os.symlink("/dev/zero", p), "not a regular file"),
    "kv heads do not divide heads": (_raw(_json(_config(num_key_value_heads=3))), "num_key_value_heads = 3"),
    "more kv heads than heads": (_raw(_json(_config(num_key_value_heads=8))), "num_key_value_heads = 8"),
    "zero layers": (_raw(_json(_config(num_hidden_layers=0))), "num_hidden_layers = 0"),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_plan_model_config_that_is_no_model_config_is_refused(tmp_path, capsys, case):
    make, match = CONFIG_CASES[case]
    make(tmp_path / "config.json")
    for path in (tmp_path / "config.json", tmp_path):          # the file, or its directory
        err = refused(capsys, tmp_path, None, ["plan", "--model-config", path, "--quant", "int4_awq", "--target",
                                               "orin-nano-8gb"], match)
        assert "config.json" in err


# -------------------------------------------------------------------------------- text files a recipe names
@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("hostile-ckpt") / "ckpt")


TEXT_CASES = {
    "binary": (_raw(os.urandom(4096).replace(b"\n", b"\0")), "not UTF-8 text"),
    "latin-1 on line 3": (_raw("one\ntwo\nthr\xe9e\n".encode("latin-1")), ":3: not UTF-8 text"),
    "jsonl text a number": (_raw(b'{"text": "a"}\n{"text": 5}\n'), ':2: not a JSON object with a "text" string'),
    "jsonl deep nesting": (_raw(b'{"text": "a"}\n' + b'{"text": ' + b"[" * 100000 + b"]" * 100000 + b"}\n"), ":2:"),
    "jsonl not JSON": (_raw(b'{"text": "a"}\n{text\n'), ":2:"),
    "3 GB sparse": (_sparse, "bytes, more than the"),
    "FIFO": (lambda p: os.mkfifo(p), "not a regular file"),
    "/dev/zero": (lambda p: os.symlink("/dev/zero", p), "not a regular file"),
}
TEXT_FIELDS = {"calibration": ("[quantization.calibration]\nsource = \"file:{name}\"\n", "quantization.calibration"),
               "heldout": ("[validation]\nheldout = \"file:{name}\"\n", "validation.heldout")}


def _text_recipe(project: Project, ckpt: Path, field: str, name: str) -> None:
    recipe = local_recipe(project.recipes / "t.toml", ckpt)
    text = recipe.read_text()
    table, _ = TEXT_FIELDS[field]
    head = table.format(name=name).split("\n")[0]
    line = table.format(name=name).split("\n")[1]
    if head in text:
        text = text.replace(head, head + "\n" + line, 1)
    else:
        text += "\n" + head + "\n" + line + "\n"
    recipe.write_text(text)


@pytest.mark.integration
@pytest.mark.parametrize("field,case", [(f, c) for f in TEXT_FIELDS for c in TEXT_CASES
                                        if f == "calibration" or "jsonl" not in c])   # held-out text is plain text
def test_a_text_file_that_is_no_text_is_one_error_before_calibration(tmp_path, ckpt, field, case):
    make, match = TEXT_CASES[case]
    project = Project(tmp_path / "proj")
    name = "texts.jsonl" if "jsonl" in case else "texts.txt"
    make(project.recipes / name)
    _text_recipe(project, ckpt, field, name)
    before = snapshot(tmp_path, project.artifacts)
    proc = project.doit("build", "recipe=t", check=False, timeout=120)
    err = one_error(proc)
    assert proc.returncode == 2 and match in err and TEXT_FIELDS[field][1] in err and name in err, err
    assert not (project.artifacts / "t" / "quantize").exists()         # before calibration
    assert snapshot(tmp_path, project.artifacts) == before


@pytest.mark.integration
@pytest.mark.parametrize("words,over", [(30, "max_input_len"), (15, "max_seq_len")])
def test_a_prompt_the_engine_cannot_take_is_refused_before_calibration(tmp_path, ckpt, words, over):
    """A prompt longer than max_input_len (64), or whose answer (40 tokens) passes max_seq_len (80), counted in
    tokens as the model is asked it: refused before calibration, not signed into a kit that fails on the device."""
    from transformers import AutoTokenizer

    prompt = " ".join(["bread"] * words)
    n = len(AutoTokenizer.from_pretrained(ckpt)(prompt)["input_ids"])
    assert (n > 64) if over == "max_input_len" else (40 < n <= 64)
    project = Project(tmp_path / "proj")
    local_recipe(project.recipes / "p.toml", ckpt, max_seq=80, prompts=(prompt,))
    text = (project.recipes / "p.toml").read_text().replace("[validation]", "[validation]\nmax_new_tokens = 40")
    (project.recipes / "p.toml").write_text(text)
    proc = project.doit("build", "recipe=p", check=False, timeout=120)
    err = one_error(proc)
    want = "the engine takes at most build.max_input_len = 64" if over == "max_input_len" else \
        f"is {n} tokens + max_new_tokens 40 = {n + 40}, more than build.max_seq_len = 80"
    assert proc.returncode == 2 and "validation.prompts[0] ('bread bread" in err and f"{n} tokens" in err, err
    assert want in err, err
    assert not (project.artifacts / "p" / "quantize").exists()


# ------------------------------------------------------------------------------------- model directories
def _header(path: Path, header) -> None:
    """Replace model.safetensors' JSON header; the tensor data after it is kept as it was."""
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    new = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(new)) + new + data[8 + n:])


def _edit_header(fn):
    def make(d: Path) -> None:
        data = (d / "model.safetensors").read_bytes()
        header = json.loads(data[8:8 + struct.unpack("<Q", data[:8])[0]])
        fn(header)
        _header(d / "model.safetensors", header)
    return make


def _first(h: dict) -> dict:
    return h[sorted(k for k in h if k != "__metadata__")[0]]


def _all_at_zero(h: dict) -> None:
    for k, v in h.items():
        if k != "__metadata__":
            v["data_offsets"] = [0, v["data_offsets"][1] - v["data_offsets"][0]]


def _set_config(**kv):
    def make(d: Path) -> None:
        c = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps(c | kv))
    return make


class _Pwn:
    """A pickle that runs code when loaded (what weights_only=True must refuse)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


MODEL_CASES = {
    "header a list": (lambda d: _header(d / "model.safetensors", b"[1, 2]"), "not an object of tensors"),
    "header length past the file": (
        lambda d: (d / "model.safetensors").write_bytes(struct.pack("<Q", 2**60) + b"{}"), "model.safetensors"),
    "dtype a number": (_edit_header(lambda h: _first(h).update(dtype=5)), "dtype"),
    "negative shape": (_edit_header(lambda h: _first(h).update(shape=[-1, 64])), "shape"),
    "offsets past the data": (_edit_header(lambda h: _first(h).update(data_offsets=[0, 2**40])),
                              "lies outside the 460032-byte data section"),
    "overlapping offsets": (_edit_header(_all_at_zero), "overlaps another tensor's"),
    "config disagrees with weights": (_set_config(intermediate_size=256), "not the model its config.json describes"),
    "weights link loop": (lambda d: ((d / "model.safetensors").unlink(),
                                     os.symlink(d / "model.safetensors", d / "model.safetensors")),
                          "model.safetensors"),
    "FIFO weights shard": (lambda d: os.mkfifo(d / "model-00002-of-00002.safetensors"), "not a regular file"),
    "needs its own code": (_set_config(model_type="evil", auto_map={"AutoModelForCausalLM": "evil.EvilModel"}),
                           "needs its own Python code"),
    "tokenizer needs its own code": (
        lambda d: (d / "tokenizer_config.json").write_text(json.dumps(
            json.loads((d / "tokenizer_config.json").read_text()) | {"auto_map": {"AutoTokenizer": ["x.Tok", None]}})),
        "own Python code"),
    "eos id past the vocabulary": (lambda d: (d / "generation_config.json").write_text('{"eos_token_id": 100000}'),
                                   "eos_token_id"),
    "eos id a string": (lambda d: (d / "generation_config.json").write_text('{"eos_token_id": "x"}'),
                        "eos_token_id"),
    "eos ids nested": (lambda d: (d / "generation_config.json").write_text('{"eos_token_id": [[1]]}'),
                       "eos_token_id"),
    "config a FIFO": (lambda d: ((d / "config.json").unlink(), os.mkfifo(d / "config.json")), "not a regular file"),
}

TEMPLATES = {      # transformers' sandbox refuses range() past 100000: a runaway nests loops within that
    "raises": ("{{ raise_exception('no system role') }}", "no system role"),
    "runs away": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                  "ran longer than 10 s"),
    "huge output": ("{% for i in range(20000) %}" + "x" * 100 + "{% endfor %}", "more than 1048576 bytes"),
    "probes the sandbox": ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "SecurityError"),
}


def _copy(src: Path, dst: Path) -> Path:
    import shutil
    shutil.copytree(src, dst)
    return dst


@pytest.mark.integration
@pytest.mark.parametrize("case", list(MODEL_CASES))
def test_a_hostile_model_directory_is_refused_at_fetch(tmp_path, ckpt, case):
    make, match = MODEL_CASES[case]
    model = _copy(ckpt, tmp_path / "model")
    make(model)
    project = Project(tmp_path / "proj")
    local_recipe(project.recipes / "m.toml", model)
    before = snapshot(tmp_path, project.artifacts)
    proc = project.doit("build", "recipe=m", check=False, timeout=120)
    err = one_error(proc)
    assert proc.returncode == 2 and match in err, err
    assert not (project.artifacts / "m" / "quantize").exists()
    assert snapshot(tmp_path, project.artifacts) == before


@pytest.mark.integration
@pytest.mark.parametrize("case", list(TEMPLATES))
def test_a_hostile_chat_template_is_one_error_naming_it_before_calibration(tmp_path, ckpt, case):
    template, match = TEMPLATES[case]
    model = _copy(ckpt, tmp_path / "model")
    (model / "chat_template.jinja").write_text(template)
    project = Project(tmp_path / "proj")
    local_recipe(project.recipes / "c.toml", model)
    proc = project.doit("build", "recipe=c", check=False, timeout=120)
    err = one_error(proc)
    assert proc.returncode == 2 and "chat template" in err and match in err, err
    assert not (project.artifacts / "c" / "quantize").exists()


DRAFT_RECIPE = """\
description = "draft test"
targets = ["agx-thor"]

[model]
source = "builtin"
name = "tiny-llama"

[draft]
method = "eagle3"
source = "local"
path = "{path}"

[quantization]
weights = "fp16"
kv_cache = "fp16"

[build]
max_batch_size = 1
max_input_len = 64
max_seq_len = 256

[validation]
prompts = ["Hello"]
chat_template = false
"""


@pytest.mark.integration
def test_a_drafts_pickle_that_would_run_code_is_refused_not_run(tmp_path):
    """A draft's pytorch_model.bin holding a pickle of os.system: weights_only loading refuses it, as one error."""
    import torch

    from pipeline.workstation.tinymodel import materialize_draft

    draft = tmp_path / "draft"
    materialize_draft("tiny-llama-eagle3", draft)
    (draft / "model.safetensors").unlink()
    marker = tmp_path / "pwned"
    torch.save({"w": _Pwn(marker)}, draft / "pytorch_model.bin")
    assert b"system" in pickle.dumps(_Pwn(marker))
    project = Project(tmp_path / "proj")
    (project.recipes / "d.toml").write_text(DRAFT_RECIPE.format(path=draft))
    proc = project.doit("fetch_draft:d", check=False, timeout=120)
    err = one_error(proc)
    assert proc.returncode == 2 and "pytorch_model.bin: refused" in err and not marker.exists(), err
