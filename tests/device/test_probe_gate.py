"""Probe (device facts from files, so fixtures stand in for boards) and the compatibility gate."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import contract
from pipeline.device.gate import build_memory_gate, check, require
from pipeline.device.probe import probe as probe_facts
from pipeline.errors import PipelineError

FIX = Path(__file__).parents[1] / "fixtures" / "devices"
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name,l4t,jetpack,target,sm,bw,mode", [
    ("orin-nano-8gb-jp62-super", "36.4.3", "6.2", "orin-nano-8gb-super", "8.7", 102.4, "MAXN_SUPER"),
    ("agx-orin-64gb-jp61", "36.4.0", "6.1", "agx-orin-64gb", "8.7", 204.8, "MAXN"),
    ("agx-thor-jp70", "38.2.0", "7.0", "agx-thor", "11.0", 273.0, "MAXN"),
])
def test_probe_reads_the_board(name, l4t, jetpack, target, sm, bw, mode):
    p = probe(FIX / name)
    assert (p["l4t"], p["jetpack"], p["target"], p["sm"], p["bandwidth_gbs"], p["power_mode"]) == \
        (l4t, jetpack, target, sm, bw, mode)


def test_probe_cli_json_and_details():
    out = subprocess.run([sys.executable, "-m", "pipeline", "probe", "--root", str(FIX / "agx-thor-jp70"), "--json"],
                         capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    p = json.loads(out.stdout)
    assert p["tensorrt"] == "10.13.3.9" and p["cuda"] == "13.0.48"
    assert p["python_packages"] == {"tensorrt_edgellm": "0.11.0"}
    assert p["memory_total"] == 128312256 * 1024 and p["soc"] == "tegra264"
    nano = probe(FIX / "orin-nano-8gb-jp62-super")
    assert nano["python_packages"] == {"tensorrt_llm": "0.12.0"} and nano["memory_available"] == 5962204 * 1024


def test_probe_falls_back_to_dpkg_for_l4t(tmp_path):
    (tmp_path / "var/lib/dpkg").mkdir(parents=True)
    (tmp_path / "var/lib/dpkg/status").write_text(
        "Package: nvidia-l4t-core\nStatus: install ok installed\nVersion: 36.4.4-20250616085344\n")
    p = probe(tmp_path)
    assert p["l4t"] == "36.4.4" and p["jetpack"] == "6.2.1" and p["target"] is None and p["bandwidth_gbs"] is None


def probe(root):
    return probe_facts(root)


def board(root, **override) -> contract.Board:
    """The typed board record, as the device driver hands it to the gate."""
    return contract.Board.from_dict(dict(probe_facts(root), **override), str(root))


def manifest(kind="kit", name="r@orin-nano-8gb", **fields) -> contract.Manifest:
    """A complete signed-manifest record (the gate reads kits and bundles only as verified records)."""
    return contract.manifest_from_dict({
        "format": contract.MANIFESTS[kind].FORMAT, "kind": kind, "name": name, "created": "2026-11-23T00:00:00Z",
        "compression": "none", "part_size": 4096, "parts": [{"name": f"{name}.tar.000", "size": 1024,
                                                            "sha256": "0" * 64}],
        "files": [{"path": "plan.json", "size": 2, "sha256": "1" * 64}], "total_size": 2, **fields}, "test")


def kit_meta(target="orin-nano-8gb", sm="8.7"):
    return manifest(name=f"r@{target}", target=target, sm=sm, backend="trtllm-0.12",
                    stack={"id": "jp6-trtllm012", "backend_version": "0.12.0-jetson",
                           "jetpack": ["6.1", "6.2", "6.2.1", "6.2.2"], "l4t": "36.4", "cuda": "12.6",
                           "tensorrt": "10.3"})


def test_gate_passes_the_board_it_was_planned_for_and_warns_on_same_sm_other_board():
    nano = board(FIX / "orin-nano-8gb-jp62-super")
    assert check(kit_meta("orin-nano-8gb-super"), nano).ok
    agx = board(FIX / "agx-orin-64gb-jp61", python_packages={"tensorrt_llm": "0.12.0"})
    r = require(kit_meta("orin-nano-8gb"), agx)
    assert r.warnings == ["kit r@orin-nano-8gb was made for orin-nano-8gb; this board is agx-orin-64gb (same SM "
                          "8.7): the engine loads, TensorRT warns about the device model; validate on each board "
                          "model."]


def test_gate_refuses_wrong_sm():
    thor = board(FIX / "agx-thor-jp70")
    with pytest.raises(PipelineError) as e:
        require(kit_meta(), thor)
    assert "kit r@orin-nano-8gb was made for orin-nano-8gb (SM 8.7" in str(e.value)
    assert "this board is agx-thor, SM 11.0: engines do not load across SMs" in str(e.value)


def test_gate_refuses_wrong_tensorrt_and_jetpack():
    nano = board(FIX / "orin-nano-8gb-jp62-super", tensorrt="10.7.0.23", jetpack="6.3", l4t="36.5.0")
    r = check(kit_meta("orin-nano-8gb-super"), nano)
    assert any("has TensorRT 10.7.0.23 on JetPack 6.3: trtllm-0.12 0.12.0-jetson is supported with JetPack "
               "6.1/6.2/6.2.1/6.2.2 + TensorRT 10.3 only" in x for x in r.refusals)
    assert any("runs JetPack 6.3 (L4T 36.5.0). Flash JetPack 6.1 or 6.2" in x for x in r.refusals)


def test_gate_refuses_missing_or_wrong_backend():
    agx = board(FIX / "agx-orin-64gb-jp61")          # no TensorRT-LLM installed
    r = check(kit_meta("agx-orin-64gb"), agx)
    assert r.refusals == [r.refusals[0]] and "has no trtllm-0.12 installed. Install NVIDIA's TensorRT-LLM " \
        "0.12.0-jetson wheel" in r.refusals[0]
    r = check(kit_meta("agx-orin-64gb"), board(FIX / "agx-orin-64gb-jp61", python_packages={"tensorrt_llm": "0.13.0"}))
    assert "has trtllm-0.12 0.13.0" in r.refusals[0]


def test_gate_reads_bundle_compat():
    compat = {"sm": "11.0", "tensorrt": "10.13.3.9", "jetpack": "7.0", "backend": "edgellm",
              "backend_version": "0.11.0"}
    thor = board(FIX / "agx-thor-jp70")
    built = dict(thor.to_dict(), target="agx-thor")
    kit = {"name": "k", "signed_by": "ABCD", "created": "2026-11-23T00:00:00Z", "quant": None, "limits": None}
    bundle = dict(recipe="r", target="agx-thor", built_on=built, kit=kit)
    assert check(manifest("bundle", "b", compat=compat, **bundle), thor).ok
    r = check(manifest("bundle", "b", compat=dict(compat, jetpack="7.1"), **bundle), thor)
    assert "runs JetPack 7.0 (L4T 38.2.0). Flash JetPack 7.1" in r.refusals[0]


def nano_3b_plan(**memory) -> contract.Plan:
    """The headline recipe's plan: Llama-3.2-3B INT4-AWQ on the Orin Nano 8GB (the real planner)."""
    from pipeline.contract import BuildLimits
    from pipeline.plan.perf import known_shape
    from pipeline.plan.planner import PlanRequest, make_plan
    from pipeline.plan.targets import get_target
    d = make_plan(PlanRequest(known_shape("meta-llama/Llama-3.2-3B-Instruct"), "llama", "int4_awq", "fp16",
                              get_target("orin-nano-8gb"), BuildLimits.of(1, 1024, 2048))).to_dict()
    d["memory"].update(memory)
    return contract.Plan.from_dict(d, "plan.json")


