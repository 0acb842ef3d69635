"""The device half, one command on a kit: verify -> probe -> gate -> unpack -> build -> validate -> report -> bundle.

    python -m pipeline device KIT [--work DIR] [--out DIR]

Any scheduler can run it (a CI runner on each Jetson, Ansible, Slurm): exit 0 = engine built and validated, the
signed bundle and report are in --out; 1 = built but validation failed (the report says which check and by how
much); 2 = refused before building (bad kit, wrong board, not enough memory) or the build failed.
The engine is built into a staging directory and renamed into place only when the build succeeded, so a killed
or failed build never leaves an engine that looks complete; the build log is kept either way.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from pipeline.errors import PipelineError

OUTPUT_FLAGS = ("--output_dir", "--engineDir")


def _say(msg: str) -> None:
    print(f"[device] {msg}", file=sys.stderr, flush=True)


def staged_argv(argv: list[str], staging: str) -> list[str]:
    """The plan's build command with its engine output redirected into the staging directory."""
    out = list(argv)
    for flag in OUTPUT_FLAGS:
        if flag in out:
            out[out.index(flag) + 1] = staging
    return out


def run_logged(argv: list[str], cwd: Path, log: Path, timeout: int, env: dict | None = None) -> float:
    """Run argv in its own process group with output to `log` (and a line every ~30 s to stderr); on timeout or
    Ctrl-C the whole group is killed. Returns seconds; raises PipelineError on failure."""
    start = time.monotonic()
    with open(log, "wb") as fh:
        fh.write(("$ " + " ".join(argv) + "\n").encode())
        fh.flush()
        try:
            proc = subprocess.Popen(argv, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                                    env=env)
        except FileNotFoundError:
            raise PipelineError(f"{argv[0]} is not on PATH on this device",
                                "install the engine builder of the kit's backend (see the README's device setup)")
        try:
            while True:
                try:
                    rc = proc.wait(timeout=min(30, max(1, timeout)))
                    break
                except subprocess.TimeoutExpired:
                    elapsed = time.monotonic() - start
                    if elapsed > timeout:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
                        raise PipelineError(f"{argv[0]} ran over its {timeout} s limit; log: {log}",
                                            "raise --build-timeout, or build on a faster same-SM board")
                    _say(f"{argv[0]} running, {elapsed:.0f} s (log: {log})")
        except KeyboardInterrupt:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    if rc != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        raise PipelineError(f"{argv[0]} failed (exit {rc}); log: {log}; last lines: " + " / ".join(tail),
                            "out of memory shows as exit -9 or a reboot: build on a larger same-SM board")
    return round(time.monotonic() - start, 1)


def _sample_tegrastats(log: Path):
    """Start tegrastats writing to `log` (None where it is not installed)."""
    if not shutil.which("tegrastats"):
        return None
    return subprocess.Popen(["tegrastats", "--interval", "200", "--logfile", str(log)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def edgellm_inference_input(goldens: dict) -> dict:
    """llm_inference's input file: the golden prompts, raw (goldens were made without a chat template), greedy."""
    return {"batch_size": 1, "temperature": 0.0, "top_p": 1.0, "top_k": 1,
            "max_generate_length": goldens["max_new_tokens"], "apply_chat_template": False,
            "add_generation_prompt": False,
            "requests": [{"messages": [{"role": "user", "content": p["prompt"]}]} for p in goldens["prompts"]]}


def _validate_edgellm(kit_dir: Path, engine: Path, work: Path, speculative: bool) -> dict:
    """Edge-LLM's C++ runtime gives text, not token ids: agreement is then measured on the text (report.py)."""
    goldens = json.loads((kit_dir / "goldens.json").read_text())
    (work / "inference-input.json").write_text(json.dumps(edgellm_inference_input(goldens), indent=1))
    results = []
    for i in range(len(goldens["prompts"])):
        single = dict(edgellm_inference_input(goldens))
        single["requests"] = single["requests"][i:i + 1]
        (work / f"input-{i}.json").write_text(json.dumps(single))
        seconds = run_logged(["llm_inference", "--engineDir", str(engine), "--inputFile", str(work / f"input-{i}.json"),
                              "--outputFile", str(work / f"output-{i}.json"), "--warmup", "1",
                              *(["--specDecode"] if speculative else [])],
                             cwd=work, log=work / f"validate-{i}.log", timeout=3600)
        text = json.loads((work / f"output-{i}.json").read_text())["responses"][0]["output_text"]
        results.append({"prompt": goldens["prompts"][i]["prompt"], "output_text": text, "seconds": seconds,
                        "ttft_s": None, "decode_tok_s": None})
    return {"runtime": "llm_inference", "prompts": results}


def validate(kit_dir: Path, engine: Path, plan: dict, work: Path) -> dict:
    stats_log = work / "tegrastats.log"
    sampler = _sample_tegrastats(stats_log)
    try:
        if plan["backend"] != "trtllm-0.12":
            return _validate_edgellm(kit_dir, engine, work, bool(plan.get("speculative")))
        run_logged([sys.executable, "-m", "pipeline.device.trtllm_runner", "--engine-dir", str(engine),
                    "--goldens", str(kit_dir / "goldens.json"), "--out", str(work / "validation.json")],
                   cwd=work, log=work / "validate.log", timeout=3600,
                   env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                       [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])))
    finally:
        if sampler:
            os.killpg(sampler.pid, signal.SIGTERM)
            sampler.wait()
    return json.loads((work / "validation.json").read_text())


