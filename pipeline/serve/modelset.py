"""Several models behind one server (`serve A B`, `serve --board NAME`): each request goes to the model it names, each
model keeps its own admission (max_batch_size running, --max-queue waiting) and metrics, and memory is shared by plan.

Resident models are loaded when the server starts and held. On-demand models are loaded when a request (or
POST /models/load) names them and unloaded once idle past their keep_alive, or sooner, least recently used first,
to make room for another: as Ollama (`keep_alive` per request: seconds or a duration such as "5m"; 0 unloads as soon
as the model is idle; a negative value holds it) and llama.cpp's router mode (POST /models/load and /models/unload,
LRU eviction). A model is loaded only where the planned memory of the models loaded then, its own added, stays within
the set's budget (the board's usable memory, as `plan --board` counts it); where the others are busy it gets a 503 to
retry, never a load that does not fit. Each model's planned figure is its plan's total at the limits its engine was
built with, which its KV cache cannot grow past (pipeline/boards.py says why), so no model takes another's memory.

A request for a model that is loading waits for it at most --load-wait seconds (within its own deadline), then gets
a 503 with Retry-After: never a hang. An idle model is one no admitted request uses and no arriving request holds
(`acquire` holds it from the moment its request names it until it is admitted or refused).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from pipeline.serve.errors import ApiError
from pipeline.serve.metrics import Metrics
from pipeline.serve.server import Server

log = logging.getLogger("pipeline.serve")
UNLOADED, LOADING, LOADED, FAILED, UNLOADING = "unloaded", "loading", "loaded", "failed", "unloading"
KEEP_ALIVE_S = 300.0        # Ollama's default: an on-demand model stays 5 minutes after its last request
LOAD_WAIT_S = 60.0          # how long a request waits for its model to load before a 503 (--load-wait)
SWEEP_S = 0.5               # how often idle models are checked against their keep_alive
GB = 1e9
_DURATION = re.compile(r"^(-?\d+(?:\.\d+)?)(ms|s|m|h)?$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


@dataclass(frozen=True)
class SetSpec:
    """A board's set as `serve --board` takes it (the CLI reads the board file): each model's name and whether it is
    resident, and the memory budget with where it came from."""
    models: tuple[tuple[str, bool], ...]
    budget: int | None
    budget_said: str


@dataclass
class Member:
    server: Server
    resident: bool
    state: str = UNLOADED
    holds: int = 0                      # requests that named it and are not admitted or refused yet
    keep_alive: float = KEEP_ALIVE_S    # the last request's keep_alive (negative: held)
    task: asyncio.Task | None = field(default=None, repr=False)    # its load or unload under way

    @property
    def name(self) -> str:
        return self.server.served.name

    @property
    def planned(self) -> int:
        return self.server.served.planned_bytes

    @property
    def idle(self) -> bool:
        return self.holds == 0 and self.server.admitted == 0


def keep_alive_of(value: object) -> float | None:
    """A request's keep_alive in seconds (None: not given): a number of seconds or Ollama's duration string ("5m",
    "30s", "1h", "-1"); anything else is a 400 naming the field."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ApiError(400, "keep_alive must be seconds (a number) or a duration such as \"5m\"", "keep_alive")
    if isinstance(value, str):
        m = _DURATION.match(value.strip())
        if m is None:
            raise ApiError(400, f"keep_alive {value[:40]!r} is not a duration: write seconds, or e.g. \"30s\", \"5m\", "
                           "\"1h\" (negative: keep it loaded)", "keep_alive")
        return float(m[1]) * _UNIT_S[m[2]]
    return float(value)


