"""runtime/process.py: a session in a process of its own. The reference backend through it answers exactly as in
this process; what the child session does (answers, refusals, death, a parent that dies) reaches the parent as the
Session contract says."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pipeline.errors import PipelineError
from pipeline.runtime import process
from pipeline.runtime.process import Channel, ProcessSession, split_cpus
from pipeline.runtime.session import Constraint, Event, Generation, Sampling, generate_blocking
from tests.scripted_session import open_refused, open_scripted
from tests.serving import REPO


def gen(*prompt: int, n: int = 3) -> Generation:
    return Generation(tuple(prompt), "", n, Sampling(), ())


def test_the_channel_carries_frames_of_any_size_in_order_then_eof():
    """Frames of 0 bytes to past the pipe's 64 KiB buffer (written in parts while read), several landing in one read
    and one split over many, arrive whole and in order; the writer's close is EOFError; a closed channel sends
    nothing (its descriptor numbers may be reused)."""
    import multiprocessing
    ctx = multiprocessing.get_context("spawn")
    (a_in, b_out), (b_in, a_out) = ctx.Pipe(duplex=False), ctx.Pipe(duplex=False)
    a, b = Channel(a_in, a_out), Channel(b_in, b_out)
    small = [(n, bytes([n % 251]) * n) for n in (0, 1, 7, 8, 9, 4096)]
    large = [(n, bytes([n % 251]) * n) for n in (65535, 65536, 65537, 3 << 20)] * 2
    for f in small:         # all in the pipe before the first read: one read takes them all
        b.send(f)
    writer = threading.Thread(target=lambda: [b.send(f) for f in large])
    writer.start()
    assert [a.recv() for _ in small + large] == small + large
    writer.join()
    b.send(("event", 1, Event([7], final=True, reason="stop")))
    b.close()
    assert a.recv() == ("event", 1, Event([7], final=True, reason="stop"))
    with pytest.raises(EOFError):
        a.recv()
    with pytest.raises(ValueError, match="closed"):
        b.send(("cancel", 1))
    a.close()


def test_requests_and_events_cross_as_flat_tuples_with_every_field():
    """Wire: every field of a Generation (its Sampling included) and of an Event, none at its default, comes back
    equal from a tuple that holds no dataclass but the ones inside an event's log-probabilities and a guide."""
    from pipeline.runtime.process import Wire
    from pipeline.runtime.session import TokenLogprob
    g = Generation((1, 2, 3), "a b c", 7, Sampling(0.7, 0.9, 40, 11, 1.1, 0.2, 0.3, 0.05), (2, 9),
                   Constraint({"type": "object"}, "<tool_call>"), 3, (b"\x89PNG",))
    flat = Wire.generation(g)
    assert type(flat) is tuple and not any(isinstance(v, (Generation, Sampling)) for v in flat)
    assert flat[3] == (0.7, 0.9, 40, 11, 1.1, 0.2, 0.3, 0.05)
    assert Wire.to_generation(flat) == g
    ev = Event([5, 6], final=True, reason="stop", error="e", logprobs=[TokenLogprob(-0.5, ((5, -0.5), (6, -1.0)))])
    assert Wire.event(ev) == ([5, 6], True, "stop", "e", ev.logprobs)
    assert Wire.to_event(Wire.event(ev)) == ev


@pytest.fixture(scope="module")
def scripted():
    s = ProcessSession(open_scripted, "scripted")
    yield s
    s.close()


def test_answers_and_what_the_session_says_of_itself_come_from_the_child(scripted):
    assert generate_blocking(scripted, gen(5, n=4), timeout=10) == ([6, 7, 8, 9], "length")
    assert (scripted.backend, scripted.applies, scripted.limits.max_seq_len) == ("scripted", {"min_p"}, 128)
    assert scripted.stats()["pid"] not in (os.getpid(), 0.0)       # asked of the child, answered by it
    assert scripted.guide(Constraint({"type": "object", "b": 1})) == "grammar of ['b', 'type']"


