"""The device half on the default recipe's kit: verify -> probe -> gate -> build -> validate -> report -> bundle.

The board is a recorded Orin Nano 8GB on JetPack 6.2 (Super mode; tests/fixtures/devices, copied per test so that
the doubles can make its /proc/meminfo show the memory they take); trtllm-build, llm_build, llm_inference and
tensorrt_llm's runtime are TEST DOUBLES (tests/doubles; TensorRT cannot exist in CI): the build doubles check their argv
against the backends' flag sets and their inputs against the export formats, the runtime doubles compute with the
engine's weights (the TensorRT-LLM checkpoint through the independent reader, the Edge-LLM ONNX through an
interpreter of its graph). Everything else is the production code. The default recipe's row of the family suite
(tests/families.py, tests/conformance.py) runs here on the same kit and device run.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import board_copy, device, kit_meta
from conftest import resigned as _resigned

from pipeline import contract
from tests.conformance import *  # noqa: F403  (the family suite, on this module's rows)
from tests.families import rows_of

pytestmark = pytest.mark.integration   # runs doit or the device half as subprocesses

REPO = Path(__file__).resolve().parents[2]


BUILD_TAKES, RUNTIME_TAKES = 900_000 * 1024, 800_000 * 1024     # what the doubles take from the fake board (kB)
FAMILIES = rows_of(__file__)


@pytest.fixture(scope="module")
def kit_built(kit):
    project, kit_dir, doit_out = kit
    return project, {"orin-nano-8gb": kit_dir}, doit_out


@pytest.fixture(scope="module")
def kit_validated(kit, tmp_path_factory):
    """The device half on the recorded Orin Nano, its load run too, the doubles taking known memory from the board."""
    project, kit_dir, _ = kit
    tmp = tmp_path_factory.mktemp("device")
    return {"orin-nano-8gb": (tmp, device(project, kit_dir, tmp, load=True, BUILD_DOUBLE_TAKES_BYTES=str(BUILD_TAKES),
                                          RUNTIME_DOUBLE_TAKES_BYTES=str(RUNTIME_TAKES)))}


def test_device_builds_validates_and_bundles(kit, kit_validated):
    project, kit_dir, doit_out = kit
    tmp_path, proc = kit_validated["orin-nano-8gb"]
    plan = json.loads((project.artifacts / "tiny-llama-cpu" / "plan" / "plan.json").read_text())
    # offline: where the kit is, and the device command where it will sit (not the workstation's path)
    assert f"kit {kit_dir}" in doit_out and f"python -m pipeline transfer {kit_dir} /media/usb" in doit_out
    assert "python -m pipeline device /media/usb/tiny-llama-cpu@orin-nano-8gb" in doit_out
    assert proc.returncode == 0, proc.stderr
    assert "made for orin-nano-8gb; this board is orin-nano-8gb-super (same SM 8.7)" in proc.stderr
    assert f"it took {BUILD_TAKES / 1e9:.2f} GB from the board (plan: {plan['memory']['build_peak'] / 1e9:.2f} GB)" \
        in proc.stderr

    argv = json.loads((tmp_path / "argv.jsonl").read_text().splitlines()[0])
    want = list(plan["device_build_commands"][0])
    want[want.index("--output_dir") + 1] = str(tmp_path / "work" / "engine.partial")
    assert argv == want
    work = tmp_path / "work"
    assert (work / "engine" / "config.json").is_file() and not (work / "engine.partial").exists()
    assert (work / "build.log").read_text().startswith("$ trtllm-build --checkpoint_dir")

    rdir = tmp_path / "out" / "tiny-llama-cpu@orin-nano-8gb.report"
    report = json.loads((rdir / "report.json").read_text())
    checks = {c["check"]: c for c in report["checks"]}
    assert report["ok"] and report["checks"][0]["measured"] == 1.0            # engine double == goldens, all tokens
    assert len(report["prompts"]) == 3 and all(p["decode_tok_s"] > 0 for p in report["prompts"])
    assert report["device"]["power_mode"] == "MAXN_SUPER" and report["device"]["bandwidth_gbs"] == 102.4
    m, p, mem, lim = report["measured"], report["predicted"], plan["memory"], plan["limits"]
    # memory: what each phase took from the (fake) board, as the doubles took it, next to the plan
    assert m["build_memory"]["taken"] == BUILD_TAKES and m["runtime_memory"]["taken"] == RUNTIME_TAKES
    assert m["build_memory"]["samples"] >= 2 and m["build_memory"]["peak_rss"] > 10 * 2**20     # the double itself
    assert p["build_peak"] == mem["build_peak"] and p["memory_total"] == mem["total"]
    assert checks["engine build memory within the plan's estimate (+20%)"]["measured"] == BUILD_TAKES
    assert checks["runtime memory within the plan's estimate (+20%)"]["measured"] == RUNTIME_TAKES
    # the KV cache as the runtime reported allocating it: the plan's cap, in whole 64-token blocks
    cap = -(-lim["max_seq_len"] // 64) * 64 * lim["max_batch_size"]
    assert m["kv_cache"]["tokens"] == cap == p["kv_cache_tokens"] and "[MemUsageChange]" in m["kv_cache"]["source"]
    assert checks["KV cache allocated by the runtime within the plan's budget"]["ok"]
    assert "[MemUsageChange] Allocated 0.00 GiB for max tokens in paged KV cache (512)." in \
        (work / "validate.log").read_text()
    assert report["predicted"]["decode_tok_s"] == plan["predicted_decode_tok_s"]
    assert report["predicted"]["ttft_ms"] > 0 and m["prompt_tokens"] > 0 and isinstance(report["gaps"], list)
    assert m["speed_source"] == "streamed requests through the serve session: submit to first token, first to " \
        "last token"
    # the load run through the same session: 1, 4 and max_batch_size (2) clients, 8 requests each, every request
    # max_new_tokens long (the goldens run to it), next to the plan's aggregate prediction at that batch
    goldens = json.loads((project.artifacts / "tiny-llama-cpu" / "goldens" / "goldens.json").read_text())
    runs = m["load_runs"]
    assert [(r["concurrency"], r["batch"], r["requests"]) for r in runs] == [(1, 1, 8), (2, 2, 8), (4, 2, 8)]
    for r in runs:
        # req_s is rounded to 3 decimals, from the unrounded seconds: within half of its last digit of requests /
        # seconds, plus what rounding seconds to 6 decimals moves that by (8 / s^2 * 0.5e-6; 0.73961 s: 7.3e-6)
        slack = 0.0005 + 8 / r["seconds"] ** 2 * 0.5e-6 + 1e-9
        assert abs(r["req_s"] - 8 / r["seconds"]) <= slack and 0 < r["ttft_p50_s"] <= r["ttft_p95_s"]
        assert r["itl_p50_s"] <= r["itl_p95_s"]
    by_batch = plan["prediction"]["aggregate_tok_s_by_batch"]
    assert set(by_batch) == {"1", "2"} and by_batch["1"] == plan["predicted_decode_tok_s"] < by_batch["2"]
    assert p["aggregate_tok_s_by_batch"] == by_batch
    md = (rdir / "report.md").read_text()
    assert all(len(g["output_ids"]) == goldens["max_new_tokens"] for g in goldens["prompts"])
    def fmt(v):
        return f"{v:,.0f}" if v >= 100 else f"{v:.2f}"
    for r in runs:
        assert f"| decode, concurrency {r['concurrency']} (batch {r['batch']}), all sequences | " \
            f"{fmt(round(r['batch'] / r['itl_p50_s'], 2))} tok/s | {fmt(by_batch[str(r['batch'])])} tok/s |" in md
    assert "| clients | requests/s | generated tok/s (end to end) |" in md
    assert "| TTFT, " in md and f"| engine build memory | {BUILD_TAKES / 1e9:.2f} GB | " \
        f"{mem['build_peak'] / 1e9:.2f} GB | {BUILD_TAKES / mem['build_peak']:.2f} |" in md
    svg = (rdir / "report.svg").read_text()
    assert svg.startswith("<svg") and "PASSED" in svg and f"{BUILD_TAKES / 1e9:.2f} GB" in svg
    assert "engine build memory (GB)" in svg and "KV cache (tokens)" in svg and "512 tokens" in svg

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


def _goldens_of_two_lengths(limit):
    """The first golden answer cut to half its tokens (goldens of different lengths: with the same divergence point
    its agreement is twice the others'), and the agreement limit set to `limit`."""
    def edit(content):
        g = json.loads((content / "goldens.json").read_text())
        first = g["prompts"][0]
        half = len(first["output_ids"]) // 2
        first.update(output_ids=first["output_ids"][:half], top_logprobs=first["top_logprobs"][:half])
        (content / "goldens.json").write_text(json.dumps(dict(g, min_token_agreement=limit)))
    return edit


def test_token_agreement_is_the_worst_prompts_and_the_limit_holds_at_its_edge(kit, tmp_path):
    """The runtime double's third token is wrong; with goldens of two lengths the prompts agree 2/8 and 2/16: the
    report's figure is the worst (2/16), a limit equal to it passes, a limit 0.0001 above fails by exactly that, and
    the failure names the check and the figures."""
    project, kit_dir, _ = kit
    goldens = json.loads((project.artifacts / "tiny-llama-cpu" / "goldens" / "goldens.json").read_text())
    n = len(goldens["prompts"][0]["output_ids"])
    assert all(len(p["output_ids"]) == n for p in goldens["prompts"]) and n >= 8
    worst, best = round(2 / n, 4), round(2 / (n // 2), 4)
    for limit, ok in ((worst, True), (round(worst + 0.0001, 4), False)):
        kit_copy = _resigned(project, kit_dir, tmp_path / str(limit), _goldens_of_two_lengths(limit))
        run = tmp_path / f"run-{limit}"
        proc = device(project, kit_copy, run, TRTLLM_RUNTIME_DOUBLE_WRONG_AT="2")
        assert proc.returncode == (0 if ok else 1), proc.stderr
        report = json.loads((run / "out" / "tiny-llama-cpu@orin-nano-8gb.report" / "report.json").read_text())
        check = report["checks"][0]
        assert [p["agreement"] for p in report["prompts"]] == [best] + [worst] * (len(report["prompts"]) - 1)
        assert check["measured"] == worst and check["ok"] is ok and check["by"] == (None if ok else 0.0001)
        if not ok:
            assert "failed: token agreement with goldens (worst prompt): required >= " \
                f"{limit}, measured {worst}, short by 0.0001" in proc.stderr
            assert "FAILED" in (run / "out" / "tiny-llama-cpu@orin-nano-8gb.report" / "report.md").read_text()
            assert not list((run / "out").glob("*-sm87-*"))                # no bundle for a failed engine


def _kb(n: float) -> int:
    return int(n) // 1024 * 1024          # meminfo counts kB: the most a double can take at or below n


def test_memory_checks_hold_at_the_plans_estimate_and_fail_just_past_it(kit, tmp_path):
    """The build and the runtime take exactly the plan's estimate + 20% (rounded down to meminfo's kB): both pass;
    1 KiB more: both fail by exactly what they exceed."""
    project, kit_dir, _ = kit
    mem = json.loads((project.artifacts / "tiny-llama-cpu" / "plan" / "plan.json").read_text())["memory"]
    build_limit, runtime_limit = int(mem["build_peak"] * 1.2), int(mem["total"] * 1.2)
    for extra, ok in ((0, True), (1024, False)):
        run = tmp_path / f"extra-{extra}"
        proc = device(project, kit_dir, run, BUILD_DOUBLE_TAKES_BYTES=str(_kb(build_limit) + extra),
                      RUNTIME_DOUBLE_TAKES_BYTES=str(_kb(runtime_limit) + extra))
        assert proc.returncode == (0 if ok else 1), proc.stderr
        report = json.loads((run / "out" / "tiny-llama-cpu@orin-nano-8gb.report" / "report.json").read_text())
        checks = {c["check"]: c for c in report["checks"]}
        build = checks["engine build memory within the plan's estimate (+20%)"]
        runtime = checks["runtime memory within the plan's estimate (+20%)"]
        assert build["measured"] == _kb(build_limit) + extra and runtime["measured"] == _kb(runtime_limit) + extra
        assert build["ok"] is ok and runtime["ok"] is ok
        if not ok:
            assert build["by"] == _kb(build_limit) + 1024 - build_limit
            assert runtime["by"] == _kb(runtime_limit) + 1024 - runtime_limit
            assert "failed: engine build memory within the plan's estimate (+20%)" in proc.stderr


def test_memory_checks_fail_past_the_boards_usable_memory(kit, tmp_path):
    """On a board with more free RAM than its kind's usable memory (headless, 6.0 GB on an Orin Nano 8GB), a build
    and a runtime that take 6.1 GB of RAM fail the usable-memory checks (and the plan's, which is far lower)."""
    project, kit_dir, _ = kit
    root = board_copy(tmp_path, "orin-nano-8gb-jp62-super")
    info = (root / "proc" / "meminfo").read_text()
    (root / "proc" / "meminfo").write_text(info.replace("MemAvailable:    5962204 kB", "MemAvailable:    7400000 kB"))
    took = 6_100_000_000 // 1024 * 1024
    proc = device(project, kit_dir, tmp_path, BUILD_DOUBLE_TAKES_BYTES=str(took), RUNTIME_DOUBLE_TAKES_BYTES=str(took))
    assert proc.returncode == 1, proc.stderr
    report = json.loads((tmp_path / "out" / "tiny-llama-cpu@orin-nano-8gb.report" / "report.json").read_text())
    checks = {c["check"]: c for c in report["checks"]}
    ram = checks["engine build RAM within a headless board's usable memory (the rest may page out to swap)"]
    run = checks["runtime memory within the board's usable memory (headless)"]
    assert not ram["ok"] and ram["measured"] == took and ram["by"] == took - 6_000_000_000
    assert not run["ok"] and run["measured"] == took and run["by"] == took - 6_000_000_000
    assert checks["token agreement with goldens (worst prompt)"]["ok"]


def test_thor_kit_builds_validates_and_bundles_through_edgellm(thor_kit, tmp_path):
    """An Edge-LLM kit on the recorded AGX Thor, end to end: llm_build gets the plan's argv; the goldens and the load
    run go through the serve session (Edge-LLM 0.11's RequestEngine; its double runs the exported ONNX graph) and are
    compared on token ids; the engine bundle is made and signed."""
    project, kit_dir = thor_kit
    proc = device(project, kit_dir, tmp_path, board="agx-thor-jp70", load=True,
                  LLM_BUILD_DOUBLE_RECORD=str(tmp_path / "llm_build.jsonl"),
                  RUNTIME_DOUBLE_TAKES_BYTES=str(400_000 * 1024))
    assert proc.returncode == 0, proc.stderr
    plan = json.loads((project.artifacts / "tiny-thor" / "plan" / "plan.json").read_text())
    argv = json.loads((tmp_path / "llm_build.jsonl").read_text())
    want = list(plan["device_build_commands"][0])
    want[want.index("--engineDir") + 1] = str(tmp_path / "work" / "engine.partial")
    work = tmp_path / "work"
    assert argv == want and (work / "engine" / "llm.engine").is_file()
    assert (work / "validate.log").read_text().startswith(f"$ {sys.executable} -m pipeline.device.session_runner")
    report = json.loads((tmp_path / "out" / "tiny-thor@agx-thor.report" / "report.json").read_text())
    assert report["ok"] and report["checks"][0]["check"] == "token agreement with goldens (worst prompt)"
    assert report["checks"][0]["measured"] == 1.0 and report["device"]["target"] == "agx-thor"
    m = report["measured"]
    assert m["speed_source"].startswith("streamed requests through the serve session")
    assert all(p["ttft_s"] > 0 and p["decode_tok_s"] > 0 for p in report["prompts"])
    assert [(r["concurrency"], r["batch"]) for r in m["load_runs"]] == [(1, 1), (2, 2), (4, 2)]
    assert report["predicted"]["aggregate_tok_s_by_batch"] == plan["prediction"]["aggregate_tok_s_by_batch"]
    # memory as the board showed it; the runtime's own monitor is llm_inference's, not the session's
    assert m["runtime_memory"]["taken"] == 400_000 * 1024 and m["peak_unified_memory"] is None
    assert m["kv_cache"] is None and not any(c["check"].startswith("KV cache") for c in report["checks"])
    assert any("does not report its KV cache allocation" in n for n in report["notes"])
    bundle = tmp_path / "out" / "tiny-thor@agx-thor-sm110-trt10.13.3.9"
    assert (bundle / "MANIFEST.json").is_file()
    r = subprocess.run([sys.executable, "-m", "pipeline", "verify", str(bundle), "--pubkey",
                        str(project.root / "home" / "signing.pub")], env=project.env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_a_miscompiled_edgellm_engine_fails_token_agreement(thor_kit, tmp_path):
    """The RequestEngine double's 4th token off by one: each prompt agrees on 3 of its golden tokens; the report
    fails by exactly what the worst prompt lacks."""
    project, kit_dir = thor_kit
    goldens = json.loads((project.artifacts / "tiny-thor" / "goldens" / "goldens.json").read_text())
    per_prompt = [round(3 / len(p["output_ids"]), 4) for p in goldens["prompts"]]
    proc = device(project, kit_dir, tmp_path, board="agx-thor-jp70", EDGELLM_RUNTIME_DOUBLE_WRONG_AT="4")
    assert proc.returncode == 1, proc.stderr
    report = json.loads((tmp_path / "out" / "tiny-thor@agx-thor.report" / "report.json").read_text())
    check = report["checks"][0]
    assert [p["agreement"] for p in report["prompts"]] == per_prompt and check["measured"] == min(per_prompt)
    assert not check["ok"] and check["by"] == round(goldens["min_token_agreement"] - min(per_prompt), 4)


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
    (content / "plan.json").write_text(json.dumps(plan))
    forged = tmp_path / "kits" / kit_dir.name
    manifest = contract.KitManifest.load(kit_dir / "MANIFEST.json")
    pack(content, forged, kit_dir.name, "kit", SecretKey.load(home / "signing.key"), meta=kit_meta(manifest))
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
    def edit(content):
        plan = json.loads((content / "plan.json").read_text())
        plan["memory"].update(build_peak=peak, build_device=pinned, build_host=peak - pinned)
        (content / "plan.json").write_text(json.dumps(plan))
    return _resigned(project, kit_dir, tmp_path, edit)


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
