"""The builtin tiny models, made once per machine. Making one trains it (20 s to minutes on a CPU), and each project
that fetches it, each first run of the README's command in a fresh clone, would train the same bytes again.

An entry is keyed by everything that decides those bytes: the builtin's spec, the source of the modules that make it,
the training corpus, and the versions of torch, transformers and tokenizers. It is written whole into a private
directory and renamed into place, so a killed writer leaves none; before use, every file is checked against the
entry's manifest (names, sizes, SHA-256), and an entry that fails (damaged, truncated, planted with other files, a
link) is set aside and the model made again. Two processes that miss the same entry (two first builds at once, two
test workers) take turns on a lock beside it: the second finds the first's entry instead of training the same bytes
again. Set JETSON_PIPELINE_BUILTIN_CACHE=off to make each anew.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from pipeline import settings
from pipeline.errors import PipelineError
from pipeline.files import read_regular, remove_entry, sha256_file

MANIFEST = "cache-manifest.json"
MANIFEST_MAX = 1 * 2**20
ENTRY_MAX_BYTES = 2 * 2**30         # the builtins are a few MB; anything near this is not one of ours
# what materialize() runs for a builtin: a change to any of them makes other bytes, so it keys the entry. Every
# builtin's making runs COMMON (mtp.py: the MTP twin's layer); a builtin that is more than a decoder runs its kind's
# maker too (tinymodel.maker) and what that alone reads, so a change to one kind's maker remakes that kind only
COMMON = ("tinymodel.py", "tinytrain.py", "mtp.py")
MAKER_SOURCES = {"tinyvlm": ("tinyvlm.py", "tinyhub.py"), "tinyasr": ("tinyasr.py", "tinyvlm.py", "tinyhub.py"),
                 "tinytts": ("tinytts.py",), "tinytransducer": ("tinytransducer.py", "transducer_features.py"),
                 "tinygemma4audio": ("tinygemma4audio.py", "gemma4_features.py")}
TRAINED_BY = ("torch", "transformers", "tokenizers")     # distributions whose versions decide the trained bytes


def cache_root() -> Path | None:
    """JETSON_PIPELINE_BUILTIN_CACHE, else $XDG_CACHE_HOME (or ~/.cache)/jetson-pipeline/builtins; None when off."""
    value = settings.get("JETSON_PIPELINE_BUILTIN_CACHE")
    if value and value.strip().lower() in ("off", "0", "no", "false"):
        return None
    if value:
        return Path(value).expanduser()
    base = settings.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "jetson-pipeline" / "builtins"


def sources_of(name: str) -> tuple[str, ...]:
    """The workstation modules whose code makes builtin `name` (COMMON, and its kind's maker's where it has one)."""
    from pipeline.workstation.tinymodel import BUILTINS, maker
    spec = BUILTINS.get(name)
    if spec is None or not spec.extra:
        return COMMON
    return COMMON + MAKER_SOURCES[maker(name).__name__.rsplit(".", 1)[-1]]


def entry_key(name: str, spec: object) -> str:
    """What decides a builtin's bytes, hashed (spec: its Builtin or DraftBuiltin record)."""
    from importlib.metadata import version  # not the imports: a cache hit needs no torch

    here = Path(__file__).parent
    h = hashlib.sha256(json.dumps({"name": name, "spec": repr(spec), **{d: version(d) for d in TRAINED_BY}},
                                  sort_keys=True).encode())
    for source in sources_of(name):
        h.update((here / source).read_bytes())
    corpus = here.parent / "data" / "corpus"
    for f in sorted(corpus.iterdir()):
        h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()[:24]


def _verified(entry: Path) -> dict[str, str] | None:
    """The entry's files {name: sha256} if every one is a regular file its manifest names with its size and hash, and
    nothing else is there; else None."""
    try:
        if entry.is_symlink() or not entry.is_dir():
            return None
        manifest = json.loads(read_regular(entry / MANIFEST, MANIFEST_MAX))
        files = manifest["files"]
        if set(os.listdir(entry)) != {*files, MANIFEST}:
            return None
        for fname, want in files.items():
            path = entry / fname
            if path.is_symlink() or not path.is_file() or path.stat().st_size != want["size"] \
                    or sha256_file(path) != want["sha256"]:
                return None
        return {fname: want["sha256"] for fname, want in files.items()}
    except (OSError, PipelineError, ValueError, KeyError, TypeError):
        return None


def _store(root: Path, entry: Path, made: Path) -> None:
    """`made`'s files as a new entry (nothing under a name that is already there: another process made it first)."""
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=root))
    try:
        files: dict[str, dict] = {}
        for f in sorted(made.iterdir()):
            if f.is_symlink() or not f.is_file():
                return              # not the flat checkpoint directory materialize() writes: not cached
            shutil.copyfile(f, staging / f.name)
            files[f.name] = {"size": f.stat().st_size, "sha256": sha256_file(staging / f.name)}
        if sum(v["size"] for v in files.values()) > ENTRY_MAX_BYTES:
            return
        (staging / MANIFEST).write_text(json.dumps({"files": files}, indent=1, sort_keys=True))
        os.chmod(staging, 0o755)
        try:
            os.rename(staging, entry)       # fails where the entry exists: the first one made stays
        except OSError:
            return
    finally:
        remove_entry(staging)


@contextlib.contextmanager
def _making(root: Path, entry: Path, say: Callable[[str], None]) -> Iterator[None]:
    """Held while this process checks for and makes `entry`. The kernel drops a flock with its holder, so a killed
    maker leaves no stale lock; a lock that cannot be taken (the cache cannot be written, a link planted at its name)
    only means this process may make what another is making."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root / f".{entry.name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for another process making {entry.name} in {root}")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)         # releases the lock


def _copied(entry: Path, files: dict[str, str], out: Path) -> None:
    for fname, digest in files.items():
        shutil.copyfile(entry / fname, out / fname)
        if sha256_file(out / fname) != digest:      # changed between the check and the copy
            raise PipelineError(f"{entry / fname} changed while it was copied", f"remove {entry} and run again")


def made_once(name: str, spec: object, out: Path, make: Callable[[Path], None],
              say: Callable[[str], None] = lambda _: None) -> bool:
    """Builtin `name` in `out`: copied from its verified cache entry, or made by make(out) and stored. True when it
    came from the cache. A cache that cannot be read or written only costs the time to make the model."""
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise ValueError(f"{out} is not empty: the builtin's directory is what the cache keeps")
    root = cache_root()
    if root is None:
        make(out)
        return False
    entry = root / f"{name}-{entry_key(name, spec)}"
    files = _verified(entry) if os.path.lexists(entry) else None
    if files is not None:            # the common case needs no lock
        _copied(entry, files, out)
        return True
    with _making(root, entry, say):
        files = _verified(entry) if os.path.lexists(entry) else None     # made while this process waited
        if files is not None:
            _copied(entry, files, out)
            return True
        if os.path.lexists(entry):
            say(f"the cached {name} at {entry} does not match its manifest: making it again")
            with contextlib.suppress(OSError):       # not ours to remove: the new entry's rename then fails too
                remove_entry(entry)
        make(out)
        try:
            _store(root, entry, out)
        except OSError as exc:
            say(f"could not keep {name} in {root} ({exc.strerror or exc}); it will be made again next time")
    return False
