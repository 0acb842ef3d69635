"""What a rollout brings to each board: one engine bundle, or a board's set of them (installed together,
`install B1 B2`), each verified on the controller before any board is touched."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline import contract
from pipeline.errors import PipelineError


@dataclass(frozen=True)
class Bundle:
    """One bundle rolled out, verified here: its name, signing time, the served model's name, goldens and plan."""
    path: Path
    name: str
    created: str
    model: str              # the name the served model answers to (its kit's: RECIPE@TARGET)
    goldens: contract.Goldens
    plan: contract.Plan
    manifest_sha256: str    # its signed manifest's digest: what the board's install record names

    @property
    def label(self) -> str:
        return f"{self.name} (signed {self.created})"


@dataclass(frozen=True)
class Release:
    """The bundles a board runs after the rollout: one, or a set."""
    bundles: tuple[Bundle, ...]

    @property
    def label(self) -> str:
        return " + ".join(b.label for b in self.bundles)

    @property
    def digest(self) -> str:
        return " + ".join(f"sha256:{b.manifest_sha256}" for b in self.bundles)

    @property
    def paths(self) -> list[Path]:
        return [b.path for b in self.bundles]

    def matches(self, members: tuple[dict, ...]) -> bool:
        """Whether a board's install (install_history.Held.members) is exactly this release."""
        return [(m.get("name"), m.get("created")) for m in members] == [(b.name, b.created) for b in self.bundles]

    @property
    def planned_memory(self) -> int | None:
        """The memory the plans give the models together; None where a plan has none."""
        totals = [b.plan.memory.total if b.plan.memory else None for b in self.bundles]
        return sum(t for t in totals if t) if all(totals) else None


def open_bundle(path: Path, work: Path, pubkey: str | None) -> Bundle:
    from pipeline.files import remove_entry
    from pipeline.kit.signing import required_trusted_keys
    from pipeline.kit.unpack import unpack
    trusted = required_trusted_keys(pubkey)
    remove_entry(work)
    verified = unpack(path, work, trusted, record=False)
    if not isinstance(verified.manifest, contract.BundleManifest):
        raise PipelineError(f"{path}: a {verified.manifest.kind}, not an engine bundle",
                            "roll out the bundle `device` made from the kit")
    serving = work / "serving"
    return Bundle(path.absolute(), verified.name, verified.created, verified.manifest.kit.name,
                  contract.Goldens.load(serving / contract.GOLDENS), contract.Plan.load(serving / contract.PLAN),
                  verified.manifest_sha256)


def open_release(paths: list[Path], work: Path, pubkey: str | None) -> Release:
    """Each bundle verified and read in work/bundle-check/N; a set names each kit once."""
    bundles = tuple(open_bundle(p, work / "bundle-check" / str(i), pubkey) for i, p in enumerate(paths))
    models = [b.model for b in bundles]
    twice = sorted({m for m in models if models.count(m) > 1})
    if twice:
        raise PipelineError(f"the set holds {', '.join(twice)} more than once", "give each kit's bundle once")
    return Release(bundles)
