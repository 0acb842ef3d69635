"""Kits: pack -> verify -> unpack/transfer, stock-tool compatibility, and hostile or broken input."""

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from pipeline import contract
from pipeline.kit.archive import pack
from pipeline.kit.signing import PublicKey, SecretKey, SignatureError
from pipeline.kit.transfer import transfer
from pipeline.kit.unpack import unpack
from pipeline.kit.verify import MANIFEST, SIG, SUMS, KitError, check_kit


@pytest.fixture
def key():
    return SecretKey.generate()


@pytest.fixture
def src(tmp_path):
    d = tmp_path / "src"
    (d / "checkpoint").mkdir(parents=True)
    (d / "checkpoint" / "rank0.safetensors").write_bytes(os.urandom(300_000))
    (d / "checkpoint" / "config.json").write_text('{"architecture": "LlamaForCausalLM"}')
    (d / "goldens.json").write_text("{}")
    (d / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (d / "run.sh").chmod(0o755)
    return d


def packed(tmp_path, src, key, **kw):
    out = tmp_path / "demo"
    pack(src, out, "demo", "kit", key, meta=contract.KitMeta(recipe="r"), **kw)
    return out


def tree(d: Path) -> dict:
    return {p.relative_to(d).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


def test_roundtrip_with_parts_and_stock_tools(tmp_path, src, key):
    kit = packed(tmp_path, src, key, part_size=100_000)
    v = check_kit(kit, [key.public])
    m = v.manifest
    assert len(m.parts) >= 3 and m.recipe == "r" and v.signed_by == key.public.id_hex
    assert {f.path for f in m.files} == set(tree(src))
    out = tmp_path / "out"
    unpack(kit, out, [key.public])
    assert tree(out) == tree(src) and os.access(out / "run.sh", os.X_OK)
    # stock tools: sha256sum -c, minisign -V, and cat parts | tar -x
    assert subprocess.run(["sha256sum", "-c", "--strict", SUMS], cwd=kit, capture_output=True).returncode == 0
    pub = tmp_path / "k.pub"
    pub.write_text(key.public.dump())
    assert shutil.which("minisign"), "Debian's minisign is needed (apt-get install minisign; .ci/run installs it)"
    r = subprocess.run(["minisign", "-Vm", SUMS, "-p", str(pub)], cwd=kit, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    x = tmp_path / "x"
    x.mkdir()
    subprocess.run(f"cat {kit}/demo.tar.* | tar -x -C {x}", shell=True, check=True)
    assert tree(x) == tree(src)


def test_zstd_kit_unpacks_with_stock_tools_too(tmp_path, src, key):
    kit = packed(tmp_path, src, key, zstd_level=3, part_size=150_000)
    assert json.loads((kit / MANIFEST).read_text())["compression"] == "zstd-3"
    unpack(kit, tmp_path / "out", [key.public])
    assert tree(tmp_path / "out") == tree(src)
    x = tmp_path / "x"
    x.mkdir()
    subprocess.run(f"cat {kit}/demo.tar.zst.* | zstd -dq | tar -x -C {x}", shell=True, check=True)
    assert tree(x) == tree(src)


def test_same_inputs_give_the_same_parts(tmp_path, src, key):
    a = json.loads((packed(tmp_path, src, key) / MANIFEST).read_text())
    b_out = tmp_path / "two" / "demo"
    pack(src, b_out, "demo", "kit", key)
    assert a["parts"] == json.loads((b_out / MANIFEST).read_text())["parts"]


# ---------------------------------------------------------------------------------------------- broken or hostile
def expect(kit, key, match, dest=None):
    """Both verify and unpack refuse, with `match` in the message, and unpack leaves nothing behind."""
    dest = dest or kit.parent / "dest"
    with pytest.raises((KitError, SignatureError), match=match):
        check_kit(kit, [key.public])
    with pytest.raises((KitError, SignatureError), match=match):
        unpack(kit, dest, [key.public])
    assert not dest.exists()
    assert not [p for p in dest.parent.iterdir() if p.name.startswith(f".{dest.name}")]


def test_missing_part(tmp_path, src, key):
    kit = packed(tmp_path, src, key, part_size=100_000)
    (kit / "demo.tar.001").unlink()
    expect(kit, key, "missing demo.tar.001")


def test_truncated_part(tmp_path, src, key):
    kit = packed(tmp_path, src, key, part_size=100_000)
    with open(kit / "demo.tar.002", "r+b") as fh:
        fh.truncate(1000)
    expect(kit, key, "demo.tar.002: 1000 bytes, expected 100000: truncated")


def test_flipped_byte(tmp_path, src, key):
    kit = packed(tmp_path, src, key, part_size=100_000)
    with open(kit / "demo.tar.001", "r+b") as fh:
        fh.seek(5000)
        b = fh.read(1)
        fh.seek(5000)
        fh.write(bytes([b[0] ^ 1]))
    expect(kit, key, "demo.tar.001: sha256 does not match: the part is corrupt")


def test_missing_wrong_and_untrusted_signatures(tmp_path, src, key):
    kit = packed(tmp_path, src, key)
    sig = (kit / SIG).read_text()
    (kit / SIG).unlink()
    expect(kit, key, "SHA256SUMS.minisig is missing")
    other = SecretKey(key.key_id, SecretKey.generate().seed)       # same key id, different key: forged
    (kit / SIG).write_text(other.sign_file(kit / SUMS))
    expect(kit, key, f"signature does not match the signed file \\(key {key.public.id_hex}\\)")
    (kit / SIG).write_text(sig.replace("kit:demo", "kit:evil"))
    expect(kit, key, "the trusted comment was modified")
    stranger = SecretKey.generate()
    (kit / SIG).write_text(stranger.sign_file(kit / SUMS))
    expect(kit, key, f"made by key {stranger.public.id_hex}, which is not trusted here")


def test_edited_manifest_and_sums(tmp_path, src, key):
    kit = packed(tmp_path, src, key)
    m = json.loads((kit / MANIFEST).read_text())
    m["recipe"] = "other"
    (kit / MANIFEST).write_text(json.dumps(m))
    expect(kit, key, "MANIFEST.json does not match its signed checksum: the manifest was edited")
    kit2 = tmp_path / "two" / "demo"
    pack(src, kit2, "demo", "kit", key)
    (kit2 / SUMS).write_text((kit2 / SUMS).read_text().replace("demo.tar.000", "demo.tar.999"))
    expect(kit2, key, "signature does not match the signed file")


def test_extra_and_renamed_files(tmp_path, src, key):
    kit = packed(tmp_path, src, key, part_size=100_000)
    (kit / "evil.sh").write_text("rm -rf /")
    expect(kit, key, r"unexpected file\(s\) 'evil.sh'")
    (kit / "evil.sh").unlink()
    (kit / "demo.tar.001").rename(kit / "demo.tar.01")
    expect(kit, key, "missing demo.tar.001")


def forge(tmp_path, key, members, listed=None) -> Path:
    """A correctly signed kit whose tar holds `members` [(TarInfo, bytes)]: a compromised packer's output."""
    kit = tmp_path / "forged" / "demo"
    kit.mkdir(parents=True)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    part = buf.getvalue()
    (kit / "demo.tar.000").write_bytes(part)
    files = listed if listed is not None else [
        {"path": i.name, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for i, d in members]
    manifest = {"format": "jetson-kit-manifest/1", "kind": "kit", "name": "demo", "compression": "none",
                "created": "2026-11-23T00:00:00Z", "part_size": len(part),
                "parts": [{"name": "demo.tar.000", "size": len(part), "sha256": hashlib.sha256(part).hexdigest()}],
                "files": files, "total_size": sum(f["size"] for f in files)}
    (kit / MANIFEST).write_text(json.dumps(manifest))
    sums = f"{hashlib.sha256((kit / MANIFEST).read_bytes()).hexdigest()}  {MANIFEST}\n" \
           f"{manifest['parts'][0]['sha256']}  demo.tar.000\n"
    (kit / SUMS).write_text(sums)
    (kit / SIG).write_text(key.sign_file(kit / SUMS, "timestamp:0\tfile:SHA256SUMS\tkit:demo"))
    return kit


def info(name, type_=tarfile.REGTYPE, linkname=""):
    ti = tarfile.TarInfo(name)
    ti.type, ti.linkname = type_, linkname
    return ti


@pytest.mark.parametrize("name,message", [
    ("../escape.txt", "'../escape.txt': absolute or escaping path refused"),
    ("/tmp/abs.txt", "'/tmp/abs.txt': absolute or escaping path refused"),
    ("a/../../b.txt", "escaping path refused"),
])
def test_escaping_member_paths(tmp_path, key, name, message):
    kit = forge(tmp_path, key, [(info("ok.txt"), b"fine"), (info(name), b"evil")])
    dest = tmp_path / "d" / "dest"
    with pytest.raises(KitError, match=message):
        unpack(kit, dest, [key.public])
    assert not dest.exists() and not (tmp_path / "escape.txt").exists() and not Path("/tmp/abs.txt").exists()
    assert not (tmp_path / "d").exists() or list((tmp_path / "d").iterdir()) == []


@pytest.mark.parametrize("ti,kind", [
    (info("link", tarfile.SYMTYPE, "/etc/passwd"), "symlink"),
    (info("hard", tarfile.LNKTYPE, "ok.txt"), "hardlink"),
    (info("dev", tarfile.CHRTYPE), "device file"),
    (info("fifo", tarfile.FIFOTYPE), "special file"),
])
def test_links_and_device_files(tmp_path, key, ti, kind):
    kit = forge(tmp_path, key, [(info("ok.txt"), b"fine"), (ti, b"")])
    with pytest.raises(KitError, match=f"tar member '{ti.name}' is a {kind}: refused"):
        unpack(kit, tmp_path / "dest", [key.public])
    assert not (tmp_path / "dest").exists()


def test_duplicate_and_unlisted_members(tmp_path, key):
    kit = forge(tmp_path, key, [(info("a.txt"), b"one"), (info("a.txt"), b"two")],
                listed=[{"path": "a.txt", "size": 3, "sha256": hashlib.sha256(b"one").hexdigest()}])
    with pytest.raises(KitError, match="tar member 'a.txt' appears twice: refused"):
        unpack(kit, tmp_path / "dest", [key.public])
    shutil.rmtree(kit)
    kit = forge(tmp_path, key, [(info("a.txt"), b"one"), (info("b.txt"), b"two")],
                listed=[{"path": "a.txt", "size": 3, "sha256": hashlib.sha256(b"one").hexdigest()}])
    with pytest.raises(KitError, match="tar member 'b.txt' is not listed in MANIFEST.json: refused"):
        unpack(kit, tmp_path / "dest", [key.public])
    assert not (tmp_path / "dest").exists()


def test_not_enough_free_space_is_checked_before_extracting(tmp_path, src, key, monkeypatch):
    from conftest import small_disk
    kit = packed(tmp_path, src, key)
    small_disk(monkeypatch, 24)
    with pytest.raises(KitError, match=r"not enough free space in .*: the kit unpacks to 16.3 MiB \(with block "
                                       r"rounding\), 96.0 KiB free"):
        unpack(kit, tmp_path / "dest", [key.public])
    assert not (tmp_path / "dest").exists()
    with pytest.raises(KitError, match="not enough free space on"):
        transfer(kit, tmp_path / "stick", [key.public])


def test_transfer_resumes_and_verifies(tmp_path, src, key):
    kit = packed(tmp_path, src, key, part_size=100_000)
    stick = tmp_path / "stick"
    dest = stick / "demo"
    dest.mkdir(parents=True)
    # an interrupted earlier copy: one part half-written, one complete-looking part that is corrupt
    data = (kit / "demo.tar.001").read_bytes()
    (dest / "demo.tar.001.partial").write_bytes(data[:30_000])
    bad = bytearray((kit / "demo.tar.002").read_bytes())
    bad[10] ^= 0xFF
    (dest / "demo.tar.002").write_bytes(bytes(bad))
    out = transfer(kit, stick, [key.public])
    assert out == dest and tree(dest) == tree(kit)
    assert not list(dest.glob("*.partial"))
    check_kit(dest, [key.public])


def test_public_key_file_format_roundtrips(tmp_path, key):
    p = tmp_path / "k.pub"
    p.write_text(key.public.dump())
    loaded = PublicKey.load(p)
    assert loaded.key == key.public.key and loaded.key_id == key.key_id
    k = tmp_path / "s.key"
    k.write_text(key.dump())
    k.chmod(0o600)
    assert (k.stat().st_mode & 0o777) == 0o600 and SecretKey.load(k).seed == key.seed


def test_command_line_round_trip(tmp_path, src):
    import sys
    env = dict(os.environ, JETSON_PIPELINE_HOME=str(tmp_path / "home"))

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "pipeline", *args], env=env, capture_output=True, text=True)
    r = cli("keygen")
    assert r.returncode == 0 and "secret key:" in r.stdout
    assert cli("keygen").returncode == 2          # never overwrites a key
    r = cli("pack", str(src), str(tmp_path / "demo"), "--part-size", "100000", "--zstd", "1")
    assert r.returncode == 0, r.stderr
    assert "packed 4 files" in r.stdout
    assert cli("verify", str(tmp_path / "demo")).returncode == 0
    r = cli("transfer", str(tmp_path / "demo"), str(tmp_path / "stick"))
    assert r.returncode == 0 and "copied and verified" in r.stdout
    r = cli("unpack", str(tmp_path / "stick" / "demo"), str(tmp_path / "out"))
    assert r.returncode == 0 and tree(tmp_path / "out") == tree(src)
    (tmp_path / "demo" / "demo.tar.zst.000").unlink()
    r = cli("verify", str(tmp_path / "demo"))
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "missing demo.tar.zst.000" in r.stderr
    r = subprocess.run([sys.executable, "-m", "pipeline", "verify", str(tmp_path / "stick" / "demo")],
                       env=dict(env, JETSON_PIPELINE_HOME=str(tmp_path / "elsewhere")), capture_output=True, text=True)
    assert r.returncode == 2 and "no trusted public keys" in r.stderr


def test_a_trusted_comment_is_written_and_read_by_one_pair_and_no_field_can_forge_another():
    from pipeline.kit.signing import comment_fields, comment_line
    line = comment_line("push", ("kit", "r@t"), ("timestamp", 17), ("ref", "kits:v1"))
    assert line == "push\tkit:r@t\ttimestamp:17\tref:kits:v1"
    assert comment_fields(line) == {"kit": "r@t", "timestamp": "17", "ref": "kits:v1"}
    for forged in ("a\tkit:other", "a\nx", "a\rb"):
        with pytest.raises(ValueError, match="cannot hold a tab or a line break"):
            comment_line(("kit", forged))
