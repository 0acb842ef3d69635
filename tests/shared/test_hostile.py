"""Hostile and unlucky input to the kit commands: `verify`, `unpack`, `transfer`, `trust` (the device half's own
cases are in test_device.py, which needs the build doubles).

Every case runs the real command line (`pipeline.cli.main`, in-process for speed, under a 20 s alarm so a hang
fails instead of stalling CI) and asserts: the exit code, the one `error:` line and its hint, no traceback, nothing
changed outside the destination and nothing already in the destination lost. Kits are damaged the ways a USB stick,
a restored backup or an attacker damage them; "forged" kits are validly signed by the trusted key (a compromised
packer or a stolen key), so they test what the verifier and unpacker check beyond the signature.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import io
import json
import os
import signal
import stat
import tarfile
from pathlib import Path

import pytest
from conftest import refused, run, snapshot

from pipeline.kit.archive import pack
from pipeline.kit.signing import SecretKey


# ------------------------------------------------------------------------------------------------------- harness
@pytest.fixture
def world(tmp_path, monkeypatch):
    """A trusted key, a 3-part kit `demo` in tmp/kits, an empty stick; JETSON_PIPELINE_HOME in tmp/home."""
    home = tmp_path / "home"
    monkeypatch.setenv("JETSON_PIPELINE_HOME", str(home))
    monkeypatch.delenv("JETSON_PIPELINE_SIGNING_KEY", raising=False)
    key = SecretKey.generate()
    (home / "trusted").mkdir(parents=True)
    (home / "trusted" / f"{key.public.id_hex}.pub").write_text(key.public.dump())
    src = tmp_path / "src"
    (src / "engine").mkdir(parents=True)
    (src / "engine" / "rank0.safetensors").write_bytes(os.urandom(250_000))
    (src / "plan.json").write_text('{"a": 1}')
    pack(src, tmp_path / "kits" / "demo", "demo", "kit", key, part_size=100_000)
    (tmp_path / "outside.txt").write_text("precious")
    return tmp_path, key


def unpacked(capsys, root: Path, dest: Path, *flags: str) -> None:
    """`unpack` of the world's kit into dest succeeds and dest holds the kit's payload."""
    rc, _, err = run(capsys, "unpack", root / "kits" / "demo", dest, *flags)
    assert rc == 0, err
    assert (dest / "plan.json").read_text() == '{"a": 1}'


def flip(path: Path, at: int = 500) -> None:
    st = os.stat(path)
    with open(path, "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 1]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))     # size and mtime kept: bit rot, a restored copy


def forge(root: Path, key: SecretKey, payload: bytes | None = None, *, members=None, files=None, name="demo",
          comment_name=None, manifest_edit=None, raw_manifest: bytes | None = None, compression="none") -> Path:
    """A kit validly signed by `key` whose payload, manifest or comment is whatever the attacker wants."""
    kit = root / "forged" / name
    kit.mkdir(parents=True)
    if payload is None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
            for ti, data in members:
                tar.addfile(ti, io.BytesIO(data) if ti.isreg() and data else None)
        payload = buf.getvalue()
    base = f"{name}.tar" + (".zst" if compression != "none" else "")
    (kit / f"{base}.000").write_bytes(payload)
    if files is None:
        files = [{"path": ti.name, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for ti, d in members]
    m = {"format": "jetson-kit-manifest/1", "kind": "kit", "name": name, "created": "2026-11-23T00:00:00Z",
         "compression": compression, "part_size": max(1, len(payload)),
         "parts": [{"name": f"{base}.000", "size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}],
         "files": files, "total_size": sum(f["size"] for f in files)}
    if manifest_edit:
        manifest_edit(m)
    (kit / "MANIFEST.json").write_bytes(raw_manifest if raw_manifest is not None else json.dumps(m).encode())
    sums = f"{hashlib.sha256((kit / 'MANIFEST.json').read_bytes()).hexdigest()}  MANIFEST.json\n" \
           f"{hashlib.sha256(payload).hexdigest()}  {base}.000\n"
    (kit / "SHA256SUMS").write_text(sums)
    (kit / "SHA256SUMS.minisig").write_text(key.sign_file(
        kit / "SHA256SUMS", f"timestamp:0\tfile:SHA256SUMS\tkit:{comment_name or name}"))
    return kit


def member(name: str, data: bytes = b"", type_=tarfile.REGTYPE, size: int | None = None) -> tuple:
    ti = tarfile.TarInfo(name)
    ti.type, ti.size = type_, len(data) if size is None else size
    return ti, data


# ------------------------------------------------------------------------------------ damage to a kit on disk
def _swap(kit):
    a, b = kit / "demo.tar.000", kit / "demo.tar.001"
    da, db = a.read_bytes(), b.read_bytes()
    a.write_bytes(db)
    b.write_bytes(da)


def _fifo(kit, name):
    (kit / name).unlink()
    os.mkfifo(kit / name)


def _link(kit, name, target):
    (kit / name).unlink()
    os.symlink(target, kit / name)


def _dir(kit, name):
    (kit / name).unlink()
    (kit / name).mkdir()


def _write(kit, name, data: bytes):
    (kit / name).write_bytes(data)


def _sig_line(kit, line: int, text: str):
    lines = (kit / "SHA256SUMS.minisig").read_text().splitlines()
    lines[line] = text
    (kit / "SHA256SUMS.minisig").write_text("\n".join(lines) + "\n")


DAMAGE = {
    "missing part": (lambda k, r: (k / "demo.tar.001").unlink(), "missing demo.tar.001"),
    "truncated part": (lambda k, r: os.truncate(k / "demo.tar.002", 10), "demo.tar.002: 10 bytes, expected"),
    "part too long": (lambda k, r: _write(k, "demo.tar.000", (k / "demo.tar.000").read_bytes() + b"x"), "too long"),
    "flipped byte, size and mtime kept": (lambda k, r: flip(k / "demo.tar.001"), "demo.tar.001: sha256 does not match"),
    "swapped parts": (lambda k, r: _swap(k), "sha256 does not match"),
    "extra file": (lambda k, r: _write(k, "evil.sh", b"rm -rf /"), "unexpected file(s) 'evil.sh'"),
    "renamed part": (lambda k, r: os.rename(k / "demo.tar.001", k / "demo.tar.01"), "missing demo.tar.001"),
    "non-UTF-8 file name": (lambda k, r: _write(k, os.fsdecode(b"\xff\xfe.bin"), b"x"), "unexpected file(s)"),
    "SHA256SUMS missing": (lambda k, r: (k / "SHA256SUMS").unlink(), "SHA256SUMS is missing"),
    "signature missing": (lambda k, r: (k / "SHA256SUMS.minisig").unlink(), "SHA256SUMS.minisig is missing"),
    "MANIFEST missing": (lambda k, r: (k / "MANIFEST.json").unlink(), "MANIFEST.json is missing"),
    "MANIFEST a directory": (lambda k, r: _dir(k, "MANIFEST.json"), "'MANIFEST.json' is a directory"),
    "MANIFEST a FIFO": (lambda k, r: _fifo(k, "MANIFEST.json"), "'MANIFEST.json' is not a regular file"),
    "MANIFEST a link to /dev/zero": (lambda k, r: _link(k, "MANIFEST.json", "/dev/zero"),
                                     "'MANIFEST.json' is a symbolic link"),
    "SHA256SUMS a FIFO": (lambda k, r: _fifo(k, "SHA256SUMS"), "'SHA256SUMS' is not a regular file"),
    "part a link out of the kit": (lambda k, r: _link(k, "demo.tar.000", r / "outside.txt"),
                                   "'demo.tar.000' is a symbolic link"),
    "part a directory": (lambda k, r: _dir(k, "demo.tar.001"), "'demo.tar.001' is a directory"),
    "non-UTF-8 SHA256SUMS": (lambda k, r: _write(k, "SHA256SUMS", b"\xff\xfe" * 40), "SHA256SUMS is not text"),
    "non-UTF-8 signature": (lambda k, r: _write(k, "SHA256SUMS.minisig", b"\x80\x81" * 40),
                            "SHA256SUMS.minisig is not text"),
    "32-byte signature": (lambda k, r: _sig_line(k, 1, base64.b64encode(b"ED" + b"\0" * 30).decode()),
                          "not an Ed25519 minisign signature"),
    "signature not base64": (lambda k, r: _sig_line(k, 1, "!!!!"), "signature is not valid base64"),
    "global signature short": (lambda k, r: _sig_line(k, 3, base64.b64encode(b"\0" * 10).decode()),
                               "the trusted comment was modified"),
    "empty signature file": (lambda k, r: _write(k, "SHA256SUMS.minisig", b""), "not a minisign signature file"),
    "1 MB signature file": (lambda k, r: _write(k, "SHA256SUMS.minisig", b"a" * 2**20), "more than the 4096"),
    "trusted comment edited": (lambda k, r: _sig_line(k, 2, "trusted comment: timestamp:0\tfile:SHA256SUMS\tkit:x"),
                               "the trusted comment was modified"),
    "SHA256SUMS edited": (lambda k, r: _write(k, "SHA256SUMS", (k / "SHA256SUMS").read_bytes().replace(b"0", b"1", 1)),
                          "signature does not match the signed file"),
    "MANIFEST edited": (lambda k, r: _write(k, "MANIFEST.json", (k / "MANIFEST.json").read_bytes().replace(
        b'"kit"', b'"bundle"')), "MANIFEST.json does not match its signed checksum"),
    "signed by a stranger": (lambda k, r: _write(k, "SHA256SUMS.minisig", SecretKey.generate().sign_file(
        k / "SHA256SUMS", "timestamp:0\tfile:SHA256SUMS\tkit:demo").encode()), "which is not trusted here"),
}


def _renamed(kit: Path) -> Path:
    new = kit.with_name("demo-v2")
    kit.rename(new)
    return new


@pytest.mark.parametrize("command", ["verify", "unpack"])
@pytest.mark.parametrize("case", list(DAMAGE))
def test_damaged_kit_is_refused(world, capsys, case, command):
    root, _ = world
    kit = root / "kits" / "demo"
    damage, match = DAMAGE[case]
    damage(kit, root)
    dest = root / "dest"
    argv = ["verify", kit] if command == "verify" else ["unpack", kit, dest]
    refused(capsys, root, dest, argv, match)
    assert not dest.exists()


@pytest.mark.parametrize("command", ["verify", "unpack"])
def test_renamed_kit_directory_is_refused(world, capsys, command):
    root, _ = world
    kit = _renamed(root / "kits" / "demo")
    argv = ["verify", kit] if command == "verify" else ["unpack", kit, root / "dest"]
    refused(capsys, root, root / "dest", argv, "named 'demo' in its signed MANIFEST.json, but its directory is "
                                                "named 'demo-v2'")


@pytest.mark.parametrize("command", ["verify", "unpack"])
@pytest.mark.parametrize("path", ["/nonexistent/kit", "FILE", "EMPTY"])
def test_kit_path_that_is_no_kit(world, capsys, command, path):
    root, _ = world
    if path == "FILE":
        path = root / "outside.txt"
    elif path == "EMPTY":
        path = root / "empty"
        path.mkdir()
    argv = ["verify", path] if command == "verify" else ["unpack", path, root / "dest"]
    refused(capsys, root, root / "dest", argv, "")


# ------------------------------------------------------------------------- validly signed, hostile content
def _payload(*members) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for ti, data in members:
            tar.addfile(ti, io.BytesIO(data) if ti.isreg() and data else None)
    return buf.getvalue()


def _listed(name, data):
    return [{"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}]


def _sparse_member() -> bytes:
    """A GNU sparse member named like a listed file, declaring 50 GB: with no check it fills the disk."""
    ti = tarfile.TarInfo("plan.json")
    ti.type, ti.size = tarfile.GNUTYPE_SPARSE, 512
    head = bytearray(ti.tobuf(tarfile.GNU_FORMAT))
    # realsize (offset 483, 12 octal digits) = 50 GB; one sparse map entry (offset 386: offset, numbytes)
    head[386:398] = b"%011o\0" % (50 * 10**9 - 512)
    head[398:410] = b"%011o\0" % 512
    head[483:495] = b"%011o\0" % (50 * 10**9)
    head[148:156] = b"        "
    head[148:156] = b"%06o\0 " % sum(head)
    return bytes(head) + b"x" * 512 + b"\0" * 1024


FORGED = {
    "tar header damaged": (dict(payload=b"\x00garbage" * 200, files=_listed("plan.json", b"{}")),
                           "the payload is not a valid tar stream", ("unpack",)),
    "tar ends inside a member": (dict(payload=_payload(member("plan.json", b"x" * 5000))[:1500],
                                      files=_listed("plan.json", b"x" * 5000)),
                                 "not a valid tar stream", ("unpack",)),
    "member larger than signed size": (dict(payload=_payload(member("plan.json", b"x" * 5000)),
                                            files=_listed("plan.json", b"x" * 10)),
                                       "declares 5000 bytes, the signed MANIFEST.json 10", ("unpack",)),
    "sparse 50 GB member": (dict(payload=_sparse_member(), files=_listed("plan.json", b"x" * 512)),
                            "refused", ("unpack",)),
    "member not listed": (dict(members=[member("a.txt", b"1"), member("b.txt", b"2")],
                               files=_listed("a.txt", b"1")), "tar member 'b.txt' is not listed", ("unpack",)),
    "member listed but missing": (dict(members=[member("a.txt", b"1")],
                                       files=_listed("a.txt", b"1") + _listed("b.txt", b"2")),
                                  "lacks ['b.txt']", ("unpack",)),
    "member content differs": (dict(members=[member("a.txt", b"1")], files=_listed("a.txt", b"2")),
                               "a.txt: content does not match", ("unpack",)),
    "member twice": (dict(members=[member("a.txt", b"1"), member("a.txt", b"1")], files=_listed("a.txt", b"1")),
                     "appears twice", ("unpack",)),
    "symlink member": (dict(members=[member("a.txt", b"1"), member("l", type_=tarfile.SYMTYPE)],
                            files=_listed("a.txt", b"1") + _listed("l", b"")), "is a symlink: refused", ("unpack",)),
    "escaping member, safe manifest": (dict(members=[member("../evil.txt", b"1")], files=_listed("a.txt", b"1")),
                                       "escaping path refused", ("unpack",)),
    "zstd header damaged": (dict(payload=b"\x28\xb5\x2f\xfd" + b"\xff" * 300, compression="zstd-3",
                                 files=_listed("a.txt", b"1")), "zstd", ("unpack",)),
    "manifest path escapes": (dict(members=[member("a.txt", b"1")], files=_listed("../../etc/x", b"1")),
                              "absolute or escaping path refused", ("verify", "unpack")),
    "manifest name over 255 bytes": (dict(members=[member("a.txt", b"1")], files=_listed("a" * 300, b"1")),
                                     "longer than a filesystem allows", ("verify", "unpack")),
    "manifest path over 4096 bytes": (dict(members=[member("a.txt", b"1")], files=_listed("/".join(["d" * 200] * 25),
                                                                                          b"1")),
                                      "longer than a filesystem allows", ("verify", "unpack")),
    "file and directory collide": (dict(members=[member("a", b"1")], files=_listed("a", b"1") +
                                        _listed("a/b", b"2")), "listed both as a file and as a directory",
                                   ("verify", "unpack")),
    "duplicate manifest path": (dict(members=[member("a", b"1")], files=_listed("a", b"1") * 2),
                                "listed twice", ("verify", "unpack")),
    "total_size lies": (dict(members=[member("a", b"1")], files=_listed("a", b"1"),
                             manifest_edit=lambda m: m.update(total_size=10**12)), "total_size = 1000000000000",
                        ("verify", "unpack")),
    "field missing": (dict(members=[member("a", b"1")], manifest_edit=lambda m: m.pop("created")),
                      "created: missing", ("verify", "unpack")),
    "field of the wrong type": (dict(members=[member("a", b"1")], manifest_edit=lambda m: m.update(part_size="4G")),
                                "part_size = \"4G\": expected an integer", ("verify", "unpack")),
    "unknown format version": (dict(members=[member("a", b"1")],
                                    manifest_edit=lambda m: m.update(format="jetson-kit-manifest/9")),
                               "made by a newer pipeline", ("verify", "unpack")),
    "manifest not UTF-8": (dict(members=[member("a", b"1")], raw_manifest=b"\xff{}"), "not valid JSON",
                           ("verify", "unpack")),
    "manifest 100k deep": (dict(members=[member("a", b"1")], raw_manifest=b"[" * 100_000), "not valid JSON",
                           ("verify", "unpack")),
    "manifest a list": (dict(members=[member("a", b"1")], raw_manifest=b"[]"), "expected a JSON object",
                        ("verify", "unpack")),
    "signed for another kit name": (dict(members=[member("a", b"1")], comment_name="other"),
                                    "the signature's trusted comment names kit 'other'", ("verify", "unpack")),
    "parts misnumbered": (dict(members=[member("a", b"1")],
                               manifest_edit=lambda m: m["parts"][0].update(name="demo.tar.007")),
                          "parts are", ("verify", "unpack")),
}

FORGED_CASES = [(case, cmd) for case, (_, _, cmds) in FORGED.items() for cmd in cmds]


@pytest.mark.parametrize("case,command", FORGED_CASES)
def test_validly_signed_hostile_kit_is_refused(world, capsys, case, command):
    root, key = world
    kwargs, match, _ = FORGED[case]
    kit = forge(root, key, **kwargs)
    dest = root / "dest"
    argv = ["verify", kit] if command == "verify" else ["unpack", kit, dest]
    refused(capsys, root, dest, argv, match)
    assert not dest.exists() and not list(root.glob(".dest*"))
    assert os.statvfs(root).f_bavail > 0


# ---------------------------------------------------------------------------------------- unpack destinations
def test_a_part_whose_tar_header_was_edited_is_refused_while_unpacking(world, capsys):
    """A part's tar header edited in place (the member's mode made executable, its header checksum fixed): the member's
    bytes still match the manifest, so only the part's own sha256 sees it. unpack hashes each part as it streams
    through the tar reader: refused, and nothing lands with the edited mode."""
    root, _ = world
    part = root / "kits" / "demo" / "demo.tar.000"
    data = bytearray(part.read_bytes())
    assert data[257:262] == b"ustar" and data[100:107] == b"0000644"     # the first member's plain ustar header
    data[100:107] = b"0000755"
    data[148:156] = b" " * 8
    data[148:156] = b"%06o\0 " % sum(data[:512])
    part.write_bytes(bytes(data))
    dest = root / "dest"
    refused(capsys, root, dest, ["unpack", root / "kits" / "demo", dest], "demo.tar.000: sha256 does not match")
    assert not dest.exists()


def test_unpack_into_a_path_under_a_file(world, capsys):
    root, _ = world
    refused(capsys, root, root / "outside.txt" / "dest", ["unpack", root / "kits" / "demo",
                                                           root / "outside.txt" / "dest"], "is a file")


def test_unpack_over_a_directory_that_is_no_kit_keeps_it(world, capsys):
    root, _ = world
    (root / "dest").mkdir()
    (root / "dest" / "mine.txt").write_text("keep me")
    refused(capsys, root, root / "dest", ["unpack", root / "kits" / "demo", root / "dest"],
            "already exists and is not a kit unpacked by the pipeline")
    assert (root / "dest" / "mine.txt").read_text() == "keep me"


def test_unpack_onto_a_dangling_symlink(world, capsys):
    root, _ = world
    os.symlink(root / "nowhere", root / "dest")
    refused(capsys, root, None, ["unpack", root / "kits" / "demo", root / "dest"], "already exists")
    assert not (root / "nowhere").exists()


def test_unpack_into_a_250_character_name(world, capsys):
    root, _ = world
    unpacked(capsys, root, root / ("d" * 250))


def test_unpack_refuses_a_downgrade_unless_allowed(world, capsys):
    root, key = world
    dest = root / "dest"
    assert run(capsys, "unpack", root / "kits" / "demo", dest)[0] == 0
    record = json.loads((root / "dest.installed.json").read_text())
    record["created"] = "2099-01-01T00:00:00Z"          # a newer kit was installed since
    (root / "dest.installed.json").write_text(json.dumps(record))
    err = refused(capsys, root, dest, ["unpack", root / "kits" / "demo", dest], "refusing to downgrade")
    assert "--allow-downgrade" in err
    unpacked(capsys, root, dest, "--allow-downgrade")


def test_unpack_again_replaces_the_same_kit(world, capsys):
    root, _ = world
    dest = root / "dest"
    assert run(capsys, "unpack", root / "kits" / "demo", dest)[0] == 0
    (dest / "plan.json").write_text("planted")
    unpacked(capsys, root, dest)


def test_unpack_removes_a_killed_unpacks_staging(world, capsys):
    root, _ = world
    from pipeline.kit.unpack import staging_dir
    stale = staging_dir(root / "dest", 2**22 + 12345)      # no such pid
    stale.mkdir()
    (stale / "big.bin").write_bytes(b"x" * 1000)
    assert run(capsys, "unpack", root / "kits" / "demo", root / "dest")[0] == 0
    assert not stale.exists()


def test_disk_full_during_unpack(world, capsys, monkeypatch):
    root, _ = world
    import pipeline.kit.unpack as unpack_mod

    real = unpack_mod.create_new

    class Full(io.RawIOBase):
        def __init__(self, fh):
            self.fh = fh

        def write(self, b):
            raise OSError(errno.ENOSPC, "No space left on device", str(root / "dest"))

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.fh.close()
    monkeypatch.setattr(unpack_mod, "create_new", lambda p, mode=0o644: Full(real(p, mode)))
    refused(capsys, root, root / "dest", ["unpack", root / "kits" / "demo", root / "dest"], "the disk is full")
    assert not (root / "dest").exists() and not list(root.glob(".*unpack*"))


def test_not_enough_space_says_how_much_in_useful_units(world, capsys, monkeypatch):
    from conftest import small_disk
    root, _ = world
    small_disk(monkeypatch, 50)
    refused(capsys, root, root / "dest", ["unpack", root / "kits" / "demo", root / "dest"],
            "the kit unpacks to 16.2 MiB (with block rounding), 200.0 KiB free")
    refused(capsys, root, root / "stick", ["transfer", root / "kits" / "demo", root / "stick"],
            "268.0 KiB to copy (with block rounding), 200.0 KiB free")


# ------------------------------------------------------------------------------------------------- transfer
def test_transfer_never_follows_a_planted_partial_link(world, capsys):
    root, _ = world
    stick = root / "stick" / "demo"
    stick.mkdir(parents=True)
    os.symlink(root / "outside.txt", stick / "demo.tar.001.partial")
    before = snapshot(root, root / "stick")
    rc, out, err = run(capsys, "transfer", root / "kits" / "demo", root / "stick")
    assert rc == 0, err
    assert snapshot(root, root / "stick") == before and (root / "outside.txt").read_text() == "precious"
    assert (stick / "demo.tar.001").read_bytes() == (root / "kits" / "demo" / "demo.tar.001").read_bytes()


def test_transfer_replaces_an_older_kit_of_the_same_name_and_sizes(world, capsys):
    root, key = world
    old_src = root / "old"
    (old_src / "engine").mkdir(parents=True)
    (old_src / "engine" / "rank0.safetensors").write_bytes(os.urandom(250_000))
    (old_src / "plan.json").write_text('{"a": 0}')
    pack(old_src, root / "stick" / "demo", "demo", "kit", key, part_size=100_000)   # same name, same sizes
    rc, out, err = run(capsys, "transfer", root / "kits" / "demo", root / "stick")
    assert rc == 0, err
    for p in (root / "kits" / "demo").iterdir():
        assert (root / "stick" / "demo" / p.name).read_bytes() == p.read_bytes(), p.name


@pytest.mark.parametrize("where,match", [
    ("inside", "is the kit itself or inside it"),
    ("self", "is the kit itself or inside it"),
    ("under-file", "not a directory"),
    ("dangling", "a symbolic link to nothing"),
    ("kit-dir-link", "exists and is not a directory (a symbolic link)"),
    ("foreign-file", "holds 'notes.txt', which is not part of kit demo"),
])
def test_transfer_refuses_bad_destinations(world, capsys, where, match):
    root, _ = world
    kit = root / "kits" / "demo"
    dest = {"inside": kit / "sub", "self": root / "kits", "under-file": root / "outside.txt",
            "dangling": root / "stick", "kit-dir-link": root / "stick", "foreign-file": root / "stick"}[where]
    if where == "dangling":
        os.symlink(root / "nowhere", dest)
    elif where == "kit-dir-link":
        dest.mkdir()
        os.symlink(root / "src", dest / "demo")
    elif where == "foreign-file":
        (dest / "demo").mkdir(parents=True)
        (dest / "demo" / "notes.txt").write_text("mine")
    before_kit = snapshot(kit)
    refused(capsys, root, None if where in ("inside", "self") else dest, ["transfer", kit, dest], match)
    assert snapshot(kit) == before_kit


def test_transfer_of_a_damaged_source_is_refused(world, capsys):
    root, _ = world
    flip(root / "kits" / "demo" / "demo.tar.002")
    refused(capsys, root, root / "stick", ["transfer", root / "kits" / "demo", root / "stick"], "sha256 does not match")


def test_transfer_into_a_250_character_directory(world, capsys):
    root, _ = world
    rc, _, err = run(capsys, "transfer", root / "kits" / "demo", root / ("s" * 250))
    assert rc == 0, err


# ---------------------------------------------------------------------------------------------------- trust
def _keyfile(root: Path, kind: str) -> Path:
    p = root / f"k-{kind}"
    key = SecretKey.generate()
    if kind == "secret":
        p.write_text(key.dump())
    elif kind == "legacy-secret":
        p.write_text(f"untrusted comment: jetson-pipeline secret key {key.public.id_hex} (keep private)\n"
                     + base64.b64encode(b"Ed" + key.key_id + key.seed).decode() + "\n")
    elif kind == "binary":
        p.write_bytes(os.urandom(300))
    elif kind == "empty":
        p.write_text("")
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "dir":
        p.mkdir()
    elif kind == "huge":
        p.write_text("a" * 10_000)
    elif kind == "short":
        p.write_text("untrusted comment: x\n" + base64.b64encode(b"Ed" + b"\0" * 20).decode() + "\n")
    return p


@pytest.mark.parametrize("kind,match", [
    ("secret", "this is a secret (signing) key, not a public key"),
    ("legacy-secret", "this is a secret (signing) key"),
    ("binary", "not a public key file (binary content)"),
    ("empty", "not a minisign Ed25519 public key"),
    ("fifo", "not a regular file"),
    ("dir", "not a regular file"),
    ("huge", "more than the 4096"),
    ("short", "not a minisign Ed25519 public key"),
    ("missing", "no such file"),
])
def test_trust_refuses_what_is_not_a_public_key(world, capsys, kind, match):
    root, _ = world
    refused(capsys, root, root / "home", ["trust", _keyfile(root, kind)], match)


def test_trust_never_silently_replaces_a_trusted_key(world, capsys):
    root, key = world
    evil = SecretKey(key.key_id, SecretKey.generate().seed)     # the same key id: ids are chosen by the key's maker
    pub = root / "evil.pub"
    pub.write_text(evil.public.dump())
    err = refused(capsys, root, root / "home", ["trust", pub],
                  f"already trusts another key with id {key.public.id_hex}")
    assert f"--replace {key.public.id_hex}" in err
    rc, out, err = run(capsys, "trust", pub, "--replace", key.public.id_hex)
    assert rc == 0, err
    again = root / "same.pub"
    again.write_text(evil.public.dump())
    assert run(capsys, "trust", again)[0] == 0            # the same key again: nothing to replace


def test_keygen_writes_a_private_secret_and_its_public_half(world, capsys):
    root, _ = world
    rc, out, err = run(capsys, "keygen", "--out", root / "k" / "signing.key")
    assert rc == 0, err
    assert stat.S_IMODE(os.stat(root / "k" / "signing.key").st_mode) == 0o600
    assert (root / "k" / "signing.pub").read_text().startswith("untrusted comment: jetson-pipeline public key")
    refused(capsys, root, None, ["keygen", "--out", root / "k" / "signing.key"], "already exists")
    refused(capsys, root, root / "home", ["trust", root / "k" / "signing.key"], "secret (signing) key")


def test_keygen_killed_between_its_writes_leaves_no_half_key(world, capsys, monkeypatch):
    """The public half is renamed into place first: a kill before the secret's rename leaves a .pub and no key (the
    next keygen makes a complete pair), never an empty key or a key without its .pub."""
    root, _ = world
    real = os.replace
    calls = []

    def killed_after_first(a, b):
        calls.append(b)
        if len(calls) == 2:
            raise KeyboardInterrupt       # stands in for the kill between the two renames
        return real(a, b)
    monkeypatch.setattr(os, "replace", killed_after_first)
    key = root / "k" / "signing.key"
    with pytest.raises(KeyboardInterrupt):
        from pipeline.kit.signing import keygen
        keygen(key, trust=False)
    assert not key.exists() and key.with_suffix(".pub").exists()
    monkeypatch.setattr(os, "replace", real)
    rc, _, err = run(capsys, "keygen", "--out", key)
    assert rc == 0, err
    assert key.stat().st_size > 0 and stat.S_IMODE(key.stat().st_mode) == 0o600
    from pipeline.kit.signing import PublicKey, SecretKey
    assert SecretKey.load(key).public.key == PublicKey.load(key.with_suffix(".pub")).key


def test_planted_fifos_in_bookkeeping_files_are_absent_records_not_hangs(world, capsys, tmp_path):
    """The pipeline's own records (unpack's install record, the device's build record, a stage manifest) may be
    planted too: a FIFO there reads as no record, under the 20 s alarm."""
    root, _ = world
    (root / "dest").mkdir()
    os.mkfifo(root / "dest.installed.json")
    refused(capsys, root, root / "dest", ["unpack", root / "kits" / "demo", root / "dest"],
            "already exists and is not a kit unpacked by the pipeline")

    from pipeline.device.driver import _reusable_build
    from pipeline.graph.framework import read_manifest
    work = tmp_path / "work"
    (work / "engine").mkdir(parents=True)
    os.mkfifo(work / "build.json")
    os.mkfifo(work / "engine" / "stage.json")
    old = signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError("HANG")))
    signal.alarm(20)
    try:
        assert _reusable_build(work, work / "engine", "0" * 64, [["trtllm-build"]]) is None
        assert read_manifest(work / "engine") is None
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_verify_reports_a_replayed_older_kit_as_unpack_does(world, capsys):
    root, _ = world
    dest = root / "dest"
    assert run(capsys, "verify", root / "kits" / "demo", "--installed", dest)[0] == 0      # nothing there yet
    assert run(capsys, "unpack", root / "kits" / "demo", dest)[0] == 0
    assert run(capsys, "verify", root / "kits" / "demo", "--installed", dest)[0] == 0      # the same kit
    record = json.loads((root / "dest.installed.json").read_text())
    (root / "dest.installed.json").write_text(json.dumps(dict(record, created="2099-01-01T00:00:00Z")))
    err = refused(capsys, root, None, ["verify", root / "kits" / "demo", "--installed", dest],
                  f"older than the one at {dest} (2099-01-01T00:00:00Z): refusing to downgrade")
    assert "replayed older kit" in err
    # a pull directory: the kit of that name in it, by its signed creation time
    pulled = root / "pulled" / "demo"
    pulled.mkdir(parents=True)
    manifest = json.loads((root / "kits" / "demo" / "MANIFEST.json").read_text())
    (pulled / "MANIFEST.json").write_text(json.dumps(dict(manifest, created="2099-01-01T00:00:00Z")))
    refused(capsys, root, None, ["verify", root / "kits" / "demo", "--installed", root / "pulled"],
            "refusing to downgrade")


@pytest.mark.parametrize("bad", [b"", b"not a key\n", b"\xff\xfe" * 40, None])
def test_a_malformed_trusted_key_is_reported_and_skipped(world, capsys, bad):
    root, _ = world
    trusted = root / "home" / "trusted"
    if bad is None:         # a secret key dropped in the trusted folder by mistake
        (trusted / "oops.pub").write_text(SecretKey.generate().dump())
    else:
        (trusted / "oops.pub").write_bytes(bad)
    rc, out, err = run(capsys, "verify", root / "kits" / "demo")
    assert rc == 0 and out.startswith("OK: "), err
    assert f"warning: skipping trusted key {trusted / 'oops.pub'}: " in err and "Traceback" not in err
