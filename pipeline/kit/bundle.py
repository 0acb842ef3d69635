"""Engine bundles: what a device build produces (engines, runtime config, validation report), packed like a kit.

TensorRT engines run only on the SM and TensorRT version they were built with, and TensorRT-LLM's own config
records neither, so the bundle's manifest does: `compat` holds exactly what another board must match to take the
bundle without rebuilding (same SM, TensorRT, JetPack release line and backend version).
"""

from __future__ import annotations

from pathlib import Path

from pipeline import backends, contract
from pipeline.errors import PipelineError
from pipeline.kit.archive import pack
from pipeline.kit.signing import SecretKey
from pipeline.kit.verify import VerifiedKit


def compat_of(kit: contract.KitManifest, board: contract.Board) -> contract.Compat:
    """What another board must match to load an engine built from `kit` on `board`."""
    backend = backends.get(kit.backend) if kit.backend else None
    facts = {"sm": board.sm, "tensorrt": board.tensorrt, "jetpack": board.jetpack,
             "backend": backend.name if backend else None,
             "backend_version": board.python_packages.get(backend.python_package) if backend else None}
    missing = [k for k, v in facts.items() if not v]
    if missing:
        raise PipelineError(f"cannot record the engine's compatibility: the device facts lack {', '.join(missing)}",
                            "run the build through `python -m pipeline device`, which probes the board first")
    return contract.Compat(**facts)  # type: ignore[arg-type]


def bundle_name(kit: contract.KitManifest, compat: contract.Compat) -> str:
    return f"{kit.name}-sm{compat.sm.replace('.', '')}-trt{compat.tensorrt}"


def _kit(kit: VerifiedKit) -> contract.KitManifest:
    if not isinstance(kit.manifest, contract.KitManifest):
        raise PipelineError(f"{kit.path} is an engine bundle, not a kit", "build from the kit the workstation made")
    return kit.manifest


def bundle_meta(kit: VerifiedKit, board: contract.Board) -> contract.BundleMeta:
    """Manifest fields of a bundle built from `kit` on `board`."""
    m = _kit(kit)
    return contract.BundleMeta(recipe=m.recipe, target=m.target, compat=compat_of(m, board), built_on=board,
                               kit=contract.KitRef(name=m.name, signed_by=kit.signed_by, created=m.created,
                                                   quant=m.quant, limits=m.limits))




def bundle_content(engine_dir: Path, kit_dir: Path, content: Path) -> Path:
    """The bundle's payload in `content` (fresh; hard links, no copies): the engine files, and under serving/ the
    kit's plan (limits), goldens (stop ids, the startup check of the tokenizer), tokenizer files, and the images and
    recordings its goldens name (images/, audio/: `install` validates the engine on the goldens from serving/, as
    `device` did from the kit)."""
    from pipeline.files import fresh_dir, link_or_copy

    fresh_dir(content)
    for f in sorted(Path(engine_dir).rglob("*")):
        if f.is_file() and not f.is_symlink():
            link_or_copy(f, content / f.relative_to(engine_dir))
    for name in (contract.PLAN, contract.GOLDENS):
        link_or_copy(Path(kit_dir) / name, content / contract.SERVING_DIR / name)
    for sub, pattern in ((contract.TOKENIZER_DIR, None), ("images", contract.IMAGE_FILE_RE),
                         ("audio", contract.RECORDING_FILE_RE)):
        where = Path(kit_dir) / sub
        for f in sorted(where.iterdir()) if where.is_dir() and not where.is_symlink() else []:
            if f.is_file() and not f.is_symlink() and (pattern is None or pattern.match(f"{sub}/{f.name}")):
                link_or_copy(f, content / contract.SERVING_DIR / sub / f.name)
    return content


def pack_bundle(engine_dir: Path, kit_dir: Path, out_root: Path, kit: VerifiedKit, board: contract.Board,
                key: SecretKey) -> VerifiedKit:
    """Pack a device build's engine, with what serving it needs from the unpacked kit, into out_root/<bundle name>/
    as a signed bundle (an earlier bundle of the same name, from an earlier run with the same --out, is replaced)."""
    import shutil

    name = bundle_name(_kit(kit), compat_of(_kit(kit), board))
    content = bundle_content(engine_dir, kit_dir, Path(engine_dir).parent / "bundle.content")
    try:
        return pack(content, Path(out_root) / name, name, "bundle", key, meta=bundle_meta(kit, board), replace=True)
    finally:
        shutil.rmtree(content, ignore_errors=True)
