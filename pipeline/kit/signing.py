"""Ed25519 signatures in minisign's format, so a Jetson user can check a kit with the stock `minisign -V`.

Public key file    untrusted comment: ...\\n base64("Ed" | key id (8) | public key (32))
Signature file     untrusted comment: ...\\n base64("ED" | key id (8) | ed25519(BLAKE2b-512(file)))
                   trusted comment: ...\\n base64(ed25519(signature (64) | trusted comment))
Secret key file    ours, not minisign's (which is scrypt-encrypted): base64("JS" | key id | 32-byte seed), mode 0600.
                   Keys written before the "JS" tag used "Ed", the public key's tag: they still load as secret keys,
                   and `trust` refuses any file that says it is a secret key, whatever its tag.

Ed25519 comes from PyNaCl or, failing that, `cryptography` (JetPack's Ubuntu ships python3-cryptography), so the
device needs no compiler and no torch to verify.
"""

from __future__ import annotations

import base64
import hashlib
import os
import time
from pathlib import Path

from pipeline import settings
from pipeline.errors import PipelineError

ALG_KEY = b"Ed"
ALG_PREHASHED = b"ED"
ALG_SECRET = b"JS"
MAX_KEY_FILE = 4096             # a key or signature file is a few lines; anything larger is not one


class SignatureError(PipelineError):
    pass


def _backend():
    try:
        return _nacl()
    except ImportError:
        return _cryptography()


def _nacl():
    import nacl.signing as ns

    def sign(seed: bytes, msg: bytes) -> bytes:
        return ns.SigningKey(seed).sign(msg).signature

    def public(seed: bytes) -> bytes:
        return bytes(ns.SigningKey(seed).verify_key)

    def verify(pub: bytes, msg: bytes, sig: bytes) -> bool:
        from nacl.exceptions import BadSignatureError
        try:
            ns.VerifyKey(pub).verify(msg, sig)
            return True
        except BadSignatureError:
            return False
    return sign, public, verify


def _cryptography():
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
    except ImportError:
        raise PipelineError("no Ed25519 implementation: neither PyNaCl nor cryptography is installed",
                            "pip install pynacl (or: apt install python3-cryptography)") from None

    def sign(seed, msg):
        return Ed25519PrivateKey.from_private_bytes(seed).sign(msg)

    def public(seed):
        return Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def verify(pub, msg, sig):
        try:
            Ed25519PublicKey.from_public_bytes(pub).verify(sig, msg)
            return True
        except InvalidSignature:
            return False
    return sign, public, verify


def _b64line(text: str, what: str, path: Path) -> bytes:
    try:
        return base64.b64decode(text.strip(), validate=True)
    except ValueError:
        raise SignatureError(f"{path}: {what} is not valid base64") from None


class PublicKey:
    def __init__(self, key_id: bytes, key: bytes, source: str = ""):
        self.key_id, self.key, self.source = key_id, key, source

    @property
    def id_hex(self) -> str:
        return self.key_id[::-1].hex().upper()   # minisign prints the little-endian id as hex

    @classmethod
    def load(cls, path: Path) -> PublicKey:
        lines = _key_lines(path, "public key")
        raw = _b64line(lines[-1] if lines else "", "public key", path)
        if raw[:2] == ALG_SECRET or any("secret key" in line for line in lines[:-1]):
            raise SignatureError(f"{path}: this is a secret (signing) key, not a public key",
                                 f"trust the .pub file beside it; keep {Path(path).name} private (it signs kits)")
        if len(raw) != 42 or raw[:2] != ALG_KEY:
            raise SignatureError(f"{path}: not a minisign Ed25519 public key",
                                 "pass the .pub file written by `python -m pipeline keygen` or `minisign -G`")
        return cls(raw[2:10], raw[10:], str(path))

    def dump(self) -> str:
        return (f"untrusted comment: jetson-pipeline public key {self.id_hex}\n"
                + base64.b64encode(ALG_KEY + self.key_id + self.key).decode() + "\n")


