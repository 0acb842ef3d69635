"""The boards of a fleet, read from the Ansible INI inventory the fleet playbook
(pipeline/data/fleet-install-bundle.yml) is run with, so one file names the fleet for both:

    [jetsons]
    nano1 ansible_host=10.0.0.11 ansible_user=nvidia
    nano2 ansible_host=10.0.0.12 ansible_port=2222 pipeline_python=/opt/venv/bin/python

    [jetsons:vars]
    pipeline_dir=/opt/jetson-pipeline

    [robots:children]
    jetsons

A group's boards are its own hosts and its children's, in the order the file names them (the rollout's order: its
first board is the canary unless one is named); `:vars` apply to the group's hosts, a host's own variables win. One
exact reader: anything it does not understand (YAML inventories, host ranges like nano[1:4], a value without
key=) is an error naming the file and line, never a guess, and the file is read bounded.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.errors import PipelineError

MAX_BYTES = 1 << 20
MAX_BOARDS = 10_000
NAME = re.compile(r"\A[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")
HEADER = re.compile(r"\A\[([A-Za-z0-9_.-]+)(?::(vars|children))?\]\Z")


@dataclass(frozen=True)
class Board:
    """One board of the fleet: its inventory name, where its SSH server is, and its variables."""
    name: str
    host: str
    port: int = 22
    user: str | None = None
    vars: dict[str, str] = field(default_factory=dict)


@dataclass
class _Group:
    hosts: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    vars: dict[str, str] = field(default_factory=dict)


def read_inventory(path: Path, group: str = "all") -> list[Board]:
    """The boards of `group` (default: every host of the file) in the inventory at `path`."""
    from pipeline.files import read_regular
    try:
        text = read_regular(path, MAX_BYTES, follow=True).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PipelineError(f"{path}: not a readable UTF-8 inventory ({exc})", "give the Ansible INI inventory the "
                            "fleet playbook runs with") from None
    groups: dict[str, _Group] = {"all": _Group(), "ungrouped": _Group()}
    hosts: dict[str, dict[str, str]] = {}
    section, kind = "ungrouped", None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        where = f"{path}:{number}"
        m = HEADER.match(line)
        if m:
            section, kind = m[1], m[2]
            groups.setdefault(section, _Group())
            continue
        if line.startswith("["):
            raise PipelineError(f"{where}: {line[:60]!r} is not a [group], [group:vars] or [group:children] header",
                                "use Ansible's INI inventory format")
        try:
            words = shlex.split(line, comments=True)
        except ValueError as exc:
            raise PipelineError(f"{where}: {exc}", "quote values as Ansible's INI inventory does") from None
        if kind == "vars":
            groups[section].vars.update(_pairs(words, where))
        elif kind == "children":
            groups[section].children += [_name(w, where, "group") for w in words]
        else:
            name = _name(words[0], where, "host")
            hosts.setdefault(name, {}).update(_pairs(words[1:], where))
            if name not in groups[section].hosts:
                groups[section].hosts.append(name)
            if len(hosts) > MAX_BOARDS:
                raise PipelineError(f"{path}: more than {MAX_BOARDS} hosts", "split the fleet into groups")
    if group not in groups:
        named = sorted(g for g in groups if g not in ("all", "ungrouped"))
        raise PipelineError(f"{path}: no group {group!r} (groups: {', '.join(named) or 'none'})",
                            "name a group of the inventory (--group)")
    names, group_vars = _members(group, groups, path)
    if not names:
        raise PipelineError(f"{path}: group {group!r} has no hosts", "add the boards to the group")
    return [_board(n, {**group_vars.get(n, {}), **hosts[n]}, path) for n in names]


def _members(group: str, groups: dict[str, _Group], path: Path) -> tuple[list[str], dict[str, dict[str, str]]]:
    """The group's hosts in order (its own, then each child's, each host once) and the group variables each host
    gets: every group holding it contributes, `all` first, a child group's over its parent's (Ansible's order; the
    host's own variables then win over them all)."""
    depth: dict[str, int] = {}

    def hosts_of(g: str, trail: tuple[str, ...]) -> list[str]:
        if g in trail:
            raise PipelineError(f"{path}: group {g!r} is its own child ({' > '.join((*trail, g))})",
                                "remove the cycle from the [group:children] sections")
        if g not in groups:
            raise PipelineError(f"{path}: [{trail[-1]}:children] names {g!r}, which no section defines",
                                "define the group, or remove it from the children")
        depth[g] = max(depth.get(g, 0), len(trail))
        out = list(groups[g].hosts) if g != "all" else [h for grp in groups.values() for h in grp.hosts]
        for child in groups[g].children:
            out += hosts_of(child, (*trail, g))
        return list(dict.fromkeys(out))

    members = {g: hosts_of(g, ()) for g in groups}
    for g in groups:        # a group's depth: how far below a parent it sits (parents' variables come first)
        for child in groups[g].children:
            depth[child] = max(depth.get(child, 0), depth.get(g, 0) + 1)
    names = members[group]
    order = sorted(groups, key=lambda g: (g != "all", depth.get(g, 0)))
    inherited = {h: {k: v for g in order if h in members[g] for k, v in groups[g].vars.items()} for h in names}
    return names, inherited


def _pairs(words: list[str], where: str) -> dict[str, str]:
    out = {}
    for w in words:
        key, eq, value = w.partition("=")
        if not eq or not NAME.match(key):
            raise PipelineError(f"{where}: {w[:60]!r} is not key=value", "write each variable as key=value")
        out[key] = value
    return out


def _name(word: str, where: str, what: str) -> str:
    if not NAME.match(word):
        raise PipelineError(f"{where}: {word[:60]!r} is not a {what} name this reader takes (letters, digits, "
                            "'_', '.', '-'; no ranges)", f"list each {what} on its own line, by name")
    return word


def _board(name: str, v: dict[str, str], path: Path) -> Board:
    port = v.get("ansible_port", "22")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise PipelineError(f"{path}: host {name}: ansible_port = {port!r} is not a port", "give a number 1-65535")
    return Board(name, v.get("ansible_host", name), int(port), v.get("ansible_user"),
                 {k: val for k, val in v.items() if k not in ("ansible_host", "ansible_port", "ansible_user")})
