"""Where a kit is pushed to or pulled from: a registry repository or an OCI image layout directory.

    oci://HOST[:PORT]/REPO[:TAG]            any OCI-distribution registry (TLS unless --plain-http)
    oci://HOST[:PORT]/REPO@sha256:HEX       pinned to one manifest (pull only): its bytes must hash to HEX
    oci-layout:DIR[:TAG]                    an OCI image layout directory (a stick, an air-gapped mirror)

The tag defaults to `latest`, as docker and oras do. Names follow the OCI distribution spec's grammar, so a
reference the registry would refuse is refused here, naming the part that is wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import PipelineError

DEFAULT_TAG = "latest"
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
REPOSITORY = re.compile(rf"{COMPONENT}(?:/{COMPONENT})*")
HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
                  r"|\[[0-9A-Fa-f:.]+\]")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
FORMS = "oci://HOST[:PORT]/REPO[:TAG] or oci-layout:DIR[:TAG]"


@dataclass(frozen=True)
class RegistryRef:
    host: str               # HOST[:PORT], as the registry's URL and docker's config name it
    repository: str
    tag: str = DEFAULT_TAG
    digest: str | None = None

    @property
    def reference(self) -> str:
        """What the registry's /manifests/ endpoint takes: the digest if pinned, else the tag."""
        return self.digest or self.tag

    def __str__(self) -> str:
        return f"oci://{self.host}/{self.repository}" + (f"@{self.digest}" if self.digest else f":{self.tag}")


@dataclass(frozen=True)
class LayoutRef:
    directory: Path
    tag: str = DEFAULT_TAG

    def __str__(self) -> str:
        return f"oci-layout:{self.directory}:{self.tag}"


Ref = RegistryRef | LayoutRef


def _bad(text: str, what: str) -> PipelineError:
    return PipelineError(f"{text!r}: {what}", f"write it as {FORMS}, e.g. oci://registry.local:5000/kits/llama:v1")


def parse_ref(text: str) -> Ref:
    if text.startswith("oci-layout:"):
        rest = text[len("oci-layout:"):]
        directory, tag = rest, DEFAULT_TAG
        head, sep, tail = rest.rpartition(":")
        if sep and "/" not in tail:
            if not TAG.fullmatch(tail):
                raise _bad(text, f"tag {tail!r} is not a valid tag (letters, digits, '_', '.', '-'; at most 128)")
            directory, tag = head, tail
        if not directory:
            raise _bad(text, "no layout directory")
        return LayoutRef(Path(directory), tag)
    if not text.startswith("oci://"):
        raise _bad(text, "not a kit reference")
    rest = text[len("oci://"):]
    host, sep, path = rest.partition("/")
    if not sep or not path:
        raise _bad(text, "no repository after the registry host")
    name, port = host, None
    if host.startswith("["):
        name, _, after = host.partition("]")
        name += "]"
        port = after[1:] if after.startswith(":") else (None if not after else "")
    elif ":" in host:
        name, port = host.rsplit(":", 1)
    if not HOST.fullmatch(name) or (port is not None and not (port.isdigit() and 0 < int(port) < 65536)):
        raise _bad(text, f"registry host {host!r} is not HOST or HOST:PORT")
    digest = None
    if "@" in path:
        path, digest = path.split("@", 1)
        if not DIGEST.fullmatch(digest):
            raise _bad(text, f"digest {digest!r} is not sha256:<64 hex digits>")
    repository, tag = path, DEFAULT_TAG
    if ":" in path:
        repository, tag = path.rsplit(":", 1)
        if not TAG.fullmatch(tag):
            raise _bad(text, f"tag {tag!r} is not a valid tag (letters, digits, '_', '.', '-'; at most 128)")
    if not REPOSITORY.fullmatch(repository) or len(repository) > 255:
        raise _bad(text, f"repository {repository!r} is not a valid name (lower-case letters and digits, "
                         "separated by '/', '.', '_' or '-')")
    return RegistryRef(host, repository, tag, digest)
