"""Shared fixtures: a small but valid Hugging Face checkpoint made with numpy (no torch), and doit runners."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.tomlcompat import load_toml_text
from tests.sshserver import sshd  # noqa: F401  (a fixture: the ssh builder and fleet tests use it)
from tests.zygote import run_module, zygote_started

# The files that take longest (minutes of doit builds and device runs; pytest's --durations says which), run first:
# pytest-xdist's --dist loadfile hands whole files to whichever worker is free, in collection order, so the long ones
# started last would leave one worker running alone for the last minutes.
LONGEST_FIRST = ("test_vlm_build.py", "test_rollout.py", "test_tts_build.py", "test_visual_export.py",
                 "test_gemma4_build.py", "test_families.py", "test_fleet.py", "test_graph.py", "test_graph_faults.py",
                 "test_stage_cache.py", "test_prequantized_build.py", "test_serve.py", "test_builder_ssh.py",
                 "test_speculative.py", "test_hostile_artifacts.py", "test_moe_build.py", "test_edgellm_export.py")


def pytest_collection_modifyitems(config, items):   # noqa: ARG001 - pytest's hook signature
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))     # stable: the rest keep their order


def pytest_generate_tests(metafunc):
    """The family conformance suite (tests/conformance.py), run by a module that imports it, over that module's rows
    (its FAMILIES, from tests/families.py): `tiny` per row, `tiny_target` per row and target board."""
    if not hasattr(metafunc.module, "FAMILIES"):
        return
    rows = metafunc.module.FAMILIES
    if metafunc.function.__name__ == "test_serve_answers_the_goldens":     # a kind not served yet says so in its row
        rows = tuple(r for r in rows if r.serves)
    if "tiny" in metafunc.fixturenames:
        metafunc.parametrize("tiny", rows, ids=[r.recipe for r in rows])
    if "tiny_target" in metafunc.fixturenames:
        pairs = [(r, t) for r in rows for t in r.boards]
        metafunc.parametrize("tiny_target", pairs, ids=[f"{r.recipe}@{t}" for r, t in pairs])


def pytest_configure(config):   # noqa: ARG001 - pytest's hook signature
    """Under pytest-xdist (the README's test command) every core runs a worker: each worker and the processes it
    starts (doit, the device half, servers) compute on one thread, where two of two threads on two cores would
    contend for them."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        os.environ["MKL_NUM_THREADS"] = "1"     # as tests/sshserver.py's boards have it: their runs fit the zygote
        import torch
        torch.set_num_threads(1)
    # torch's inductor writes its cache directory into os.environ the first time anything in this process exports or
    # compiles (torch/_inductor/runtime/cache_dir_utils.py cache_dir()): the first in-process Edge-LLM export then
    # made every later doit and serve run of the worker differ from the zygote's environment (TORCH*), and each of
    # them fell back to a fresh interpreter (13-15 s of imports). Set now, before the zygote starts, it never changes.
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    cache_dir()
    # The same for the tiny tokenizer's training (pipeline/workstation/tinytrain.py sets it in the process that
    # trains): the tests' checkpoints are trained in the worker (write_checkpoint), and a worker whose zygote had
    # started before its first one ran every later run cold; test_zygote.py, spawning with the changed environment,
    # failed on it in CI (warm False).
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]


def save_random_model(path: Path, model_class: str, config, chat_template: str, vocab: int = 512) -> Path:
    """A transformers model of `model_class` with random weights from `config` (a real config shrunk), beside a BPE
    tokenizer trained here with `chat_template`: a checkpoint as a hub repository holds one."""
    import torch
    import transformers
    from transformers import PreTrainedTokenizerFast

    from pipeline.workstation.tinymodel import train_tokenizer
    torch.manual_seed(0)
    getattr(transformers, model_class)(config).save_pretrained(path)
    tok = PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(vocab), bos_token="<|bos|>", eos_token="<|eos|>",
                                  pad_token="<|pad|>")
    tok.chat_template = chat_template
    tok.save_pretrained(path)
    return path


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
        proc = run_module("doit", ["-f", str(REPO / "dodo.py"), *args], self.env, timeout=timeout)
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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):    # noqa: ARG001 - pytest's hook signature
    """A test (or the code it runs in-process) that leaves an environment variable a library reads at import time
    different from the zygote's errors here, naming it: every later run of its worker would silently start cold
    (tests/zygote.py), and what a spawned process sees would depend on which tests the worker ran first. Checked
    after the test's fixtures are torn down (monkeypatch's changes undone)."""
    result = yield
    z = zygote_started()
    changed = z.changed(dict(os.environ)) if z is not None else []
    if z is not None and changed:
        for name in changed:        # put back, so that the tests after this one run as they would have
            if name in z.env:
                os.environ[name] = z.env[name]
            else:
                os.environ.pop(name, None)
        pytest.fail(f"the test left import-time environment variables different from the zygote's: {changed} "
                    "(set them in pytest_configure, or with monkeypatch)")
    return result


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