def test_build_memory_gate_builds_with_swap_and_says_how_to_add_it():
    plan = nano_3b_plan()
    m = plan.memory
    assert m is not None and m.build_device < 5962204 * 1024 < m.build_peak             # pinned part fits the RAM
    with pytest.raises(PipelineError) as e:
        build_memory_gate(plan, board(FIX / "orin-nano-8gb-jp62-super"))               # no swap
    assert f"needs ~{m.build_peak / 1e9:.1f} GB" in str(e.value) and "0.0 GB swap free" in str(e.value)
    need = math.ceil((m.build_peak - 5962204 * 1024 + 1e9) / 1e9)
    assert f"sudo fallocate -l {need}G /ssd/{need}GB.swap" in e.value.hint and "sudo swapon" in e.value.hint
    assert "sudo systemctl isolate multi-user.target" in e.value.hint
    paging = build_memory_gate(plan, board(FIX / "orin-nano-8gb-jp62-swap"))          # 8 GB swap: builds
    assert paging is not None and "it will page out and take longer" in paging
    assert build_memory_gate(plan, board(FIX / "agx-orin-64gb-jp61")) is None          # enough RAM: silent


def test_build_memory_gate_refuses_when_the_pinned_part_does_not_fit():
    plan = nano_3b_plan(build_device=7_000_000_000, build_peak=9_000_000_000)
    with pytest.raises(PipelineError) as e:
        build_memory_gate(plan, board(FIX / "orin-nano-8gb-jp62-swap"))
    assert "pins ~7.0 GB on the GPU side" in str(e.value)
    assert "orin-nx-16gb" in e.value.hint and "agx-orin-64gb" in e.value.hint


