"""What this Jetson is: L4T/JetPack, board, SM, CUDA/TensorRT/TensorRT-LLM/Edge-LLM, memory, power mode, bandwidth.

Everything is read from files, so `--root DIR` reads a directory laid out like a device's filesystem (the tests'
fixtures) exactly as it reads / on a device. Only the power mode falls back to running `nvpmodel -q` on a real
device whose nvpmodel status file is missing. Live bandwidth = 2 x EMC clock x bus width (the SKU's figure is
wrong on an Orin Nano in Super mode, and a power mode can lower the clock).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from pipeline import contract

# L4T release -> JetPack (NVIDIA's JetPack archive; jetson_stats' table)
L4T_TO_JETPACK = {"36.3.0": "6.0", "36.4.0": "6.1", "36.4.2": "6.1", "36.4.3": "6.2", "36.4.4": "6.2.1",
                  "36.4.7": "6.2.2", "38.2.0": "7.0", "38.2.1": "7.0", "38.4.0": "7.1"}
SOC_SM = {"tegra234": "8.7", "tegra264": "11.0"}      # Orin, Thor (sm_110 since CUDA 13)
EMC_RATE_FILES = ("sys/kernel/debug/bpmp/debug/clk/emc/rate", "sys/kernel/debug/clk/emc/clk_rate")
DPKG = {"l4t": "nvidia-l4t-core", "tensorrt": ("libnvinfer10", "tensorrt-libs", "tensorrt")}


def _read(root: Path, rel: str) -> str | None:
    try:
        return (root / rel).read_text(errors="replace")
    except (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError):
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


def _python_package(root: Path, name: str) -> str | None:
    """Version of an installed Python distribution, from its dist-info directory name."""
    for base in ("usr/local/lib", "usr/lib", "opt"):
        for info in sorted((root / base).glob(f"**/{name}-*.dist-info")) if (root / base).is_dir() else []:
            m = re.match(rf"{name}-([^-]+)\.dist-info", info.name)
            if m:
                return m.group(1)
    return None


def _power_mode(root: Path, real: bool) -> str | None:
    conf = _read(root, "etc/nvpmodel.conf") or ""
    names = dict(re.findall(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=(\S+?)\s*>", conf))
    status = _read(root, "var/lib/nvpmodel/status") or ""
    m = re.search(r"pmode:(\d+)", status)
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
    compatible = [c for c in (_read(root, "proc/device-tree/compatible") or "").split("\0") if c]
    soc = next((c.split(",", 1)[1] for c in compatible if c.split(",", 1)[-1] in SOC_SM), None)
    power_mode = _power_mode(root, real)
    target = match_target(compatible, power_mode)
    meminfo = dict(re.findall(r"^(\w+):\s+(\d+) kB", _read(root, "proc/meminfo") or "", re.M))
    cuda = json.loads(_read(root, "usr/local/cuda/version.json") or "{}").get("cuda", {}).get("version")
    trt = next((dpkg[p] for p in DPKG["tensorrt"] if p in dpkg), None)
    emc = next((int(t) for t in (_read(root, f) for f in EMC_RATE_FILES) if t and t.strip().isdigit()), None)
    bus = target.memory_bus_bits if target else None
    return contract.Board(
        l4t=l4t,
        # L4T 39 is JetPack 7.2's release line (targets.toml's 7.2 stacks); its point releases are not mapped yet
        jetpack=L4T_TO_JETPACK.get(l4t or "") or ("7.2" if l4t and l4t.startswith("39.") else None),
        board=(_read(root, "proc/device-tree/model") or "").strip("\0\n ") or None,
        compatible=compatible,
        soc=soc,
        sm=SOC_SM.get(soc or ""),
        target=target.id if target else None,
        cuda=cuda,
        tensorrt=trt.split("-")[0] if trt else None,
        tensorrt_llm=_python_package(root, "tensorrt_llm"),
        edgellm=_python_package(root, "tensorrt_edgellm"),
        memory_total=int(meminfo["MemTotal"]) * 1024 if "MemTotal" in meminfo else None,
        memory_available=int(meminfo["MemAvailable"]) * 1024 if "MemAvailable" in meminfo else None,
        swap_free=int(meminfo["SwapFree"]) * 1024 if "SwapFree" in meminfo else None,
        power_mode=power_mode,
        emc_hz=emc,
        bandwidth_gbs=round(2 * emc * bus / 8 / 1e9, 1) if emc and bus else None,
    ).to_dict()