# ---------------------------------------------------------------------------------------- hostile-input harness
# The command line run in-process under a 20 s alarm (a hang fails the test instead of stalling CI), and snapshots
# that prove nothing outside the named directories changed. Shared by the hostile suites.
def snapshot(root: Path, skip: Path | None = None) -> dict:
    """Every entry under root (not following links): type, size and content hash; `skip` (the destination) left out."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            if skip is not None and (p == skip or skip in p.parents):
                continue
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode) and st.st_size > 64 * 2**20:      # a planted huge (sparse) file
                out[str(p)] = ("f", st.st_size, st.st_mtime_ns)
            elif stat.S_ISREG(st.st_mode):
                out[str(p)] = ("f", st.st_size, hashlib.sha256(p.read_bytes()).hexdigest())
            elif stat.S_ISLNK(st.st_mode):
                out[str(p)] = ("l", os.readlink(p))
            else:
                out[str(p)] = ("d" if stat.S_ISDIR(st.st_mode) else "other",)
    return out


def run(capsys, *argv: str) -> tuple[int, str, str]:
    def hang(*_):
        raise TimeoutError(f"HANG: `{' '.join(map(str, argv))}` did not finish in 20 s")
    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(20)
    try:
        from pipeline.cli import main
        rc = main([str(a) for a in argv])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    out, err = capsys.readouterr()
    return rc, out, err


def refused(capsys, root: Path, dest: Path | None, argv: list, match: str) -> str:
    """The command exits 2 with one error line containing `match` and a hint; nothing outside `dest` changed, and
    whatever `dest` held is still there."""
    before, inside = snapshot(root, dest), (snapshot(dest) if dest is not None and dest.exists() else {})
    rc, _, err = run(capsys, *argv)
    assert rc == 2, f"ACCEPTED: rc {rc}: {err}"
    assert err.startswith("error: ") and "Traceback" not in err and match in err, f"MESSAGE: {err}"
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1
    assert "hint: " in err, f"NO-HINT: {err}"
    assert snapshot(root, dest) == before, "DAMAGE: something outside the destination changed"
    after = snapshot(dest) if dest is not None and dest.exists() else {}
    assert all(after.get(k) == v for k, v in inside.items()), "DAMAGE: something in the destination was lost"
    return err


def one_error(proc) -> str:
    """The graph's stderr: exactly one `error:` line, a hint, no traceback; returns it."""
    err = proc.stderr
    assert "Traceback" not in err + proc.stdout, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    assert "hint: " in err, f"NO-HINT: {err}"
    return err


# ------------------------------------------------------------------------------ the device half on the default kit
# One kit of the default recipe for every device test (built once per session); the board is a recorded Orin Nano
# 8GB on JetPack 6.2, copied per test so the doubles can make its /proc/meminfo show the memory they take.
FIX = Path(__file__).parent / "fixtures" / "devices"
DOUBLES = Path(__file__).parent / "doubles"


@pytest.fixture(scope="session")
def kit(tmp_path_factory):
    project = Project(tmp_path_factory.mktemp("devkit") / "proj")
    (project.recipes / "tiny-llama-cpu.toml").write_text((REPO / "recipes" / "tiny-llama-cpu.toml").read_text())
    # a warm run (tests/zygote.py): HF_HUB_OFFLINE here made it a fresh interpreter in each worker; that the
    # default recipe builds offline is test_graph.py's test_default_recipe_builds_every_orin_format_offline_on_cpu
    proc = project.doit("build", "recipe=tiny-llama-cpu", timeout=900)
    return project, project.artifacts / "tiny-llama-cpu" / "kit" / "tiny-llama-cpu@orin-nano-8gb", proc.stdout


@pytest.fixture(scope="session")
def thor_kit(tmp_path_factory):
    """The default recipe for the recorded AGX Thor: FP8 weights through Edge-LLM's exporter, packaged (shared by
    the device and serve tests)."""
    project = Project(tmp_path_factory.mktemp("thorkit") / "proj")
    text = (REPO / "recipes" / "tiny-llama-cpu.toml").read_text()
    text = text.replace('targets = ["orin-nano-8gb"]', 'targets = ["agx-thor"]').replace(
        'weights = "int4_awq"', 'weights = "fp8"').replace("group_size = 64\n", "")
    (project.recipes / "tiny-thor.toml").write_text(text)
    project.doit("package", "recipe=tiny-thor", timeout=900)
    return project, project.artifacts / "tiny-thor" / "kit" / "tiny-thor@agx-thor"