def test_probe_on_a_machine_that_is_not_a_jetson_says_so(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_text("MemTotal:       16000000 kB\n")
    r = subprocess.run([sys.executable, "-m", "pipeline", "probe", "--root", str(tmp_path)], capture_output=True,
                       text=True, cwd=REPO)
    assert r.returncode == 2 and "error: this is not a Jetson" in r.stderr and "memory_total" in r.stdout
    ok = subprocess.run([sys.executable, "-m", "pipeline", "probe", "--root", str(FIX / "agx-thor-jp70")],
                        capture_output=True, text=True, cwd=REPO)
    assert ok.returncode == 0 and "agx-thor" in ok.stdout and "format" not in ok.stdout


def test_report_flags_a_speed_gap_with_the_power_mode_first():
    from pipeline.device.report import at_size, speed_gaps

    assert at_size({"8": 100.0, "32": 200.0, "1024": 1000.0}, 20) == 150.0
    assert at_size({"8": 100.0}, 500) == 100.0 and at_size({}, 5) is None
    slow = board(FIX / "orin-nano-8gb-jp62-super", power_mode="15W")
    gaps = speed_gaps(10.0, 20.0, 360.0, 300.0, slow)
    assert [g.figure for g in gaps] == ["decode tok/s"]            # TTFT +20%: within the 25% band
    assert gaps[0].off_by == -0.5 and gaps[0].likely_causes[0].startswith("power mode is 15W, not MAXN")
    gaps = speed_gaps(19.0, 20.0, 500.0, 300.0, board(FIX / "orin-nano-8gb-jp62-super"))
    assert [g.figure for g in gaps] == ["TTFT ms"] and gaps[0].likely_causes[0].startswith("jetson_clocks")


def thor_kit():
    """A kit planned by the real planner for AGX Thor (Edge-LLM 0.11), as the device reads it."""
    from pipeline.contract import BuildLimits
    from pipeline.plan.perf import known_shape
    from pipeline.plan.planner import PlanRequest, make_plan
    from pipeline.plan.targets import get_target
    plan = make_plan(PlanRequest(known_shape("Qwen/Qwen3-8B"), "qwen", "nvfp4", "fp16", get_target("agx-thor"),
                                 BuildLimits.of(1, 512, 1024))).to_dict()
    return manifest(name="r@agx-thor", target="agx-thor", sm="11.0", backend=plan["backend"], stack=plan["stack"])


def test_thor_on_jetpack_72_is_accepted_with_its_own_tensorrt():
    kit = thor_kit()
    assert check(kit, board(FIX / "agx-thor-jp72")).ok                    # JetPack 7.2 + TensorRT 10.16
    assert check(kit, board(FIX / "agx-thor-jp70")).ok                    # JetPack 7.0 + TensorRT 10.13
    r = check(kit, board(FIX / "agx-thor-jp72", tensorrt="10.13.3.9"))   # 7.2 with 7.1's TensorRT: not a combination
    assert len(r.refusals) == 1
    assert "supported with JetPack 7.0/7.1 + TensorRT 10.13, JetPack 7.2 + TensorRT 10.16 only" in r.refusals[0]
    r = check(kit, board(FIX / "agx-thor-jp72", jetpack="7.3"))
    assert any("runs JetPack 7.3" in x for x in r.refusals)