def run_device(kit: Path, work: Path | None, out: Path, root: str = "/", pubkey: str | None = None,
               build_timeout: int = 4 * 3600, force: bool = False) -> int:
    from pipeline.device import gate
    from pipeline.kit.bundle import pack_bundle
    from pipeline.kit.archive import check_kit, unpack
    from pipeline.device.probe import probe
    from pipeline.device.report import build_report, tegrastats_peak_ram, write_report
    from pipeline.kit.signing import signing_key, trusted_keys

    trusted = trusted_keys([Path(pubkey)] if pubkey else [])
    manifest = check_kit(kit, trusted)
    _say(f"kit {manifest['name']}: signature and hashes OK (signed by {manifest['_signed_by']})")
    device = probe(root)
    _say(f"this board: {device['target'] or device['board']}, JetPack {device['jetpack']}, SM {device['sm']}, "
         f"TensorRT {device['tensorrt']}, {device['power_mode']}")
    for w in gate.require(manifest, "kit", device).warnings:
        _say(f"warning: {w}")
    work = (work or Path(f"{manifest['name']}.build")).absolute()
    kit_dir = work / "kit"
    if not kit_dir.is_dir():
        work.mkdir(parents=True, exist_ok=True)
        unpack(kit, kit_dir, trusted)
    plan = json.loads((kit_dir / "plan.json").read_text())
    if not force:
        gate.build_memory_gate(plan, device)
    argvs = plan.get("device_build_commands") or ([plan["device_build_command"]]
                                                  if plan.get("device_build_command") else None)
    if not argvs:
        raise PipelineError(f"{kit}: the kit's plan has no device_build_command", "re-package with this version")

    engine, staging = work / "engine", work / "engine.partial"
    if not engine.is_dir():
        shutil.rmtree(staging, ignore_errors=True)
        seconds = 0.0
        for i, argv in enumerate(argvs):       # an EAGLE-3 plan: the base engine, then the draft beside it
            _say("building: " + " ".join(staged_argv(argv, str(staging))))
            seconds += run_logged(staged_argv(argv, str(staging)), cwd=kit_dir,
                                  log=work / ("build.log" if i == 0 else f"build-{i}.log"), timeout=build_timeout)
        os.replace(staging, engine)
        (work / "build.json").write_text(json.dumps({"argv": argvs[0], "argvs": argvs, "seconds": seconds}) + "\n")
    build = json.loads((work / "build.json").read_text())

    validation = validate(kit_dir, engine, plan, work)
    stats = work / "tegrastats.log"
    report = build_report(json.loads((kit_dir / "goldens.json").read_text()), validation, plan, device,
                          tegrastats_peak_ram(stats.read_text()) if stats.is_file() else None, build)
    out.mkdir(parents=True, exist_ok=True)
    report_dir = out / f"{manifest['name']}.report"
    write_report(report_dir, report)
    _say(f"report: {report_dir / 'report.md'} ({'passed' if report['ok'] else 'FAILED'})")
    if not report["ok"]:
        for c in report["checks"]:
            if not c["ok"]:
                _say(f"failed: {c['check']}: required {c['required']}, measured {c['measured']}, short by {c['by']}")
        return 1
    key = signing_key(create=True)
    facts = {**device, "backend": plan["backend"],
             "backend_version": device["tensorrt_llm" if plan["backend"] == "trtllm-0.12" else "edgellm"]}
    bundle = pack_bundle(engine, out, manifest, facts, key)
    _say(f"bundle: {out / bundle['name']} (signed by {key.public.id_hex})")
    return 0