@pytest.fixture(scope="session")
def bundle(kit, tmp_path_factory):
    """The signed engine bundle `device` makes from the default recipe's kit on the recorded Orin Nano (with the
    builder and runtime doubles): (project, kit_dir, the device run's directory, bundle dir). Shared by the serve,
    install and fleet tests."""
    project, kit_dir, _ = kit
    tmp = tmp_path_factory.mktemp("bundle")
    proc = device(project, kit_dir, tmp)
    assert proc.returncode == 0, proc.stderr
    (b,) = [p for p in (tmp / "out").iterdir() if (p / "MANIFEST.json").is_file()]
    return project, kit_dir, tmp, b


@pytest.fixture(scope="session")
def thor_bundle(thor_kit, tmp_path_factory):
    """The Thor kit's engine bundle, built on the recorded AGX Thor (JetPack 7.0) with the llm_build and Edge-LLM
    runtime doubles: (project, kit_dir, the device run's directory, bundle dir)."""
    project, kit_dir = thor_kit
    dev = tmp_path_factory.mktemp("thor-bundle")
    proc = device(project, kit_dir, dev, board="agx-thor-jp70")
    assert proc.returncode == 0, proc.stderr
    (b,) = [p for p in (dev / "out").iterdir() if (p / "MANIFEST.json").is_file()]
    return project, kit_dir, dev, b


SECOND = "tiny-llama-fp16"     # the second kit of two_bundles


@pytest.fixture(scope="session")
def two_bundles(bundle, tmp_path_factory):
    """The default recipe's bundle and a second kit's (FP16 weights), signed by the same key, both built on the
    recorded Orin Nano: (project, kit_dir, device run dir, [bundle, bundle]). A board's set, for the install and fleet
    tests."""
    project, kit_dir, built, first = bundle
    tmp = tmp_path_factory.mktemp("second")
    second = Project(tmp / "proj")
    import shutil
    shutil.copytree(project.root / "home", second.root / "home")        # the same signing key
    text = (REPO / "recipes" / "tiny-llama-cpu.toml").read_text()
    (second.recipes / f"{SECOND}.toml").write_text(
        text.replace('weights = "int4_awq"', 'weights = "fp16"').replace("group_size = 64\n", ""))
    second.doit("package", f"recipe={SECOND}", timeout=900)
    proc = device(second, second.artifacts / SECOND / "kit" / f"{SECOND}@orin-nano-8gb", tmp / "dev")
    assert proc.returncode == 0, proc.stderr
    (b,) = [p for p in (tmp / "dev" / "out").iterdir() if (p / "MANIFEST.json").is_file()]
    return project, kit_dir, built, [first, b]


def board_copy(tmp: Path, board: str) -> Path:
    """The recorded board, copied: the doubles write its /proc/meminfo while they "take" memory."""
    import shutil
    root = tmp / "board"
    if not root.is_dir():
        shutil.copytree(FIX / board, root, symlinks=True)
    return root


def device_command(project, kit, tmp, board="orin-nano-8gb-jp62-super", args=(), load=False, **extra_env):
    """argv and environment of `pipeline device` on the kit, with the doubles on PATH and a copied board. load=False:
    --load-requests 0 (the load run's 24 requests through the runtime double take most of a run's minute here;
    test_device.py runs it where its figures are checked)."""
    tmp.mkdir(parents=True, exist_ok=True)
    root = board_copy(tmp, board)
    # the doubles run with this interpreter's python3 (they import the pipeline's checkpoint schema)
    path = os.pathsep.join([str(DOUBLES / "bin"), str(Path(sys.executable).parent), os.environ["PATH"]])
    env = dict(project.env, PATH=path,
               # the Edge-LLM runtime double shadows the tensorrt_edgellm wheel in the device's processes only (then
               # this machine's own path: on a GPU machine the wheels that travelled with the tree)
               PYTHONPATH=os.pathsep.join([str(DOUBLES / "python"), str(DOUBLES / "edgellm_runtime"), str(REPO),
                                           *filter(None, [os.environ.get("PYTHONPATH")])]),
               FAKE_BOARD_ROOT=str(root),
               TRTLLM_BUILD_DOUBLE_RECORD=str(tmp / "argv.jsonl"), **extra_env)
    argv = [sys.executable, "-m", "pipeline", "device", str(kit), "--root", str(root), "--work", str(tmp / "work"),
            "--out", str(tmp / "out"), "--pubkey", str(project.root / "home" / "signing.pub"), *map(str, args),
            *(() if load else ("--load-requests", "0"))]
    return argv, env


