"""Compatibility gate: may this board build this kit, or load this engine bundle?

A TensorRT engine loads only on the SM and the exact TensorRT it was built with, and the engine's own config records
neither (FACTS.md): the kit's plan and the bundle's manifest do, and the probe says what this board is. Wrong SM,
TensorRT, JetPack or backend version refuse, saying what was built for what and what to do; the same SM on another
board model only warns (TensorRT warns too; validate on each board model).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline import backends, contract
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


@dataclass(frozen=True)
class Requirement:
    """What a kit's plan (its stack) or a bundle's compat record requires of the board."""
    what: str
    target: str | None
    sm: str
    tensorrt: str
    jetpack: list[str]
    backend: str
    backend_version: str
    stack: contract.Stack | None = None     # a kit's: which TensorRT goes with which JetPack




def requirement(m: contract.Manifest) -> Requirement:
    if isinstance(m, contract.BundleManifest):
        c = m.compat
        return Requirement(f"bundle {m.name}", m.built_on.target or m.target, c.sm, c.tensorrt, [c.jetpack],
                           c.backend, c.backend_version)
    if m.stack is None or m.sm is None or m.backend is None:
        raise PipelineError(f"{m.kind} {m.name}: its manifest names no SM, backend or software stack",
                            "re-package it with this version of the pipeline")
    s = m.stack
    return Requirement(f"kit {m.name}", m.target, m.sm, s.tensorrt, list(s.jetpack), m.backend, s.backend_version,
                       s)


def check(m: contract.Manifest, board: contract.Board) -> GateResult:
    want, r = requirement(m), GateResult()
    combos = want.stack.combinations() if want.stack else f"JetPack {'/'.join(want.jetpack)}, TensorRT {want.tensorrt}"
    built_for = f"{want.what} was made for {want.target} (SM {want.sm}, {combos}, " \
                f"{want.backend} {want.backend_version})"
    tensorrt = want.stack.tensorrt_for(board.jetpack) if want.stack else want.tensorrt
    here = f"this board is {board.name}"
    if board.sm != want.sm:
        r.refusals.append(f"{built_for}; {here}, SM {board.sm}: engines do not load across SMs. Use a kit "
                          f"planned for {board.target or 'this board'} (add it to the recipe's targets).")
    if _minor(board.tensorrt) != _minor(tensorrt):
        r.refusals.append(f"{built_for}; {here} has TensorRT {board.tensorrt} on JetPack {board.jetpack}: "
                          f"{want.backend} {want.backend_version} is supported with {combos} only. Install the "
                          f"TensorRT of this JetPack ({tensorrt}), or flash a listed JetPack.")
    if board.jetpack not in want.jetpack:
        r.refusals.append(f"{built_for}; {here} runs JetPack {board.jetpack} (L4T {board.l4t}). Flash JetPack "
                          f"{' or '.join(want.jetpack)}, or re-plan the recipe for JetPack {board.jetpack}.")
    backend = backends.get(want.backend)
    installed = board.python_packages.get(backend.python_package)
    if _minor(installed) != _minor(want.backend_version):
        have = f"{backend.name} {installed}" if installed else f"no {backend.name} installed"
        r.refusals.append(f"{built_for}; {here} has {have}. Install "
                          f"{backend.install_hint.format(version=want.backend_version)}.")
    if not r.refusals and want.target and board.target and board.target != want.target:
        r.warnings.append(f"{want.what} was made for {want.target}; {here} (same SM {want.sm}): the "
                          "engine loads, TensorRT warns about the device model; validate on each board model.")
    return r


def require(m: contract.Manifest, board: contract.Board) -> GateResult:
    r = check(m, board)
    if r.refusals:
        raise PipelineError("incompatible: " + " | ".join(r.refusals),
                            "nothing was built or loaded; see `python -m pipeline probe` for what this board is")
    return r


def build_memory_gate(plan: contract.Plan, board: contract.Board, root: str = "/") -> str | None:
    """Build only where this board's free memory and swap (now, from /proc/meminfo) cover the plan's build peak:
    the GPU-pinned part must fit in available RAM, the rest may page out to swap. 8 GB boards that start a build
    they cannot finish run out of memory or reboot. Returns a line to say when the build will page (slower), or
    refuses with the commands that would make it fit."""
    from pipeline.plan.buildmem import GB, HEADLESS, SWAP_MARGIN, swap_commands
    from pipeline.plan.targets import load_targets

    m = plan.memory
    peak, pinned = (m.build_peak, m.build_device) if m else (0, 0)
    have, swap = board.memory_available, board.swap_free or 0
    if not peak:
        return None
    if have is None:        # never "enough memory" by default: an unreadable meminfo is not a free board
        from pathlib import Path
        raise PipelineError(f"cannot tell how much memory this board has free: {Path(root) / 'proc/meminfo'} has "
                            "no readable MemAvailable line", "check /proc/meminfo (a Jetson's kernel writes it), or "
                            "pass --force to build without the memory check")
    if pinned <= have and peak <= have + swap:
        return None if peak <= have else (f"the build needs {peak / GB:.1f} GB; {have / GB:.1f} GB RAM available + "
                                          f"{swap / GB:.1f} GB swap: it will page out and take longer")
    boards = [t.id for t in load_targets().values() if t.sm == plan.sm and t.usable_headless_bytes >= peak]
    where = f"build on a same-SM board with more memory ({', '.join(boards) or 'none known'}) and copy the engine " \
            "bundle here"
    if pinned > have:
        raise PipelineError(f"building this engine pins ~{pinned / GB:.1f} GB on the GPU side (of ~{peak / GB:.1f} "
                            f"GB in all); this board has {have / GB:.1f} GB available now",
                            f"free memory: {HEADLESS.split('#')[0].strip()}, stop other processes, then run again; "
                            f"or {where}")
    need = peak - have - swap + SWAP_MARGIN
    commands = "; ".join(c.split("#")[0].strip() for c in (HEADLESS, *swap_commands(need)))
    raise PipelineError(f"building this engine needs ~{peak / GB:.1f} GB (GPU-pinned {pinned / GB:.1f} GB, pageable "
                        f"{(peak - pinned) / GB:.1f} GB); this board has {have / GB:.1f} GB RAM available and "
                        f"{swap / GB:.1f} GB swap free: short by {(peak - have - swap) / GB:.1f} GB",
                        f"add swap on NVMe for the pageable part: {commands}; then run this again (or {where})")