class SecretKey:
    def __init__(self, key_id: bytes, seed: bytes):
        self.key_id, self.seed = key_id, seed

    @property
    def public(self) -> PublicKey:
        return PublicKey(self.key_id, _backend()[1](self.seed))

    @classmethod
    def generate(cls) -> SecretKey:
        return cls(os.urandom(8), os.urandom(32))

    @classmethod
    def load(cls, path: Path) -> SecretKey:
        lines = _key_lines(path, "secret key")
        raw = _b64line(lines[-1] if lines else "", "secret key", path)
        legacy = raw[:2] == ALG_KEY and any("secret key" in line for line in lines[:-1])
        if len(raw) != 42 or not (raw[:2] == ALG_SECRET or legacy):
            raise SignatureError(f"{path}: not a jetson-pipeline secret key",
                                 "pass the signing.key written by `python -m pipeline keygen`")
        return cls(raw[2:10], raw[10:])

    def dump(self) -> str:
        return (f"untrusted comment: jetson-pipeline secret key {self.public.id_hex} (keep private)\n"
                + base64.b64encode(ALG_SECRET + self.key_id + self.seed).decode() + "\n")

    def sign_file(self, path: Path, trusted_comment: str | None = None) -> str:
        """The .minisig text for `path`."""
        return self.sign_bytes(Path(path).read_bytes(),
                               trusted_comment or comment_line(("timestamp", int(time.time())),
                                                                ("file", Path(path).name), "hashed"))

    def sign_bytes(self, data: bytes, comment: str) -> str:
        """The .minisig text for `data` with the trusted comment `comment` (Ed25519 is deterministic: the same
        data and comment give the same bytes)."""
        sign = _backend()[0]
        sig = sign(self.seed, hashlib.blake2b(data, digest_size=64).digest())
        global_sig = sign(self.seed, sig + comment.encode())
        return (f"untrusted comment: signature from jetson-pipeline secret key {self.public.id_hex}\n"
                + base64.b64encode(ALG_PREHASHED + self.key_id + sig).decode() + "\n"
                + f"trusted comment: {comment}\n" + base64.b64encode(global_sig).decode() + "\n")


def _key_lines(path: Path, what: str) -> list[str]:
    from pipeline.files import read_regular
    try:
        text = read_regular(Path(path), MAX_KEY_FILE).decode("utf-8")
    except UnicodeDecodeError:
        raise SignatureError(f"{path}: not a {what} file (binary content)",
                             f"pass the {what} file itself (a few lines of text)") from None
    except PipelineError as exc:
        raise SignatureError(f"{exc.message} (expected a {what} file)",
                             exc.hint or f"pass the path of the {what} file") from None
    return [line for line in text.splitlines() if line.strip()]


def comment_line(*items: str | tuple[str, object]) -> str:
    """A trusted comment: bare words and `key:value` fields, tab-separated, in the order given (what
    `comment_fields` reads back). A value holding a tab or a line break would forge another field: refused."""
    out = []
    for item in items:
        text = item if isinstance(item, str) else f"{item[0]}:{item[1]}"
        if "\t" in text or "\n" in text or "\r" in text:
            raise ValueError(f"a trusted comment field cannot hold a tab or a line break: {text[:80]!r}")
        out.append(text)
    return "\t".join(out)


def comment_fields(comment: str) -> dict[str, str]:
    """A trusted comment's `key:value` fields, tab-separated (kit, timestamp, stage, ref, ...): `comment_line`'s."""
    return dict(f.split(":", 1) for f in comment.split("\t") if ":" in f)


def verify_signature(data: bytes, sig_text: str, trusted: list[PublicKey], sig_path: Path) -> tuple[PublicKey, str]:
    """Check the minisign signature `sig_text` (read from `sig_path`) over `data`; returns the key that signed it
    and the trusted comment (signed too: it binds the kit's name and creation time)."""
    verify = _backend()[2]
    lines = sig_text.splitlines()
    if len(lines) < 4 or not lines[2].startswith("trusted comment: "):
        raise SignatureError(f"{sig_path}: not a minisign signature file")
    raw = _b64line(lines[1], "signature", sig_path)
    if len(raw) != 74 or raw[:2] not in (ALG_KEY, ALG_PREHASHED):
        raise SignatureError(f"{sig_path}: not an Ed25519 minisign signature")
    key_id, sig = raw[2:10], raw[10:]
    key = next((k for k in trusted if k.key_id == key_id), None)
    if key is None:
        known = ", ".join(k.id_hex for k in trusted) or "none"
        raise SignatureError(f"{sig_path.name} was made by key {key_id[::-1].hex().upper()}, which is not trusted "
                             f"here (trusted: {known})",
                             "if you trust it, add its .pub file with `python -m pipeline trust KEY.pub`")
    message = hashlib.blake2b(data, digest_size=64).digest() if raw[:2] == ALG_PREHASHED else data
    if not verify(key.key, message, sig):
        raise SignatureError(f"{sig_path.name}: signature does not match the signed file (key {key.id_hex})",
                             "the file was modified after signing, or the kit is corrupt: do not use it")
    comment = lines[2][len("trusted comment: "):]
    global_sig = _b64line(lines[3], "global signature", sig_path)
    if len(global_sig) != 64 or not verify(key.key, sig + comment.encode(), global_sig):
        raise SignatureError(f"{sig_path.name}: the trusted comment was modified")
    return key, comment


