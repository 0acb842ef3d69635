"""What this Jetson is: L4T/JetPack, board, SM, CUDA/TensorRT/TensorRT-LLM/Edge-LLM, memory, power mode, bandwidth.

Everything is read from files, so `--root DIR` reads a directory laid out like a device's filesystem (the tests'
fixtures) exactly as it reads / on a device. Only the power mode falls back to running `nvpmodel -q` on a real
device whose nvpmodel status file is missing. Live bandwidth = 2 x EMC clock x bus width (the SKU's figure is
wrong on an Orin Nano in Super mode, and a power mode can lower the clock).

Every file is read bounded and only if it is a regular file (a link to one is followed: /etc/nvpmodel.conf is one on
JetPack), so a FIFO, /dev/zero or a huge file in its place is "could not be read", never a hang; every number is
parsed strictly and kept only within physical bounds; what cannot be read is None, and whoever needs it (the memory
gate) refuses rather than guess.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from pipeline import backends, contract

# L4T release -> JetPack (NVIDIA's JetPack archive; jetson_stats' table)
L4T_TO_JETPACK = {"36.3.0": "6.0", "36.4.0": "6.1", "36.4.2": "6.1", "36.4.3": "6.2", "36.4.4": "6.2.1",
                  "36.4.7": "6.2.2", "38.2.0": "7.0", "38.2.1": "7.0", "38.4.0": "7.1"}
SOC_SM = {"tegra234": "8.7", "tegra264": "11.0"}      # Orin, Thor (sm_110 since CUDA 13)
EMC_RATE_FILES = ("sys/kernel/debug/bpmp/debug/clk/emc/rate", "sys/kernel/debug/clk/emc/clk_rate")
DPKG = {"l4t": "nvidia-l4t-core", "tensorrt": ("libnvinfer10", "tensorrt-libs", "tensorrt")}


READ_MAX = {"var/lib/dpkg/status": 64 * 2**20}     # dpkg's database is a few MB; every other file a few KB
READ_MAX_DEFAULT = 1 * 2**20
MAX_BYTES = 2**50                                  # a meminfo figure past a petabyte is no Jetson's
MAX_EMC_HZ = 10**10


def _read(root: Path, rel: str) -> str | None:
    from pipeline.errors import PipelineError
    from pipeline.files import read_regular
    try:
        return read_regular(root / rel, READ_MAX.get(rel, READ_MAX_DEFAULT), follow=True).decode("utf-8", "replace")
    except (PipelineError, OSError):
        return None


def _printable(text: str, limit: int = 128) -> str | None:
    """A name read from the board (its model, a compatible string) as the report shows it: printable and short, or
    unknown."""
    text = text.strip("\0\n ")
    return text if text and len(text) <= limit and text.isprintable() else None


def meminfo(root: Path) -> dict[str, int]:
    """The kB figures of <root>/proc/meminfo, in bytes: a line that is not `Name:  <digits> kB` within bounds is
    left out (so a missing, negative or odd MemAvailable is unknown, not enough)."""
    out = {}
    for name, value in re.findall(r"^(\w+):[ \t]+(\d{1,16}) kB[ \t]*$", _read(root, "proc/meminfo") or "", re.M):
        if int(value) * 1024 <= MAX_BYTES:
            out[name] = int(value) * 1024
    # more available than there is: not a kernel's figure, so not one to build on
    for part, whole in (("MemAvailable", "MemTotal"), ("SwapFree", "SwapTotal")):
        if part in out and out[part] > out.get(whole, MAX_BYTES if whole == "SwapTotal" else -1):
            del out[part]
    return out


def _cuda_version(root: Path) -> str | None:
    try:
        info = json.loads(_read(root, "usr/local/cuda/version.json") or "{}")
    except (ValueError, RecursionError):
        return None
    version = info.get("cuda", {}).get("version") if isinstance(info, dict) and isinstance(info.get("cuda"), dict) \
        else None
    return version if isinstance(version, str) and re.fullmatch(r"\d{1,3}(\.\d{1,4}){0,3}", version) else None


def _emc_hz(root: Path) -> int | None:
    for f in EMC_RATE_FILES:
        text = (_read(root, f) or "").strip()
        if text.isascii() and text.isdigit() and 0 < int(text) <= MAX_EMC_HZ:
            return int(text)
    return None


def _dpkg_versions(root: Path) -> dict[str, str]:
    text = _read(root, "var/lib/dpkg/status") or ""
    out = {}
    for block in text.split("\n\n"):
        name = re.search(r"^Package: (\S+)", block, re.M)
        ver = re.search(r"^Version: (\S+)", block, re.M)
        if name and ver and re.search(r"^Status: .*installed", block, re.M):
            out[name.group(1)] = ver.group(1)
    return out


def l4t_release(root: Path, dpkg: dict) -> str | None:
    """'# R36 (release), REVISION: 4.3, ...' -> '36.4.3'; else the nvidia-l4t-core package version."""
    text = _read(root, "etc/nv_tegra_release")
    if text:
        m = re.search(r"R(\d+) \(release\), REVISION: (\d+)\.(\d+)", text)
        if m:
            return f"{m.group(1)}.{m.group(2)}.{m.group(3)}"
    ver = dpkg.get(DPKG["l4t"])
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", ver or "")
    return ".".join(m.groups()) if m else None


PACKAGE_DEPTH = 6      # <base>/python3.10/dist-packages/X.dist-info, or a venv under /opt: a few levels down


def _python_package(root: Path, name: str) -> str | None:
    """Version of an installed Python distribution, from its dist-info directory name (a bounded walk that follows
    no links: a link loop under /opt is not an endless search)."""
    import os
    for base in ("usr/local/lib", "usr/lib", "opt"):
        top = root / base
        for dirpath, dirnames, _ in os.walk(top, followlinks=False):
            depth = len(Path(dirpath).relative_to(top).parts)
            found = sorted(d for d in dirnames if re.fullmatch(rf"{name}-[^-/]+\.dist-info", d))
            if found:
                return found[0][len(name) + 1:-len(".dist-info")]
            if depth >= PACKAGE_DEPTH:
                dirnames[:] = []
            else:
                dirnames.sort()
    return None


def _power_mode(root: Path, real: bool) -> str | None:
    conf = _read(root, "etc/nvpmodel.conf") or ""
    names = dict(re.findall(r"<\s*POWER_MODEL\s+ID=(\d{1,4})\s+NAME=(\S{1,64}?)\s*>", conf))
    status = _read(root, "var/lib/nvpmodel/status") or ""
    m = re.search(r"pmode:(\d{1,4})", status)
    if m:
        return names.get(str(int(m.group(1))), f"mode {int(m.group(1))}")
    if real:
        try:
            out = subprocess.run(["nvpmodel", "-q"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            return None
        m = re.search(r"NV Power Mode:\s*(\S+)", out)
        return m.group(1) if m else None
    return None


def match_target(compatible: list[str], power_mode: str | None):
    """The targets.toml profile for this module (part number from the device tree's compatible list)."""
    from pipeline.plan.targets import load_targets

    parts = {c.split(",", 1)[1] for c in compatible if "," in c}
    parts |= {p.split("+")[-1] for p in parts}
    found = [t for t in load_targets().values()
             if parts & {m.strip() for m in t.module.split("/")}]
    if len(found) > 1:      # one module, two profiles (Orin Nano 8GB plain / Super): the power mode decides
        sup = [t for t in found if "super" in t.id]
        found = sup if power_mode and "SUPER" in power_mode.upper() else [t for t in found if t not in sup]
    return found[0] if found else None


def probe(root: str | Path = "/") -> dict:
    root = Path(root)
    real = root == Path("/")
    dpkg = _dpkg_versions(root)
    l4t = l4t_release(root, dpkg)
    compatible = [c for c in map(_printable, (_read(root, "proc/device-tree/compatible") or "").split("\0")) if c][:16]
    soc = next((c.split(",", 1)[1] for c in compatible if c.split(",", 1)[-1] in SOC_SM), None)
    power_mode = _power_mode(root, real)
    target = match_target(compatible, power_mode)
    mem = meminfo(root)
    cuda = _cuda_version(root)
    trt = next((dpkg[p] for p in DPKG["tensorrt"] if p in dpkg), None)
    emc = _emc_hz(root)
    bus = target.memory_bus_bits if target else None
    return contract.Board(
        l4t=l4t,
        # L4T 39 is JetPack 7.2's release line (targets.toml's 7.2 stacks); its point releases are not mapped yet
        jetpack=L4T_TO_JETPACK.get(l4t or "") or ("7.2" if l4t and l4t.startswith("39.") else None),
        board=_printable(_read(root, "proc/device-tree/model") or ""),
        compatible=compatible,
        soc=soc,
        sm=SOC_SM.get(soc or ""),
        target=target.id if target else None,
        cuda=cuda,
        tensorrt=trt.split("-")[0] if trt else None,
        python_packages={b.python_package: v for b in backends.REGISTRY.values()
                         if (v := _python_package(root, b.python_package)) is not None},
        memory_total=mem.get("MemTotal"),
        memory_available=mem.get("MemAvailable"),
        swap_free=mem.get("SwapFree"),
        power_mode=power_mode,
        emc_hz=emc,
        bandwidth_gbs=round(2 * emc * bus / 8 / 1e9, 1) if emc and bus else None,
    ).to_dict()