def device(project, kit, tmp, board="orin-nano-8gb-jp62-super", args=(), load=False, **extra_env):
    """`pipeline device` run to its end, a warm fork of the zygote (with the doubles' directories on its path, and
    its runner and the doubles' executables warm forks too): as the interpreter would run it."""
    argv, env = device_command(project, kit, tmp, board, args, load, **extra_env)
    return run_module("pipeline", argv[3:], env, cwd=tmp, timeout=600)


def build_shipped_recipe(root: Path, recipe: str, targets) -> tuple:
    """`doit build` of a repository recipe in a fresh project under `root`: (the project, {target: its kit}, the
    build's output)."""
    project = Project(root)
    text = (REPO / "recipes" / f"{recipe}.toml").read_text()
    (project.recipes / f"{recipe}.toml").write_text(text)
    # the speech-to-text recipe a text-to-speech recipe names as its transcriber lies beside it
    heard_by = load_toml_text(text).get("validation", {}).get("round_trip", {}).get("transcriber")
    if heard_by is not None and not (project.recipes / f"{heard_by}.toml").exists():
        (project.recipes / f"{heard_by}.toml").write_text((REPO / "recipes" / f"{heard_by}.toml").read_text())
    proc = project.doit("build", f"recipe={recipe}", timeout=900)
    return project, {t: project.artifacts / recipe / _per_target(project, recipe, "kit", t) / f"{recipe}@{t}"
                     for t in targets}, proc.stdout


def _per_target(project, recipe: str, name: str, target: str | None) -> str:
    """A per-target output's name under artifacts/<recipe>: <name>@<target> only where the recipe has several targets
    (pipeline/graph/stage.recipe_path's rule, read from the recipe the project holds)."""
    if target is None:
        return name
    targets = load_toml_text((project.recipes / f"{recipe}.toml").read_text())["targets"]
    return f"{name}@{target}" if len(targets) > 1 else name


def stage_dir(project, recipe: str, stage: str, target: str | None = None) -> Path:
    """A recipe's current output of one stage (its link artifacts/<recipe>/<stage>[@<target>]), built."""
    d = (project.artifacts / recipe / _per_target(project, recipe, stage, target)).resolve()
    assert (d / "stage.json").is_file(), d
    return d


def built_vs_engine(project, recipe: str, tmp_path: Path, kv: str, target: str | None = None, **kw) -> dict:
    """tests/edgellm_run.exported_vs_engine on what a build of `recipe` fetched, calibrated and exported (for
    `target` where the recipe has several)."""
    from tests.edgellm_run import exported_vs_engine
    return exported_vs_engine(stage_dir(project, recipe, "fetch") / "model", stage_dir(project, recipe, "quantize"),
                              stage_dir(project, recipe, "export", target) / "onnx", tmp_path, kv, **kw)


def device_report(tmp: Path, proc):
    """The report `pipeline device` (device(), device_on_boards) wrote under tmp/out, once the run succeeded."""
    from pipeline import contract
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (report_dir,) = (tmp / "out").glob("*.report")
    return contract.Report.load(report_dir / contract.REPORT_JSON)


def device_on_boards(project, kits: dict, boards: dict, mktemp) -> dict:
    """`pipeline device` on each target's kit, on its recorded board: {target: (its tmp dir, the process)}."""
    out = {}
    for target, board in boards.items():
        tmp = mktemp(f"device-{target}")
        out[target] = tmp, device(project, kits[target], tmp, board=board)
    return out


def resigned(project, kit_dir, tmp_path, edit):
    """The kit, its payload edited by `edit(content_dir)`, re-signed by the project's key."""
    from pipeline import contract
    from pipeline.kit.archive import pack
    from pipeline.kit.signing import PublicKey, SecretKey
    from pipeline.kit.unpack import unpack

    home = project.root / "home"
    content = tmp_path / "content"
    unpack(kit_dir, content, [PublicKey.load(home / "signing.pub")])
    edit(content)
    out = tmp_path / "kits" / kit_dir.name
    pack(content, out, kit_dir.name, "kit", SecretKey.load(home / "signing.key"),
         meta=kit_meta(contract.KitManifest.load(kit_dir / "MANIFEST.json")))
    return out


def kit_meta(manifest):
    """A kit manifest's own fields (what it was made for), to re-sign an edited copy as the same kit."""
    import dataclasses

    from pipeline import contract
    return contract.KitMeta(**{f.name: getattr(manifest, f.name) for f in dataclasses.fields(contract.KitMeta)})
