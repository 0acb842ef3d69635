"""The machine's cache of builtin tiny models: made once, then copied out only when every file matches its manifest."""

import json
import os

import pytest

from pipeline.workstation.builtin_cache import MANIFEST, cache_root, entry_key, made_once
from pipeline.workstation.tinymodel import BUILTINS


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("JETSON_PIPELINE_BUILTIN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def entries(root):
    """The cache's entries (its per-entry locks are dot files beside them)."""
    return [p for p in root.iterdir() if not p.name.startswith(".")]


def maker(calls):
    def make(out):
        calls.append(out)
        (out / "model.safetensors").write_bytes(b"weights" * 100)
        (out / "config.json").write_text('{"a": 1}')
    return make


def fetch(tmp_path, calls, run, said=None):
    out = tmp_path / f"out-{run}"
    out.mkdir()
    hit = made_once("tiny-llama", BUILTINS["tiny-llama"], out, maker(calls),
                    say=said.append if said is not None else print)
    return hit, {p.name: p.read_bytes() for p in out.iterdir()}


def test_a_builtin_is_made_once_then_copied_from_its_verified_entry(root, tmp_path):
    calls = []
    first = fetch(tmp_path, calls, 1)
    second = fetch(tmp_path, calls, 2)
    assert first[0] is False and second[0] is True and len(calls) == 1 and first[1] == second[1]
    (entry,) = entries(root)
    assert entry.name == f"tiny-llama-{entry_key('tiny-llama', BUILTINS['tiny-llama'])}"
    manifest = json.loads((entry / MANIFEST).read_text())["files"]
    assert manifest["config.json"]["size"] == 8 and set(manifest) == {"config.json", "model.safetensors"}


@pytest.mark.parametrize("damage", ["flipped byte", "truncated", "extra file", "missing file", "linked file",
                                   "entry is a link", "manifest garbage"])
def test_a_damaged_or_planted_entry_is_made_again(root, tmp_path, damage):
    calls = []
    fetch(tmp_path, calls, 1)
    (entry,) = entries(root)
    weights = entry / "model.safetensors"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("not ours")
    if damage == "flipped byte":
        data = bytearray(weights.read_bytes())
        data[3] ^= 1
        weights.write_bytes(bytes(data))
    elif damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:-1])
    elif damage == "extra file":
        (entry / "evil.py").write_text("import os")
    elif damage == "missing file":
        weights.unlink()
    elif damage == "linked file":
        (outside / "w").write_bytes(weights.read_bytes())
        weights.unlink()
        weights.symlink_to(outside / "w")
    elif damage == "entry is a link":
        os.rename(entry, outside / "moved")
        entry.symlink_to(outside / "moved")
    else:
        (entry / MANIFEST).write_text("{")
    said = []
    hit, files = fetch(tmp_path, calls, 2, said)
    assert hit is False and len(calls) == 2 and files["model.safetensors"] == b"weights" * 100
    assert said == [f"the cached tiny-llama at {entry} does not match its manifest: making it again"]
    assert (outside / "keep").read_text() == "not ours"      # a link was removed, not followed
    assert fetch(tmp_path, calls, 3)[0] is True and len(calls) == 2      # made whole again


def test_a_process_that_misses_while_another_makes_waits_and_copies_what_that_one_made(root, tmp_path):
    """Two cold builds at once (two test workers, two first runs) train the builtin once: the second takes its turn
    on the entry's lock, finds the first's verified entry and copies it. flock is per open file, so two threads
    contend as two processes do."""
    import threading

    started, release = threading.Event(), threading.Event()
    calls, said, results = [], [], {}

    def slow(out):
        started.set()
        assert release.wait(30)
        maker(calls)(out)

    def first():
        out = tmp_path / "first"
        out.mkdir()
        results["first"] = made_once("tiny-llama", BUILTINS["tiny-llama"], out, slow)

    a = threading.Thread(target=first)
    a.start()
    assert started.wait(30)
    b = threading.Thread(target=lambda: results.setdefault("second", fetch(tmp_path, calls, 2, said)))
    b.start()
    while not said and b.is_alive():
        b.join(0.01)
    (lock,) = [p for p in root.iterdir() if p.name.endswith(".lock")]
    assert said == [f"waiting for another process making {lock.name[1:-5]} in {root}"]
    release.set()
    a.join(30)
    b.join(30)
    assert results["first"] is False and results["second"][0] is True and len(calls) == 1
    assert results["second"][1]["config.json"] == b'{"a": 1}'


def test_a_link_planted_at_the_lock_is_not_followed(root, tmp_path):
    outside = tmp_path / "outside"
    outside.write_text("not ours")
    root.mkdir()
    key = entry_key("tiny-llama", BUILTINS["tiny-llama"])
    (root / f".tiny-llama-{key}.lock").symlink_to(outside)
    calls = []
    assert fetch(tmp_path, calls, 1)[0] is False and fetch(tmp_path, calls, 2)[0] is True and len(calls) == 1
    assert outside.read_text() == "not ours"


def test_off_makes_each_anew_and_the_key_follows_the_spec(tmp_path, monkeypatch):
    import dataclasses

    monkeypatch.setenv("JETSON_PIPELINE_BUILTIN_CACHE", "off")
    assert cache_root() is None
    calls = []
    assert fetch(tmp_path, calls, 1)[0] is False and fetch(tmp_path, calls, 2)[0] is False and len(calls) == 2
    spec = BUILTINS["tiny-llama"]
    assert entry_key("tiny-llama", spec) != entry_key("tiny-llama", dataclasses.replace(spec, seed=spec.seed + 1))
    monkeypatch.delenv("JETSON_PIPELINE_BUILTIN_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "jetson-pipeline" / "builtins"


def test_an_unwritable_cache_only_costs_the_time_to_make(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("JETSON_PIPELINE_BUILTIN_CACHE", str(blocker / "cache"))     # under a file: cannot exist
    calls, said = [], []
    hit, files = fetch(tmp_path, calls, 1, said)
    assert hit is False and files["config.json"] == b'{"a": 1}' and len(calls) == 1
    assert said and said[0].startswith(f"could not keep tiny-llama in {blocker / 'cache'}")


def test_a_builtin_is_keyed_by_the_makers_that_make_it_and_no_other():
    """A change to one kind's maker remakes that kind only: each builtin's key covers the common makers and its own
    kind's, and every maker module one of those imports (a maker module it reads but the key left out would let a
    stale entry stand)."""
    import re
    from pathlib import Path

    from pipeline.workstation.builtin_cache import COMMON, MAKER_SOURCES, sources_of
    here = Path(__file__).resolve().parents[2] / "pipeline" / "workstation"
    kinds = {m + ".py" for m in MAKER_SOURCES}        # tinymodel.py reads their tables, not their makers
    makers = {p.name for p in here.glob("tiny*.py")} | {"mtp.py", "transducer_features.py", "gemma4_features.py"}
    assert sources_of("tiny-llama") == COMMON and "tinyvlm.py" not in sources_of("tiny-llama")
    assert set(sources_of("tiny-gemma4-audio")) - set(COMMON) == {"tinygemma4audio.py", "gemma4_features.py"}
    for name in BUILTINS:
        keyed = set(sources_of(name))
        for source in keyed:
            read = {m + ".py" for m in re.findall(r"pipeline\.workstation\.(\w+)", (here / source).read_text())}
            missing = (read & makers) - keyed - (kinds if source == "tinymodel.py" else set())
            assert not missing, (name, source, missing)
