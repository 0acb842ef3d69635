"""Download a pinned revision of a Hugging Face repo: only the files a checkpoint needs, resumable, token from env.

huggingface_hub does the transfer (HF_ENDPOINT, HF_HUB_OFFLINE, HF_TOKEN, its cache). Resuming: a dropped connection
is retried from the byte where it stopped; files already complete stay in the cache, so a re-run after a kill or a
failure downloads only the files (shards) that were not finished (huggingface_hub >= 1.30 restarts an unfinished
file from its start after a kill: it downloads to a per-process temporary file).
this module pins the revision, records the resolved commit and turns hub failures into errors a user can act on.
The token is read by huggingface_hub from the environment and never passed through, logged or recorded here.
"""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.files import link_or_copy
from pipeline.workstation.fetch import NEEDED

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")      # a pinned revision: a commit hash, not a branch or tag


def _offline() -> bool:
    from pipeline.settings import hub_offline
    return hub_offline()


def fetch_hub(repo: str, revision: str, out: Path, allow_branch: bool = False, patterns: list[str] = NEEDED,
              table: str = "model") -> dict:
    import httpx
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub import errors as hf_errors

    where = f"{repo}@{revision}"
    try:
        if _offline():
            if not COMMIT_RE.fullmatch(revision):
                raise PipelineError(f"{where}: HF_HUB_OFFLINE is set, so branch {revision!r} cannot be resolved",
                                    f"pin {table}.revision to a commit hash, or unset HF_HUB_OFFLINE")
            commit = revision
        else:
            resolved = HfApi().model_info(repo, revision=revision).sha
            if resolved is None:
                raise PipelineError(f"{where}: the hub returned no commit for this revision",
                                    f"pin {table}.revision to a commit hash")
            commit = resolved
            if commit != revision and not allow_branch:
                raise PipelineError(f"{where}: revision resolves to commit {commit}, not to itself",
                                    f'pin {table}.revision = "{commit}" or set {table}.allow_branch = true')
        snapshot = Path(snapshot_download(repo, revision=commit, allow_patterns=patterns))
    except hf_errors.GatedRepoError:
        raise PipelineError(f"{where}: the repository is gated and this account has no access",
                            "accept the licence on the model page, then export HF_TOKEN=<a read token>") from None
    except hf_errors.RepositoryNotFoundError:
        raise PipelineError(f"{where}: repository not found (or private)",
                            f"check {table}.repo; for a private repo export HF_TOKEN=<a read token>") from None
    except hf_errors.RevisionNotFoundError:
        raise PipelineError(f"{where}: no such revision",
                            f"check {table}.revision against the repo's commits") from None
    except (hf_errors.LocalEntryNotFoundError, hf_errors.OfflineModeIsEnabled):
        raise PipelineError(f"{where}: not in the local Hugging Face cache and the hub is not reachable",
                            "fetch once with network access, copy the HF cache over, or use model.source = 'local'"
                            ) from None
    except (OSError, httpx.HTTPError) as exc:  # connection refused or dropped, DNS, TLS, disk
        raise PipelineError(f"{where}: download failed: {type(exc).__name__}: {exc}",
                            "check the network (or HF_ENDPOINT); a re-run resumes where this one stopped") from None

    for f in sorted(snapshot.iterdir()):
        link_or_copy(f.resolve(), out / f.name)  # the cache's snapshot entries are symlinks to content blobs
    return {"source": {"kind": "hf", "repo": repo, "revision": revision, "commit": commit}}


def fetch_config(repo: str, revision: str) -> dict:
    """Only config.json (a few KB), so that a plan can gate a model before its weights are downloaded."""
    import json

    from huggingface_hub import errors as hf_errors
    from huggingface_hub import hf_hub_download

    try:
        return json.loads(Path(hf_hub_download(repo, "config.json", revision=revision)).read_text())
    except (hf_errors.HfHubHTTPError, hf_errors.LocalEntryNotFoundError, OSError) as exc:
        raise PipelineError(f"{repo}@{revision}: cannot get config.json to plan with ({type(exc).__name__})",
                            "plan needs the model's config: go online once, or use model.source = 'local'") from None
