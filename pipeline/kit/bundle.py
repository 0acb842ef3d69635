"""Engine bundles: what a device build produces (engines, runtime config, validation report), packed like a kit.

TensorRT engines run only on the SM and TensorRT version they were built with, and TensorRT-LLM's own config
records neither, so the bundle's manifest does: `compat` holds exactly what another board must match to take the
bundle without rebuilding (same SM, TensorRT, JetPack release line and backend version).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.kit.archive import pack
from pipeline.kit.signing import SecretKey

COMPAT_KEYS = ("sm", "tensorrt", "jetpack", "backend", "backend_version")


def bundle_name(kit_manifest: dict, device: dict) -> str:
    return f"{kit_manifest['name']}-sm{device['sm'].replace('.', '')}-trt{device['tensorrt']}"


def bundle_meta(kit_manifest: dict, device: dict) -> dict:
    """Manifest fields of a bundle built from `kit_manifest` on the device described by `device` (the probe)."""
    missing = [k for k in COMPAT_KEYS if not device.get(k)]
    if missing:
        raise PipelineError(f"cannot record the engine's compatibility: the device facts lack {', '.join(missing)}",
                            "run the build through `python -m pipeline device`, which probes the board first")
    return {"recipe": kit_manifest.get("recipe"), "target": kit_manifest.get("target"),
            "compat": {k: device[k] for k in COMPAT_KEYS},
            "built_on": {k: v for k, v in device.items() if k not in COMPAT_KEYS},
            "kit": {"name": kit_manifest["name"], "signed_by": kit_manifest.get("_signed_by"),
                    "quant": kit_manifest.get("quant"), "limits": kit_manifest.get("limits")}}


def pack_bundle(engine_dir: Path, out_root: Path, kit_manifest: dict, device: dict, key: SecretKey) -> dict:
    """Pack a device build's output directory into out_root/<bundle name>/ as a signed bundle."""
    name = bundle_name(kit_manifest, device)
    return pack(engine_dir, Path(out_root) / name, name, "bundle", key, meta=bundle_meta(kit_manifest, device))