# ------------------------------------------------------------------------------------------------ key locations
def config_dir() -> Path:
    return settings.config_dir()


def default_secret_key() -> Path:
    return Path(settings.get("JETSON_PIPELINE_SIGNING_KEY") or config_dir() / "signing.key")


def trusted_keys(extra: list[Path] | tuple[Path, ...] = ()) -> list[PublicKey]:
    """Public keys in <config>/trusted/*.pub, plus any given explicitly. A file in the trusted folder that is not a
    public key (damaged, a secret key, a stray file) is reported and skipped: one bad file must not stop every
    verify; a key given explicitly (--pubkey) that is not one is an error."""
    import sys
    keys = []
    for p in sorted((config_dir() / "trusted").glob("*.pub")):
        try:
            keys.append(PublicKey.load(p))
        except PipelineError as exc:
            print(f"warning: skipping trusted key {p}: {exc.message}", file=sys.stderr)
    return keys + [PublicKey.load(Path(p)) for p in extra]


def required_trusted_keys(pubkey: str | Path | None = None) -> list[PublicKey]:
    """trusted_keys(), plus `pubkey`; none at all is an error (a command that verifies needs one)."""
    from pipeline.errors import PipelineError
    keys = trusted_keys([Path(pubkey)] if pubkey else [])
    if not keys:
        raise PipelineError("no trusted public keys", "pass --pubkey KEY.pub or run `python -m pipeline trust KEY.pub`")
    return keys


def _write_new(path: Path, text: str, mode: int) -> Path:
    """A synced temporary file of `text` with `mode` from its creation (a secret is never world-readable, not even
    for a moment), ready to be renamed into place."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    return tmp


def keygen(secret_path: Path, trust: bool = True) -> tuple[Path, Path]:
    """A new signing key; its public half is written beside it and (by default) trusted locally.

    Both halves are written to temporary files and renamed, the public half first: a kill leaves no key (the
    next run makes one) or a complete pair, never an empty key or a key without its .pub."""
    secret_path = Path(secret_path)
    if secret_path.exists() or secret_path.is_symlink():
        raise PipelineError(f"{secret_path} already exists", "remove it first, or pass another path")
    secret_path.parent.mkdir(parents=True, exist_ok=True)
    key = SecretKey.generate()
    pub_path = secret_path.with_suffix(".pub")
    tmp_secret = _write_new(secret_path, key.dump(), 0o600)
    os.replace(_write_new(pub_path, key.public.dump(), 0o644), pub_path)
    os.replace(tmp_secret, secret_path)
    if trust:
        trust_key(pub_path, replace=key.public.id_hex)
    return secret_path, pub_path


def trust_key(pub_path: Path, replace: str | None = None) -> Path:
    """Trust the public key in `pub_path`. A trusted key of the same id but other bytes (key ids are chosen by whoever
    made the key) is replaced only with `replace` = that id, as printed by this refusal."""
    key = PublicKey.load(pub_path)
    dest = config_dir() / "trusted" / f"{key.id_hex}.pub"
    if dest.exists() or dest.is_symlink():
        try:
            old = PublicKey.load(dest)
        except PipelineError:
            old = None
        if old is not None and old.key == key.key:
            return dest
        if (replace or "").upper() != key.id_hex:
            raise PipelineError(f"{dest} already trusts another key with id {key.id_hex}: refusing to replace it",
                                f"if you mean to, run `python -m pipeline trust {pub_path} --replace {key.id_hex}`")
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(_write_new(dest, key.dump(), 0o644), dest)
    return dest


def device_secret() -> bytes:
    """This device's own secret (<config>/device.secret, made on first use, readable by its owner only): the key of
    its build records, so that whoever can write --work cannot forge one (everything a record says can be computed
    from the kit)."""
    import secrets

    from pipeline.files import read_regular
    path = config_dir() / "device.secret"
    try:
        text = read_regular(path, 256).decode("ascii").strip()
    except (PipelineError, OSError, UnicodeDecodeError):
        text = ""
    if len(text) == 64 and all(c in "0123456789abcdef" for c in text):
        return bytes.fromhex(text)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.replace(_write_new(path, secrets.token_hex(32) + "\n", 0o600), path)
    return bytes.fromhex(read_regular(path, 256).decode("ascii").strip())


def signing_key(path: Path | None = None, create: bool = False) -> SecretKey:
    path = Path(path) if path else default_secret_key()
    if not path.is_file():
        if not create:
            raise PipelineError(f"no signing key at {path}", "create one with `python -m pipeline keygen`")
        _, pub = keygen(path)
        from pipeline.progress import terminal
        print(f"created signing key {path}; copy {pub} to each device and run "
              f"`python -m pipeline trust {pub.name}` there", file=terminal())
    return SecretKey.load(path)
