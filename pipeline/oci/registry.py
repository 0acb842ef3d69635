"""An OCI-distribution registry as a kit store, through oras-py.

oras-py does what a client must get right with each registry: the auth challenge (bearer tokens, with basic
credentials from flags or the Docker/ORAS config and its credential helpers), the upload session's Location, the
repository URLs. Three things it does not do the way a 4 GB kit on an 8 GB board needs, so they are done here on its
session and auth: uploads stream from the file (its put_upload reads the whole blob into memory), downloads resume
with a Range request and are handed to the caller unchecked (the caller hashes and bounds them; its download_blob
writes whatever arrives), and every request has a time limit and a bounded retry (its default retries for minutes on
a dead address, with no timeout on a stalled one).
"""

from __future__ import annotations

import hashlib
import time
import typing
from collections.abc import Callable, Iterator
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.files import open_regular
from pipeline.oci import media
from pipeline.oci.artifact import Blob, NotFound
from pipeline.oci.http import (
    OPERATION_S,
    STALL_S,
    DeadlineExceeded,
    Watchdog,
    bound_session,
    read_small,
    strip_foreign_credentials,
)
from pipeline.oci.refs import RegistryRef

CONNECT_S, READ_S = 15, 120
RETRIES = (1.0, 3.0)        # waits before the 2nd and 3rd try of an idempotent request on a dropped connection
CHUNK = 2**20               # upload reads (each one is progress for the stall deadline)
READ_CHUNK = 2**20          # download reads: requests waits for a whole chunk, so a killed pull loses at most this
LOGIN_HINT = "pass --username USER --password-stdin, or log in once with `docker login HOST` / `oras login HOST`"


def _oras():
    try:
        import oras.auth.basic
        import oras.container
        import oras.provider
        import requests
    except ImportError:
        raise PipelineError("pushing to or pulling from a registry needs oras-py",
                            "pip install 'oras>=0.2.43' (or `pip install .[registry]`); an oci-layout: directory "
                            "needs nothing more") from None
    return oras, requests


class _Upload:
    """A file as a request body, streamed in chunks, counted for progress (requests sends `len()` as the length)."""

    def __init__(self, path: Path, size: int, progress: Callable[[int], None] | None, watch: Watchdog):
        self.fh, self.size, self.progress, self.watch = open_regular(path), size, progress, watch
        self.hash, self.sent = hashlib.sha256(), 0

    def __len__(self) -> int:
        return self.size

    def read(self, n: int = -1) -> bytes:
        self.watch.window(STALL_S, "the upload")
        data = self.fh.read(CHUNK if n is None or n < 0 else min(n, CHUNK))[:self.size - self.sent]
        self.hash.update(data)
        self.sent += len(data)
        if data and self.progress:
            self.progress(len(data))
        return data


