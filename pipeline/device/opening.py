"""Opening a signed kit or engine bundle on a board, the one way `device`, `install` and `serve` all do it:

    verified = open_verified(path, trusted, root, want=...)   signature by a trusted key and the manifest (the parts
                                                               are hashed while they are unpacked), the kind of
                                                               artifact the command takes, and a board that is a Jetson
    unpack_verified(verified, dest, trusted, ...)              into `dest` only, a link or file planted there removed,
                                                               never through it
    serving_records(verified, dest)                            a bundle's serving/ plan and goldens

Each command then gates the artifact against the board its own way (building from a kit warns where a board differs;
installing a bundle needs the same board; serving gates as building does).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline import contract
from pipeline.errors import PipelineError
from pipeline.kit.signing import PublicKey
from pipeline.kit.verify import VerifiedKit


@dataclass(frozen=True)
class Opened:
    """A kit or bundle verified in this run, and the board it is on."""
    verified: VerifiedKit
    board: contract.Board

    @property
    def manifest(self) -> contract.Manifest:
        return self.verified.manifest


# what each command takes, and what to tell a user who passed the other kind
_WRONG_KIND = {
    contract.KitManifest: ("is an engine bundle, not a kit: `device` builds engines from kits",
                           "pass the kit the workstation made (a bundle's engine is already built)"),
    contract.BundleManifest: ("is a kit, not an engine bundle: a kit's engine is built on the board",
                              "run `python -m pipeline device KIT` first; it writes the bundle to --out"),
}


def open_verified(path: Path, trusted: list[PublicKey], root: str, want: type,
                  say: Callable[[str], None] = print) -> Opened:
    """`path` verified (signature by one of `trusted`, its manifest; part hashes are checked while unpacking), of the
    kind `want` (contract.KitManifest or contract.BundleManifest), on a board that is a Jetson."""
    from pipeline.device.probe import probe
    from pipeline.kit.verify import check_kit

    verified = check_kit(path, trusted, hash_parts=False)      # every part is hashed while it is unpacked
    if not isinstance(verified.manifest, want):
        what, hint = _WRONG_KIND[want]
        raise PipelineError(f"{path} {what}", hint)
    kind = "kit" if want is contract.KitManifest else "bundle"
    say(f"{kind} {verified.name} (signed {verified.created} by {verified.signed_by}): signature and manifest OK")
    board = contract.Board.from_dict(probe(root), "probe")
    if not board.is_jetson:
        raise PipelineError(f"this is not a Jetson ({Path(root) / 'proc/device-tree/compatible'} names no Orin or "
                            "Thor SoC): engines run on a board of the kit's SM",
                            "run this on the Jetson, or pass --root DIR holding a recorded board's files")
    return Opened(verified, board)


def unpack_verified(opened: Opened, dest: Path, trusted: list[PublicKey], allow_downgrade: bool = False,
                    record: bool = True) -> Path:
    """The artifact verified in this run extracted into `dest` (a link or a file planted at `dest` is removed, never
    followed; an earlier unpack of the same kit is replaced)."""
    from pipeline.files import remove_entry
    from pipeline.kit.unpack import unpack

    dest = Path(dest).absolute()
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        remove_entry(dest)
    unpack(opened.verified.path, dest, trusted, allow_downgrade=allow_downgrade, verified=opened.verified,
           record=record)
    return dest


def serving_records(opened: Opened, dest: Path) -> tuple[contract.Plan, contract.Goldens, Path]:
    """A bundle's serving/ part unpacked at `dest`: its plan, goldens and the directory (tokenizer files beside)."""
    serving = dest / contract.SERVING_DIR
    if not (serving / contract.PLAN).is_file():
        raise PipelineError(f"{opened.verified.path}: the bundle carries no {contract.SERVING_DIR}/ (plan, goldens, "
                            "tokenizer): it was made by an older version of the pipeline",
                            "rebuild it with `python -m pipeline device`")
    return contract.Plan.load(serving / contract.PLAN), contract.Goldens.load(serving / contract.GOLDENS), serving
