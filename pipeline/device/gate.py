"""Compatibility gate: may this board build this kit, or load this engine bundle?

A TensorRT engine loads only on the SM and the exact TensorRT it was built with, and the engine's own config records
neither (FACTS.md): the kit's plan and the bundle's manifest do, and the probe says what this board is. Wrong SM,
TensorRT, JetPack or backend version refuse, saying what was built for what and what to do; the same SM on another
board model only warns (TensorRT warns too; validate on each board model).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline import backends
from pipeline.errors import PipelineError


@dataclass
class GateResult:
    refusals: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.refusals


def _minor(version: str | None) -> str | None:
    """'10.3.0.30' -> '10.3'; '0.12.0-jetson' -> '0.12'."""
    if not version:
        return None
    parts = version.split("-")[0].split(".")
    return ".".join(parts[:2])


def _expected(meta: dict, kind: str) -> dict:
    """What the kit's plan (stack) or the bundle's compat record requires of the board."""
    if kind == "bundle":
        c = meta["compat"]
        return {"sm": c["sm"], "tensorrt": c["tensorrt"], "jetpack": [c["jetpack"]], "backend": c["backend"],
                "backend_version": c["backend_version"], "target": meta.get("built_on", {}).get("target")
                or meta.get("target"), "what": f"bundle {meta.get('name', '')}".strip()}
    s = meta["stack"]
    return {"sm": meta["sm"], "tensorrt": s["tensorrt"], "jetpack": s["jetpack"], "backend": meta["backend"],
            "backend_version": s["backend_version"], "target": meta.get("target"),
            "what": f"kit {meta.get('name', '')}".strip()}


def check(meta: dict, kind: str, device: dict) -> GateResult:
    want, r = _expected(meta, kind), GateResult()
    built_for = f"{want['what']} was made for {want['target']} (SM {want['sm']}, " \
                f"JetPack {'/'.join(want['jetpack'])}, TensorRT {want['tensorrt']}, " \
                f"{want['backend']} {want['backend_version']})"
    board = f"this board is {device.get('target') or device.get('board') or 'an unknown Jetson'}"
    if device.get("sm") != want["sm"]:
        r.refusals.append(f"{built_for}; {board}, SM {device.get('sm')}: engines do not load across SMs. Use a kit "
                          f"planned for {device.get('target') or 'this board'} (add it to the recipe's targets).")
    if _minor(device.get("tensorrt")) != _minor(want["tensorrt"]):
        r.refusals.append(f"{built_for}; {board} has TensorRT {device.get('tensorrt')}: TensorRT rejects engines of "
                          f"another version. Flash JetPack {want['jetpack'][0]} or re-plan for this JetPack.")
    jp = device.get("jetpack")
    if jp not in want["jetpack"]:
        r.refusals.append(f"{built_for}; {board} runs JetPack {jp} (L4T {device.get('l4t')}). Flash JetPack "
                          f"{' or '.join(want['jetpack'])}, or re-plan the recipe for JetPack {jp}.")
    backend = backends.get(want["backend"])
    installed = device.get(backend.board_version)
    if _minor(installed) != _minor(want["backend_version"]):
        have = f"{backend.name} {installed}" if installed else f"no {backend.name} installed"
        r.refusals.append(f"{built_for}; {board} has {have}. Install "
                          f"{backend.install_hint.format(version=want['backend_version'])}.")
    if not r.refusals and want["target"] and device.get("target") and device["target"] != want["target"]:
        r.warnings.append(f"{want['what']} was made for {want['target']}; {board} (same SM {want['sm']}): the "
                          "engine loads, TensorRT warns about the device model; validate on each board model.")
    return r


def require(meta: dict, kind: str, device: dict) -> GateResult:
    r = check(meta, kind, device)
    if r.refusals:
        raise PipelineError("incompatible: " + " | ".join(r.refusals),
                            "nothing was built or loaded; see `python -m pipeline probe` for what this board is")
    return r


def build_memory_gate(plan: dict, device: dict) -> None:
    """Refuse to build where the plan says the build needs more memory than the board has (8 GB boards OOM or
    reboot); name the same-SM boards that can build it."""
    from pipeline.plan.targets import load_targets

    need = (plan.get("memory") or {}).get("build_peak")
    have = device.get("memory_available")
    if not need or not have or have >= need:
        return
    boards = [t.id for t in load_targets().values() if t.sm == plan["sm"] and t.usable_headless_bytes >= need]
    raise PipelineError(f"building this engine needs ~{need / 1e9:.1f} GB; this board has {have / 1e9:.1f} GB "
                        "available (8 GB boards run out of memory or reboot during large builds)",
                        f"build on a same-SM board with more memory ({', '.join(boards) or 'none known'}) and copy "
                        "the engine bundle here; or stop the desktop (sudo systemctl isolate multi-user.target)")
