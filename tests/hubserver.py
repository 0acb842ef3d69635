"""A minimal local stand-in for the Hugging Face hub's HTTP API, for testing the real huggingface_hub client.

Serves one repo from a directory at one commit: model info (revision -> commit, file list), HEAD/GET of
/{repo}/resolve/{revision}/{file} with the headers the client reads (X-Repo-Commit, ETag, Content-Length), byte
ranges (resume), an optional bearer token requirement (gated repo), and a log of every request.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


class Hub:
    def __init__(self, repo: str, files: Path, commit: str, branches=("main",), token: str | None = None):
        self.repo, self.files, self.commit, self.branches, self.token = repo, files, commit, set(branches), token
        self.requests: list[tuple[str, str, dict]] = []
        self.fail_after: dict[str, int] = {}   # file -> bytes to send before dropping the connection
        self.failures = 0                       # how many more GETs of such a file are cut (then it is served whole)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _route(self):
                hub.requests.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
                if hub.token and self.headers.get("authorization") != f"Bearer {hub.token}":
                    return self._send(401, b'{"error": "Access to model is restricted"}',
                                      {"X-Error-Code": "GatedRepo", "X-Error-Message": "gated"})
                path = unquote(urlparse(self.path).path)
                api = f"/api/models/{hub.repo}/revision/"
                if path.startswith(api):
                    rev = path[len(api):]
                    if rev not in hub.branches and rev != hub.commit:
                        return self._send(404, b'{"error": "Invalid rev id"}', {"X-Error-Code": "RevisionNotFound"})
                    body = {"id": hub.repo, "modelId": hub.repo, "sha": hub.commit, "private": False,
                            "siblings": [{"rfilename": p.name} for p in sorted(hub.files.iterdir())]}
                    return self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"})
                tree = f"/api/models/{hub.repo}/tree/"
                if path.startswith(tree):
                    rev = path[len(tree):]
                    if rev not in hub.branches and rev != hub.commit:
                        return self._send(404, b'{"error": "Invalid rev id"}', {"X-Error-Code": "RevisionNotFound"})
                    body = [{"type": "file", "path": p.name, "size": p.stat().st_size,
                             "oid": hashlib.sha1(p.read_bytes()).hexdigest()} for p in sorted(hub.files.iterdir())]
                    return self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"})
                prefix = f"/{hub.repo}/resolve/"
                if path.startswith(prefix):
                    rev, _, name = path[len(prefix):].partition("/")
                    f = hub.files / name
                    if (rev not in hub.branches and rev != hub.commit) or not f.is_file():
                        return self._send(404, b"not found", {"X-Error-Code": "EntryNotFound"})
                    data = f.read_bytes()
                    start = 0
                    rng = self.headers.get("range")
                    if rng and rng.startswith("bytes="):
                        start = int(rng[6:].split("-")[0])
                    headers = {"X-Repo-Commit": hub.commit, "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                               "Content-Length": str(len(data) - start), "Accept-Ranges": "bytes"}
                    if start:
                        headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                    body = data[start:] if self.command == "GET" else b""
                    cut = None
                    if self.command == "GET" and name in hub.fail_after and hub.failures > 0:
                        hub.failures -= 1
                        cut = max(0, hub.fail_after[name] - start)
                    return self._send(206 if start else 200, body, headers, cut=cut)
                return self._send(404, b"not found", {})

            def _send(self, code, body, headers, cut=None):
                self.send_response(code)
                for k, v in headers.items():
                    self.send_header(k, v)
                if "Content-Length" not in headers:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body if cut is None else body[:cut])
                    if cut is not None:
                        self.wfile.flush()
                        self.connection.shutdown(2)

            do_GET = do_HEAD = _route

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