def test_concurrent_requests_each_get_their_own_tokens(scripted):
    out: dict[int, list[int]] = {}

    def one(first: int) -> None:
        out[first] = generate_blocking(scripted, gen(first, n=5), timeout=20)[0]
    threads = [threading.Thread(target=one, args=(k * 100,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == {k * 100: [k * 100 + i for i in range(1, 6)] for k in range(6)}


def test_a_schema_the_child_cannot_compile_is_a_value_error_here(scripted):
    with pytest.raises(ValueError, match="schema: no type"):
        scripted.guide(Constraint({"properties": {}}))


def test_a_cancelled_request_gets_no_further_event(scripted):
    events: list[Event] = []
    handle = scripted.submit(gen(1, n=50), events.append)
    deadline = time.monotonic() + 10
    while not events and time.monotonic() < deadline:
        time.sleep(0.005)
    scripted.cancel(handle)
    seen = len(events)
    time.sleep(0.2)         # 20 more steps of the script
    assert 1 <= seen <= 2 and len(events) == seen and not any(e.final for e in events)


def test_a_session_that_fails_to_open_raises_its_own_error_here():
    with pytest.raises(PipelineError) as exc:
        ProcessSession(open_refused, "refused")
    assert exc.value.message == "tiny: its quantize stage is not built"
    assert exc.value.hint == "run `doit build recipe=tiny` first"


def test_a_child_that_dies_fails_the_session_and_the_requests_in_flight():
    s = ProcessSession(open_scripted, "dying")
    events: list[Event] = []
    done = threading.Event()
    s.submit(gen(-1, n=10), lambda ev: (events.append(ev), ev.final and done.set()))
    assert done.wait(20)
    assert [e.tokens for e in events] == [[0], []]
    assert events[-1].final and events[-1].error == "the scripted engine process exited (code 7)"
    assert s.failure == "the scripted engine process exited (code 7)"
    with pytest.raises(RuntimeError, match=r"exited \(code 7\)"):
        s.submit(gen(1), lambda ev: None)
    s.close()


def test_close_ends_the_child_with_a_request_still_running():
    s = ProcessSession(functools.partial(open_scripted, 0.01), "closing")
    s.submit(gen(-2), lambda ev: None)      # never answers
    child = s._proc
    t = time.monotonic()
    s.close()
    assert not child.is_alive() and child.exitcode == 0 and time.monotonic() - t < 10


PARENT = """
import sys, time
sys.path.insert(0, {repo!r})
from pipeline.runtime.process import ProcessSession
from tests.scripted_session import open_scripted
s = ProcessSession(open_scripted, "orphan")
print(s._proc.pid, flush=True)
time.sleep(60)
"""


def ended(pid: int) -> bool:
    """Gone, or a zombie nobody reaped yet (its parent was killed; here PID 1 may not reap)."""
    try:
        return "(zombie)" in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True


def test_a_child_whose_parent_is_killed_exits():
    parent = subprocess.Popen([sys.executable, "-c", PARENT.format(repo=str(REPO))], stdout=subprocess.PIPE,
                              text=True, cwd=REPO)
    try:
        child = int(parent.stdout.readline())
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not ended(child):
            time.sleep(0.05)
        assert ended(child)
    finally:
        if parent.poll() is None:
            parent.kill()


@pytest.mark.parametrize(("cpus", "threads", "split"), [
    ({0, 1}, 1, ({1}, {0})),
    ({0, 1, 2, 3}, 3, ({1, 2, 3}, {0})),
    ({4, 6, 9}, 1, ({9}, {4, 6})),
    ({0, 1}, 2, None),          # no CPU left to the server: nothing pinned
    ({0}, 1, None),
])
def test_the_engine_takes_the_last_cpus_and_the_server_keeps_the_rest(monkeypatch, cpus, threads, split):
    monkeypatch.setattr(process.os, "sched_getaffinity", lambda _pid: cpus)
    assert split_cpus(threads) == (None if split is None else tuple(frozenset(s) for s in split))


@pytest.mark.integration
def test_the_reference_session_in_its_own_process_answers_as_in_this_one(kit, monkeypatch):
    project, _, _ = kit
    for k, v in project.env.items():
        monkeypatch.setenv(k, v)
    from pipeline.graph.reference import from_recipe

    served, here = from_recipe("tiny-llama-cpu", threads=1, own_process=False)
    _, apart = from_recipe("tiny-llama-cpu", threads=1)
    cpus = frozenset(os.sched_getaffinity(0))
    a, b = here(), apart()      # the server's loader: this process keeps the CPUs the engine does not take
    try:
        if len(cpus) > 1:
            assert os.sched_getaffinity(0) == cpus - {max(cpus)}
            assert os.sched_getaffinity(b._proc.pid) == {max(cpus)}
        assert type(b) is ProcessSession and b.backend == a.backend == "reference" and b.limits == a.limits
        for p in served.goldens.prompts:
            g = Generation(tuple(p.input_ids), p.prompt, len(p.output_ids), Sampling(), served.stop_ids)
            assert generate_blocking(b, g, timeout=60) == generate_blocking(a, g, timeout=60)
            assert generate_blocking(b, g, timeout=60)[0] == list(p.output_ids)
        seeded = Generation(tuple(served.goldens.prompts[0].input_ids), "", 12,
                            Sampling(temperature=0.9, top_p=0.9, seed=3), served.stop_ids)
        assert generate_blocking(b, seeded, timeout=60) == generate_blocking(a, seeded, timeout=60)
    finally:
        a.close()
        b.close()
        process.keep_cpus(cpus)     # the rest of this test session runs where it ran
