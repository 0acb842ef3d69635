"""The device half on the default recipe's kit: verify -> probe -> gate -> build -> validate -> report -> bundle.

The board is a recorded Orin Nano 8GB on JetPack 6.2 (Super mode; tests/fixtures/devices); trtllm-build,
tegrastats and tensorrt_llm's runtime are TEST DOUBLES (tests/doubles; TensorRT cannot exist in CI): the build
double checks its argv against the 0.12 flag set and the checkpoint against the 0.12 schema, the runtime double
computes with the checkpoint's weights through the independent reader. Everything else is the production code.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration   # runs doit or the device half as subprocesses

REPO = Path(__file__).resolve().parents[1]
FIX = Path(__file__).parent / "fixtures" / "devices"
DOUBLES = Path(__file__).parent / "doubles"


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    from tests.conftest import Project

    project = Project(tmp_path_factory.mktemp("devkit") / "proj")
    (project.recipes / "tiny-llama-cpu.toml").write_text((REPO / "recipes" / "tiny-llama-cpu.toml").read_text())
    env = dict(project.env, HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "build",
                           "recipe=tiny-llama-cpu"], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return project, project.artifacts / "tiny-llama-cpu" / "kit" / "tiny-llama-cpu@orin-nano-8gb", proc.stdout


def device(project, kit, tmp, board="orin-nano-8gb-jp62-super", **extra_env):
    tmp.mkdir(parents=True, exist_ok=True)
    # the doubles run with this interpreter's python3 (they import the pipeline's checkpoint schema)
    path = os.pathsep.join([str(DOUBLES / "bin"), str(Path(sys.executable).parent), os.environ["PATH"]])
    env = dict(project.env, PATH=path,
               PYTHONPATH=os.pathsep.join([str(DOUBLES / "python"), str(REPO)]),
               TRTLLM_BUILD_DOUBLE_RECORD=str(tmp / "argv.jsonl"), **extra_env)
    return subprocess.run([sys.executable, "-m", "pipeline", "device", str(kit), "--root", str(FIX / board),
                           "--work", str(tmp / "work"), "--out", str(tmp / "out"),
                           "--pubkey", str(project.root / "home" / "signing.pub")],
                          env=env, capture_output=True, text=True, timeout=600, cwd=tmp)


def test_device_builds_validates_and_bundles(kit, tmp_path):
    project, kit_dir, doit_out = kit
    plan = json.loads((project.artifacts / "tiny-llama-cpu" / "plan" / "plan.json").read_text())
    # offline: where the kit is, and the device command where it will sit (not the workstation's path)
    assert f"kit {kit_dir}" in doit_out and f"python -m pipeline transfer {kit_dir} /media/usb" in doit_out
    assert "python -m pipeline device /media/usb/tiny-llama-cpu@orin-nano-8gb" in doit_out
    proc = device(project, kit_dir, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "made for orin-nano-8gb; this board is orin-nano-8gb-super (same SM 8.7)" in proc.stderr

    argv = json.loads((tmp_path / "argv.jsonl").read_text().splitlines()[0])
    want = list(plan["device_build_command"])
    want[want.index("--output_dir") + 1] = str(tmp_path / "work" / "engine.partial")
    assert argv == want
    work = tmp_path / "work"
    assert (work / "engine" / "config.json").is_file() and not (work / "engine.partial").exists()
    assert (work / "build.log").read_text().startswith("$ trtllm-build --checkpoint_dir")

    report = json.loads((tmp_path / "out" / "tiny-llama-cpu@orin-nano-8gb.report" / "report.json").read_text())
    assert report["ok"] and report["checks"][0]["measured"] == 1.0            # engine double == goldens, all tokens
    assert len(report["prompts"]) == 3 and all(p["decode_tok_s"] > 0 for p in report["prompts"])
    assert report["device"]["power_mode"] == "MAXN_SUPER" and report["device"]["bandwidth_gbs"] == 102.4
    assert report["measured"]["peak_ram"] >= 2100 * 2**20                      # from the tegrastats double
    assert report["predicted"]["decode_tok_s"] == plan["predicted_decode_tok_s"]
    assert report["predicted"]["ttft_ms"] > 0 and report["predicted"]["build_peak"] == plan["memory"]["build_peak"]
    assert report["measured"]["prompt_tokens"] > 0 and isinstance(report["gaps"], list)
    lim = plan["limits"]           # the KV cache capped at the plan's budget, and the report says what was reserved
    assert report["measured"]["kv_cache_reserved"] == {"max_tokens_in_paged_kv_cache":
                                                       lim["max_batch_size"] * lim["max_seq_len"]}
    md = (tmp_path / "out" / "tiny-llama-cpu@orin-nano-8gb.report" / "report.md").read_text()
    assert "| TTFT, " in md and "| engine build |" in md
    png = (tmp_path / "out" / "tiny-llama-cpu@orin-nano-8gb.report" / "report.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and b"IEND" in png[-12:]

    bundle = tmp_path / "out" / "tiny-llama-cpu@orin-nano-8gb-sm87-trt10.3.0.30"
    m = json.loads((bundle / "MANIFEST.json").read_text())
    assert m["kind"] == "bundle" and m["compat"] == {"sm": "8.7", "tensorrt": "10.3.0.30", "jetpack": "6.2",
                                                     "backend": "trtllm-0.12", "backend_version": "0.12.0"}
    key = next((tmp_path / "work").parent.glob("**/signing.pub"), None) or project.root / "home" / "signing.pub"
    r = subprocess.run([sys.executable, "-m", "pipeline", "verify", str(bundle), "--pubkey", str(key)],
                       env=project.env, capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr


def test_failed_build_leaves_no_engine_and_keeps_the_log(kit, tmp_path):
    project, kit_dir, _ = kit
    proc = device(project, kit_dir, tmp_path, TRTLLM_BUILD_DOUBLE_FAIL="1")
    assert proc.returncode == 2
    assert "trtllm-build failed (exit 1)" in proc.stderr and "out of memory (double)" in proc.stderr
    assert not (tmp_path / "work" / "engine").exists() and not (tmp_path / "out").exists()


def test_wrong_board_is_refused_before_anything_is_unpacked(kit, tmp_path):
    project, kit_dir, _ = kit
    proc = device(project, kit_dir, tmp_path, board="agx-thor-jp70")
    assert proc.returncode == 2 and "engines do not load across SMs" in proc.stderr
    assert not (tmp_path / "work").exists() and not (tmp_path / "argv.jsonl").exists()


def test_validation_failure_says_which_check_and_by_how_much(kit, tmp_path):
    project, kit_dir, _ = kit
    proc = device(project, kit_dir, tmp_path, TRTLLM_RUNTIME_DOUBLE_WRONG_AT="2")
    assert proc.returncode == 1, proc.stderr
    goldens = json.loads((project.artifacts / "tiny-llama-cpu" / "goldens" / "goldens.json").read_text())
    worst = min(min(2, len(p["output_ids"])) / len(p["output_ids"]) for p in goldens["prompts"])  # then it diverges
    need = goldens["min_token_agreement"]
    report = json.loads((tmp_path / "out" / "tiny-llama-cpu@orin-nano-8gb.report" / "report.json").read_text())
    check = report["checks"][0]
    assert not report["ok"] and check["measured"] == round(worst, 4) and check["by"] == round(need - worst, 4)
    assert f"failed: token agreement with goldens (worst prompt): required >= {need}, measured {check['measured']}" \
        in proc.stderr
    assert "FAILED" in (tmp_path / "out" / "tiny-llama-cpu@orin-nano-8gb.report" / "report.md").read_text()
    assert not list((tmp_path / "out").glob("*-sm87-*"))                 # no bundle for a failed engine


def test_thor_kit_builds_with_llm_build_and_reports_text_agreement(project, tmp_path):
    """An Edge-LLM kit on the recorded AGX Thor: llm_build gets the plan's argv; llm_inference's double cannot run
    an engine and answers a fixed text, so validation fails and the report says by how much (no bundle)."""
    text = (REPO / "recipes" / "tiny-llama-cpu.toml").read_text()
    text = text.replace('targets = ["orin-nano-8gb"]', 'targets = ["agx-thor"]').replace(
        'weights = "int4_awq"', 'weights = "fp8"').replace("group_size = 64\n", "")
    (project.recipes / "tiny-thor.toml").write_text(text)
    project.doit("package", "recipe=tiny-thor", timeout=900)
    kit_dir = project.artifacts / "tiny-thor" / "kit" / "tiny-thor@agx-thor"
    thor = FIX / "agx-thor-jp70"
    proc = device(project, kit_dir, tmp_path, board="agx-thor-jp70",
                  LLM_BUILD_DOUBLE_RECORD=str(tmp_path / "llm_build.jsonl"))
    assert thor.is_dir() and proc.returncode == 1, proc.stderr
    plan = json.loads((project.artifacts / "tiny-thor" / "plan" / "plan.json").read_text())
    argv = json.loads((tmp_path / "llm_build.jsonl").read_text())
    want = list(plan["device_build_command"])
    want[want.index("--engineDir") + 1] = str(tmp_path / "work" / "engine.partial")
    assert argv == want and (tmp_path / "work" / "engine" / "llm.engine").is_file()
    inp = json.loads((tmp_path / "work" / "inference-input.json").read_text())
    assert [r["messages"][0]["content"] for r in inp["requests"]] == [
        "The small computer sat on a shelf", "To bake bread you need", "What is the capital of France?"]
    report = json.loads((tmp_path / "out" / "tiny-thor@agx-thor.report" / "report.json").read_text())
    check = report["checks"][0]
    goldens = json.loads((project.artifacts / "tiny-thor" / "goldens" / "goldens.json").read_text())
    answer = " (double: no engine was run)"

    def prefix(a, b):
        n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        return n / len(a)
    worst = round(min(prefix(p["text"], answer) for p in goldens["prompts"]), 4)
    assert check["check"] == "text agreement with goldens (worst prompt)" and check["measured"] == worst < 0.1
    assert check["by"] == round(0.9 - worst, 4) and report["device"]["target"] == "agx-thor"


def test_build_timeout_and_ctrl_c_kill_the_builder(tmp_path):
    import signal
    import time

    from pipeline.device.process import run_logged
    from pipeline.errors import PipelineError

    def alive(pid):
        try:
            os.kill(pid, 0)
            return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
        except (ProcessLookupError, FileNotFoundError):
            return False

    cmd = ["sh", "-c", f"echo $$ > {tmp_path / 'pid'}; exec sleep 60"]
    t = time.monotonic()
    with pytest.raises(PipelineError, match=r"sh ran over its 1 s limit; log: .*build.log"):
        run_logged(cmd, cwd=tmp_path, log=tmp_path / "build.log", timeout=1)
    assert time.monotonic() - t < 10 and not alive(int((tmp_path / "pid").read_text()))

    (tmp_path / "pid").unlink()
    # a shell started in the background (CI runners, `./.ci/run &`) makes its children ignore SIGINT, and Python
    # then installs no KeyboardInterrupt handler: restore it, as an interactive terminal would have it
    code = (f"import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            f"sys.path.insert(0, {str(REPO)!r}); from pathlib import Path; "
            f"from pipeline.device.process import run_logged; "
            f"run_logged({cmd!r}, cwd=Path({str(tmp_path)!r}), log=Path({str(tmp_path / 'b.log')!r}), timeout=600)")
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    for _ in range(100):
        if (tmp_path / "pid").is_file() and (tmp_path / "pid").read_text().strip():
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)                    # Ctrl-C
    assert proc.wait(timeout=20) != 0 and "KeyboardInterrupt" in proc.stderr.read()
    pid = int((tmp_path / "pid").read_text())
    for _ in range(50):
        if not alive(pid):
            break
        time.sleep(0.1)
    assert not alive(pid)


def test_a_signed_plan_runs_only_the_backends_builder(kit, tmp_path):
    """A stolen signing key must not mean arbitrary commands on the device: a validly signed plan whose build
    command is `sh` is refused before anything runs."""
    from pipeline.kit.archive import pack
    from pipeline.kit.signing import PublicKey, SecretKey
    from pipeline.kit.unpack import unpack

    project, kit_dir, _ = kit
    home = project.root / "home"
    content = tmp_path / "content"
    unpack(kit_dir, content, [PublicKey.load(home / "signing.pub")])
    plan = json.loads((content / "plan.json").read_text())
    plan["device_build_commands"] = [["sh", "-c", f"touch {tmp_path / 'pwned'}"]]
    plan["device_build_command"] = plan["device_build_commands"][0]
    (content / "plan.json").write_text(json.dumps(plan))
    forged = tmp_path / "kits" / kit_dir.name
    manifest = json.loads((kit_dir / "MANIFEST.json").read_text())
    meta = {k: manifest[k] for k in ("recipe", "target", "sm", "backend", "stack", "quant", "limits")}
    pack(content, forged, kit_dir.name, "kit", SecretKey.load(home / "signing.key"), meta=meta)
    proc = device(project, forged, tmp_path)
    assert proc.returncode == 2 and not (tmp_path / "pwned").exists()
    assert "device_build_commands refused: sh is not a TensorRT-LLM 0.12 builder (allowed: trtllm-build)" \
        in proc.stderr


def test_device_on_a_machine_that_is_not_a_jetson_refuses(kit, tmp_path):
    project, kit_dir, _ = kit
    (tmp_path / "root" / "proc").mkdir(parents=True)
    proc = subprocess.run([sys.executable, "-m", "pipeline", "device", str(kit_dir), "--root", str(tmp_path / "root"),
                           "--work", str(tmp_path / "w"), "--pubkey", str(project.root / "home" / "signing.pub")],
                          env=project.env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and "error: this is not a Jetson" in proc.stderr and not (tmp_path / "w").exists()


def test_a_second_run_uses_only_what_it_verified(kit, tmp_path):
    """Same --work and --out twice: the second run works (it was a traceback), replaces a plan.json planted in the
    unpacked tree (with a forged install record), never uses an engine left in --work by another kit, and reuses
    the engine it built itself only because its files still hash as recorded."""
    project, kit_dir, _ = kit
    assert device(project, kit_dir, tmp_path).returncode == 0
    builds = len((tmp_path / "argv.jsonl").read_text().splitlines())
    proc = device(project, kit_dir, tmp_path)                                   # same --work, same --out
    assert proc.returncode == 0, proc.stderr
    assert "engine: reusing" in proc.stderr and len((tmp_path / "argv.jsonl").read_text().splitlines()) == builds

    work = tmp_path / "work"
    plan = json.loads((work / "kit" / "plan.json").read_text())
    plan["device_build_commands"] = [["trtllm-build", "--checkpoint_dir", "elsewhere", "--output_dir", "x"]]
    (work / "kit" / "plan.json").write_text(json.dumps(plan))                  # planted after the last run
    (work / "engine" / "rank0.engine").write_bytes(b"planted engine")          # swapped engine, same name
    proc = device(project, kit_dir, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "engine: reusing" not in proc.stderr
    argvs = [json.loads(line) for line in (tmp_path / "argv.jsonl").read_text().splitlines()]
    assert len(argvs) == builds + 1 and "elsewhere" not in argvs[-1]            # rebuilt with the kit's own plan
    assert json.loads((work / "kit" / "plan.json").read_text())["device_build_commands"] != \
        plan["device_build_commands"]
    assert (work / "engine" / "rank0.engine").read_bytes() != b"planted engine"


def test_device_refuses_a_damaged_kit_and_an_older_kit(kit, tmp_path):
    project, kit_dir, _ = kit
    copy = tmp_path / "usb" / kit_dir.name
    import shutil
    shutil.copytree(kit_dir, copy)
    part = sorted(copy.glob("*.tar.*"))[0]
    data = bytearray(part.read_bytes())
    data[700] ^= 1
    part.write_bytes(bytes(data))
    proc = device(project, copy, tmp_path)
    assert proc.returncode == 2 and "sha256 does not match" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "argv.jsonl").exists() and not (tmp_path / "work" / "kit").exists()

    assert device(project, kit_dir, tmp_path).returncode == 0
    record = tmp_path / "work" / "kit.installed.json"
    installed = json.loads(record.read_text())
    record.write_text(json.dumps(dict(installed, created="2099-01-01T00:00:00Z")))   # a newer kit ran here since
    proc = device(project, kit_dir, tmp_path)
    assert proc.returncode == 2 and "refusing to downgrade" in proc.stderr and "--allow-downgrade" in proc.stderr


def _repacked_with_build_memory(project, kit_dir, tmp_path, peak: int, pinned: int):
    """The tiny kit, its plan's build memory set to what the 3B headline recipe needs, re-signed by the project's
    key (as if planned for a model that large)."""
    from pipeline.kit.archive import pack
    from pipeline.kit.signing import PublicKey, SecretKey
    from pipeline.kit.unpack import unpack

    home = project.root / "home"
    content = tmp_path / "content"
    unpack(kit_dir, content, [PublicKey.load(home / "signing.pub")])
    plan = json.loads((content / "plan.json").read_text())
    plan["memory"].update(build_peak=peak, build_device=pinned, build_host=peak - pinned)
    (content / "plan.json").write_text(json.dumps(plan))
    manifest = json.loads((kit_dir / "MANIFEST.json").read_text())
    meta = {k: manifest[k] for k in ("recipe", "target", "sm", "backend", "stack", "quant", "limits")}
    out = tmp_path / "kits" / kit_dir.name
    pack(content, out, kit_dir.name, "kit", SecretKey.load(home / "signing.key"), meta=meta)
    return out


def test_orin_nano_builds_a_large_engine_with_swap_and_says_how_to_add_it(kit, tmp_path):
    project, kit_dir, _ = kit
    big = _repacked_with_build_memory(project, kit_dir, tmp_path, peak=11_040_000_000, pinned=3_970_000_000)
    proc = device(project, big, tmp_path / "noswap", board="orin-nano-8gb-jp62-super")
    assert proc.returncode == 2 and "0.0 GB swap free: short by" in proc.stderr
    assert "sudo fallocate -l " in proc.stderr and "sudo swapon /ssd/" in proc.stderr
    assert not (tmp_path / "noswap" / "argv.jsonl").exists()                   # nothing was built
    proc = device(project, big, tmp_path / "swap", board="orin-nano-8gb-jp62-swap")
    assert proc.returncode == 0, proc.stderr
    assert "it will page out and take longer" in proc.stderr
    assert (tmp_path / "swap" / "argv.jsonl").exists()