class ModelSet:
    """The served models by name, the memory they share, and what every request shares whatever its model."""

    def __init__(self, servers: Sequence[tuple[Server, bool]], metrics: Metrics, budget: int | None = None,
                 budget_said: str = "", load_wait: float = LOAD_WAIT_S, keep_alive: float = KEEP_ALIVE_S):
        self.members = {s.served.name: Member(s, resident, keep_alive=keep_alive) for s, resident in servers}
        self.metrics, self.budget, self.budget_said = metrics, budget, budget_said
        self.load_wait = load_wait
        self.default = next(iter(self.members.values()))
        metrics.planned.set_function(lambda: float(self.planned_loaded()))

    def overcommitted(self) -> str | None:
        """Why the set cannot be served within its budget by plan (the resident models, or one on-demand model beside
        them, past it), or None."""
        if self.budget is None:
            return None
        if self.resident_planned > self.budget:
            return (f"the resident models are planned at {self.resident_planned / GB:.2f} GB, past "
                    f"{self.budget / GB:.2f} GB ({self.budget_said})")
        extra = max((m for m in self.members.values() if not m.resident), key=lambda m: m.planned, default=None)
        return self._never_fits(extra) if extra is not None else None

    @property
    def resident_planned(self) -> int:
        return sum(m.planned for m in self.members.values() if m.resident)

    def _never_fits(self, member: Member) -> str | None:
        """Why the on-demand `member` can never load within the budget (beside the resident models), or None."""
        if self.budget is None or self.resident_planned + member.planned <= self.budget:
            return None
        return (f"{member.name} (on demand, planned {member.planned / GB:.2f} GB) cannot load beside the resident "
                f"models ({self.resident_planned / GB:.2f} GB) within the budget {self.budget / GB:.2f} GB "
                f"({self.budget_said})")

    @property
    def only(self) -> Server | None:
        """The one model of a single-model server (which answers whatever model a request names, as before)."""
        return self.default.server if len(self.members) == 1 else None

    def pick(self, model: object) -> Member:
        """The member a request names: a set's omitted name gets its first model. A single-model server's only model
        (its request's name is checked where it always was, as the request is prepared: serve/prepare.py)."""
        if len(self.members) == 1 or model is None:
            return self.default
        return self.named(model)

    def named(self, model: object) -> Member:
        """The member called `model`: a 400 where it is not a string, a 404 listing what is served where none is."""
        if not isinstance(model, str):
            raise ApiError(400, "model must name a served model", "model")
        member = self.members.get(model)
        if member is None:
            raise ApiError(404, f"the model {model[:200]!r} does not exist; this server serves "
                           f"{', '.join(map(repr, self.members))}", "model", "model_not_found")
        return member

    def planned_loaded(self) -> int:
        """The planned memory of the resident models (held from the server's start) and of the on-demand ones
        loaded, loading or still unloading."""
        return sum(m.planned for m in self.members.values()
                   if m.resident or m.state in (LOADING, LOADED, UNLOADING))

    def state(self, member: Member) -> str:
        if member.resident:       # loaded with the server: its Server says how that went
            s = member.server
            return LOADED if s.ready else FAILED if s.load_error or s.session is not None else LOADING
        return member.state

    # -- requests
    async def acquire(self, member: Member, keep_alive: float | None, deadline: float) -> Server:
        """Hold `member` for a request arriving now and have it loaded (an on-demand one loads here, within `deadline`
        (monotonic) and --load-wait); `release` ends the hold once the request is admitted or refused."""
        member.holds += 1
        try:
            if keep_alive is not None and not member.resident:
                member.keep_alive = keep_alive
            if not member.resident:
                await self._loaded(member, min(self.load_wait, max(0.0, deadline - time.monotonic())))
            return member.server
        except BaseException:
            member.holds -= 1
            raise

    def release(self, member: Member) -> None:
        member.holds -= 1
        member.server.last_active = time.monotonic()

    async def _loaded(self, member: Member, wait: float) -> None:
        if member.state == UNLOADING and member.task is not None:
            await self._wait(member, wait)
        if member.state in (UNLOADED, FAILED):
            evict = self._room_for(member)
            for m in evict:
                self._start_unload(m, "evicted")
            member.state = LOADING
            member.task = asyncio.create_task(self._load(member, [m.task for m in evict if m.task is not None]))
        if member.state == LOADING:
            await self._wait(member, wait)
        if member.state == FAILED:
            raise ApiError(503, f"{member.name} failed to load: {member.server.load_error}", code="model_load_failed",
                           headers={"Retry-After": "30"})

    async def _wait(self, member: Member, wait: float) -> None:
        task = member.task
        if task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), wait)
        except TimeoutError:
            raise ApiError(503, f"{member.name} is {member.state} (waited {wait:g} s); retry shortly",
                           code="model_loading", headers={"Retry-After": "5"}) from None

    def _room_for(self, member: Member) -> list[Member]:
        """The idle on-demand models to unload, least recently used first, so that `member` fits the budget; a 503
        where it cannot fit now (the others busy) or ever (the resident models and it pass the budget)."""
        if self.budget is None:
            return []
        over = self.planned_loaded() + member.planned - self.budget
        if over <= 0:
            return []
        never = self._never_fits(member)
        if never is not None:
            raise ApiError(503, never, code="model_does_not_fit")
        chosen, freed = [], 0
        for m in sorted((m for m in self.members.values() if not m.resident and m.state == LOADED and m.idle),
                        key=lambda m: m.server.last_active):
            if freed >= over:
                break
            chosen.append(m)
            freed += m.planned
        if freed < over:
            busy = [m.name for m in self.members.values() if not m.resident and m.state in (LOADED, LOADING)]
            raise ApiError(503, f"{member.name} (planned {member.planned / GB:.2f} GB) does not fit within the budget "
                           f"{self.budget / GB:.2f} GB ({self.budget_said}) "
                           f"while {', '.join(busy)} {'is' if len(busy) == 1 else 'are'} in use; retry shortly",
                           code="model_does_not_fit", headers={"Retry-After": "5"})
        return chosen

    async def _load(self, member: Member, evicting: list[asyncio.Task]) -> None:
        if evicting:        # their memory first
            await asyncio.gather(*evicting, return_exceptions=True)
        log.info("loading %s (on demand, planned %.2f GB)", member.name, member.planned / GB)
        await asyncio.to_thread(member.server.load)
        member.state = LOADED if member.server.ready else FAILED

    def _start_unload(self, member: Member, reason: str) -> None:
        member.state = UNLOADING
        member.task = asyncio.create_task(self._unload(member, reason))

    async def _unload(self, member: Member, reason: str) -> None:
        log.info("unloading %s (%s)", member.name, reason)
        try:
            await asyncio.to_thread(member.server.unload)
        finally:
            member.state = UNLOADED
            member.server.metrics.unloaded(reason)

    # -- explicit control (POST /models/load, /models/unload)
    async def load(self, member: Member, keep_alive: float | None) -> str:
        if member.resident:
            return self.state(member)
        await self.acquire(member, keep_alive, time.monotonic() + self.load_wait)
        self.release(member)
        return member.state

    async def unload(self, member: Member) -> None:
        if member.resident:
            raise ApiError(409, f"{member.name} is resident: loaded with the server and held (its board file or "
                           "the command line says so)", "model", "model_resident")
        if member.state in (UNLOADED, FAILED):
            return
        if member.state != LOADED or not member.idle:
            raise ApiError(409, f"{member.name} is {'in use' if member.state == LOADED else member.state}; retry "
                           "once its requests end", "model", "model_busy", headers={"Retry-After": "5"})
        self._start_unload(member, "asked")
        if member.task is not None:
            await member.task

    # -- the server's life
    def load_resident(self) -> None:
        """Load the resident models one after another (a thread of the server's start: /health says loading)."""
        for m in self.members.values():
            if m.resident:
                m.server.load()

    async def sweep(self) -> None:
        """Unload the on-demand models idle past their keep_alive, for the server's life."""
        while True:
            await asyncio.sleep(SWEEP_S)
            now = time.monotonic()
            for m in self.members.values():
                if not m.resident and m.state == LOADED and m.idle and m.keep_alive >= 0 and \
                        now - m.server.last_active >= m.keep_alive:
                    self._start_unload(m, "keep_alive")

    def close(self) -> None:
        for m in self.members.values():
            if m.server.session is not None:
                m.server.session.close()

    @property
    def ready(self) -> bool:
        """Every resident model loaded (an on-demand one loads when asked)."""
        return all(m.server.ready for m in self.members.values() if m.resident)

    def states(self) -> dict[str, str]:
        return {m.name: self.state(m) for m in self.members.values()}
