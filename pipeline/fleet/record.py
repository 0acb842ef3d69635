"""The rollout record (--work/rollout.json): per board its old and new bundle, each gate's figures, the decision and
its reason, written atomically after every step, so a controller killed at any moment resumes where it was (a
board's step that may have half-happened is asked of the board again, never assumed). One rollout per work
directory at a time (a lock held while it runs); a new rollout there keeps the finished one's record as
rollout-<time>.json.

A board's state: pending -> installed (the swap happened, the previous install kept) -> committed | rolled-back |
failed (nothing to roll back to, or the rollback itself failed); skipped (the rollout aborted before its phase).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pipeline.errors import PipelineError

RECORD = "rollout.json"
FORMAT = "jetson-rollout/1"
MAX_BYTES = 16 << 20
FINAL = ("committed", "rolled-back", "failed", "skipped")


@dataclass
class BoardRecord:
    name: str
    phase: int
    state: str = "pending"
    old: str | None = None          # the install the board had: "NAME (signed CREATED)", None: none
    new: str | None = None          # the bundle rolled out, once installed
    old_digest: str | None = None   # their signed manifests' digests ("sha256:..."; a set's joined by " + ")
    new_digest: str | None = None
    failure: str | None = None      # its failure type (phases.FAILURES), where it failed
    reason: str = ""                # the decision, said
    gate: dict = field(default_factory=dict)    # the gate's figures: seconds to up, agreement, memory taken, ...
    started: str | None = None      # when the controller took the board up, and when it was decided (UTC)
    decided_at: str | None = None

    @property
    def decided(self) -> bool:
        return self.state in FINAL and self.state != "skipped"


@dataclass
class RolloutRecord:
    bundle: str                     # the bundle's name and signing time (a set's: each, joined by " + ")
    bundle_path: str                # where the controller read it (`rollout continue` reads it there again)
    inventory: str                  # the inventory file and group: "PATH#GROUP"
    plan: dict                      # phases.RolloutPlan as given
    boards: list[BoardRecord]
    phase: int = 0                  # the phase running (or next)
    state: str = "running"          # running | waiting | aborted | done
    reason: str = ""
    format: str = FORMAT
    bundle_paths: list[str] = field(default_factory=list)   # a set's bundles, each where the controller read it

    @property
    def paths(self) -> list[str]:
        return self.bundle_paths or [self.bundle_path]

    def board(self, name: str) -> BoardRecord:
        return next(b for b in self.boards if b.name == name)

    def save(self, work: Path) -> None:
        from pipeline.files import write_atomic
        write_atomic(work / RECORD, json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, work: Path) -> RolloutRecord | None:
        from pipeline.files import read_regular
        path = work / RECORD
        if not path.exists():
            return None
        try:
            data = json.loads(read_regular(path, MAX_BYTES))
            if data.get("format") != FORMAT:
                raise ValueError(f"format {str(data.get('format'))[:40]!r}")
            boards = [BoardRecord(**b) for b in data.pop("boards")]
            return cls(boards=boards, **data)
        except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError, RecursionError) as exc:
            raise PipelineError(f"{path}: not a rollout record this version wrote ({str(exc)[:80]})",
                                "move it away to start a new rollout (it is the only record of the last one)") from None

    def failures(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for b in self.boards:
            if b.failure:
                out[b.failure] = out.get(b.failure, 0) + 1
        return out

    def decided(self) -> int:
        return sum(1 for b in self.boards if b.decided)