class RegistryStore:
    def __init__(self, ref: RegistryRef, plain_http: bool = False, username: str | None = None,
                 password: str | None = None, timeout: float = OPERATION_S):
        oras, requests = _oras()
        self.ref, self.requests = ref, requests
        self.scheme = "http" if plain_http else "https"
        self.base = f"{self.scheme}://{ref.host}"
        self.watch = Watchdog(timeout, str(ref))
        self.binding, self.pinned = f"{ref.repository}:{ref.tag}", ref.digest is not None
        scheme = self._challenge()
        backend = "basic" if scheme == "basic" else "token"
        base: typing.Any = oras.provider.Registry
        unretried = base.do_request.__wrapped__
        store = self

        class Registry(base):
            def do_request(self, url, method="GET", data=None, headers=None, json=None, stream=False):
                headers = dict(headers or {})
                if isinstance(self.auth, oras.auth.basic.BasicAuth) and getattr(self.auth, "_basic_auth", None):
                    headers.update(self.auth.get_auth_header())     # up front: a streamed body is sent once
                foreign = strip_foreign_credentials(url, store.base, headers) is not headers
                for wait in (*RETRIES, None):
                    try:
                        if foreign:     # a URL the registry named on another origin: no credentials, no auth dance
                            return self.session.request(method, url, data=data, json=json, stream=stream,
                                                        headers=strip_foreign_credentials(url, store.base, headers))
                        return unretried(self, url, method, data, headers, json, stream)
                    except requests.exceptions.ConnectionError as exc:
                        if wait is None or method not in ("GET", "HEAD"):
                            raise store._unreachable(exc) from None
                        time.sleep(wait)
                    except requests.exceptions.RequestException as exc:
                        raise store._unreachable(exc) from None
                    except ValueError as exc:       # oras: "Cannot respond to request for authentication."
                        raise PipelineError(f"{store.ref}: the registry refused our credentials ({exc})",
                                            LOGIN_HINT) from None
                raise AssertionError("unreachable")

        self.registry = Registry(hostname=ref.host, insecure=plain_http, auth_backend=backend)
        bound_session(self.registry.session, self.watch, CONNECT_S, READ_S)
        self.container = oras.container.Container(ref.repository.rsplit("/", 1)[-1], registry=ref.host)
        namespace = ref.repository.rpartition("/")[0]
        self.container.registry, self.container.namespace = ref.host, namespace or None
        if username is not None:
            if password is None:
                raise PipelineError("--username needs a password", "pass it on stdin with --password-stdin")
            self.registry.auth.set_basic_auth(username, password)
        else:
            self.registry.auth.load_configs(self.container)      # ~/.docker/config.json, credential helpers
        if backend == "basic" and not getattr(self.registry.auth, "_basic_auth", None):
            raise PipelineError(f"{ref}: the registry asks for a user and password (HTTP 401, basic auth) and none "
                                "were given", LOGIN_HINT)

    def __str__(self) -> str:
        return str(self.ref)

    def _unreachable(self, exc: Exception) -> PipelineError:
        hint = "check the address and that the registry runs"
        if self.scheme == "https" and "SSL" in type(exc).__name__ + str(exc):
            hint = "a registry without TLS (a local one) needs --plain-http; one with its own CA: REQUESTS_CA_BUNDLE"
        return PipelineError(f"{self.ref}: cannot talk to the registry at {self.base} "
                             f"({type(exc).__name__}: {str(exc)[:160]})", hint)

    def _challenge(self) -> str | None:
        """The auth scheme the registry asks for at /v2/ (None: it asks for none)."""
        session = self.requests.Session()
        bound_session(session, self.watch, CONNECT_S, READ_S)
        try:
            r = session.request("GET", f"{self.base}/v2/", allow_redirects=False)
        except self.requests.exceptions.RequestException as exc:
            raise self._unreachable(exc) from None
        finally:
            session.close()
        if r.status_code == 401:
            return r.headers.get("WWW-Authenticate", "").split(" ", 1)[0].lower() or None
        if r.status_code not in (200, 404):
            raise PipelineError(f"{self.ref}: {self.base}/v2/ answers HTTP {r.status_code}: not an OCI registry API",
                                "check the host and port")
        return None

    def _url(self, path: str) -> str:
        return f"{self.scheme}://{path}"

    def _fail(self, r, what: str, hint: str = "check the reference and the registry's log") -> PipelineError:
        if r.status_code in (401, 403):
            return PipelineError(f"{self.ref}: {what}: the registry says HTTP {r.status_code} (not allowed)",
                                 LOGIN_HINT)
        try:
            read_small(r, self.watch)
            errors = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in r.json().get("errors", []))
        except DeadlineExceeded:
            raise
        except Exception:       # any body: the registry's error text is optional
            errors = ""
        return PipelineError(f"{self.ref}: {what}: HTTP {r.status_code}" + (f" ({errors[:200]})" if errors else ""),
                             hint)

    # ------------------------------------------------------------------------------------------------ reading
    def get_manifest(self) -> bytes:
        url = self._url(self.container.manifest_url(self.ref.reference))
        with self.registry.do_request(url, "GET", headers={"Accept": media.OCI_MANIFEST}, stream=True) as r:
            if r.status_code == 404:
                raise NotFound(f"{self.ref}: no such tag or repository in the registry",
                                    "check the reference (the tag `push` printed)")
            if r.status_code != 200:
                raise self._fail(r, "cannot read the manifest")
            raw = b""
            for data in self._chunks(r, 65536, "the manifest"):
                raw += data
                if len(raw) > media.MAX_MANIFEST:
                    raise PipelineError(f"{self.ref}: the manifest is larger than {media.MAX_MANIFEST} bytes: not a "
                                        "kit's", "check the reference")
        if self.ref.digest and f"sha256:{hashlib.sha256(raw).hexdigest()}" != self.ref.digest:
            raise PipelineError(f"{self.ref}: the registry's manifest does not hash to the pinned digest",
                                "the registry is damaged or not the one you pushed to; nothing was fetched")
        return raw

    def read_blob(self, blob: Blob, offset: int) -> tuple[int, Iterator[bytes]]:
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        r = self.registry.do_request(self._url(self.container.get_blob_url(blob.digest)), "GET", headers=headers,
                                     stream=True)
        if r.status_code not in (200, 206):
            r.close()
            raise self._fail(r, f"cannot fetch {blob.name} ({blob.digest})",
                             "the registry lost the blob: push the kit again")
        start = offset if r.status_code == 206 else 0

        def chunks() -> Iterator[bytes]:
            with r:
                yield from self._chunks(r, READ_CHUNK, blob.name)
        return start, chunks()

    def _chunks(self, r, size: int, what: str) -> Iterator[bytes]:
        """The body's chunks, each within STALL_S of the one before (the watchdog cuts a stalled stream)."""
        try:
            self.watch.window(STALL_S, what)
            for data in r.iter_content(size):
                yield data
                self.watch.window(STALL_S, what)
        except DeadlineExceeded:
            raise
        except self.requests.exceptions.RequestException as exc:
            if self.watch.expired is not None:
                raise self.watch.error() from None
            raise self._unreachable(exc) from None

    def has_blob(self, blob: Blob) -> bool:
        """The registry says it holds this blob: its size, and the digest it names (a registry is content-addressed:
        an answer without the digest, or with another, is not taken as having it)."""
        r = self.registry.do_request(self._url(self.container.get_blob_url(blob.digest)), "HEAD")
        return r.status_code == 200 and r.headers.get("Content-Length") == str(blob.size) and \
            r.headers.get("Docker-Content-Digest") == blob.digest

    # ------------------------------------------------------------------------------------------------ writing
    def _session(self) -> str:
        r = self.registry.do_request(self._url(self.container.upload_blob_url()), "POST",
                                     headers={"Content-Length": "0"})
        location = self.registry._get_location(r, self.container)
        if r.status_code != 202 or not location:
            raise self._fail(r, "cannot start an upload")
        return location

    def put_blob(self, blob: Blob, source: Path | bytes, progress: Callable[[int], None] | None = None) -> None:
        import oras.utils
        url = oras.utils.append_url_params(self._session(), {"digest": blob.digest})
        body: typing.Any = source if isinstance(source, bytes) else _Upload(source, blob.size, progress, self.watch)
        try:
            r = self.registry.do_request(url, "PUT", data=body, headers={"Content-Type": "application/octet-stream",
                                                                       "Content-Length": str(blob.size)})
        finally:
            if isinstance(body, _Upload):
                body.fh.close()
        if r.status_code == 400 and "DIGEST_INVALID" in r.text:
            raise PipelineError(f"{source if isinstance(source, Path) else blob.name}: the registry computed another "
                                f"digest than the kit's signed {blob.digest}: the file is damaged",
                                "check the kit with `python -m pipeline verify`; nothing was tagged")
        if r.status_code not in (201, 204):
            raise self._fail(r, f"cannot upload {blob.name}")
        if isinstance(body, _Upload) and (body.sent != blob.size or body.hash.hexdigest() != blob.hex):
            raise PipelineError(f"{blob.name}: sent {body.sent} bytes hashing to sha256:{body.hash.hexdigest()}, but "
                                f"the kit's signed checksums say {blob.size} bytes, {blob.digest}: the file changed or "
                                   "is damaged", "nothing was tagged; check the kit with `python -m pipeline verify`")

    def put_manifest(self, raw: bytes) -> str:
        r = self.registry.do_request(self._url(self.container.manifest_url(self.ref.tag)), "PUT", data=raw,
                                     headers={"Content-Type": media.OCI_MANIFEST})
        if r.status_code not in (200, 201):
            raise self._fail(r, "cannot tag the manifest")
        return f"sha256:{hashlib.sha256(raw).hexdigest()}"
