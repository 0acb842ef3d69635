"""Starting and stopping `python -m pipeline serve` for the tests: a free port on 127.0.0.1, waiting for /health."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.zygote import ZygoteProcess, zygote

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen | ZygoteProcess) -> None:
    """SIGTERM, then SIGKILL after 10 s: a test's server never outlives it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def health(url: str) -> tuple[int, dict] | None:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            status, body = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read()
    except OSError:
        return None
    try:
        return status, json.loads(body)
    except ValueError:      # not the server's JSON: another program answers on that port
        return status, {}


class Served:
    """A server process; `seen` holds every /health answer while it came up."""

    def __init__(self, args: list[str], env: dict, cwd: Path, log: Path, wait: bool = True, preexec_fn=None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = args[args.index("--api-key") + 1] if "--api-key" in args else None
        self.log = log
        argv = ["serve", *args, "--port", str(self.port)]
        z = zygote()
        self.proc: subprocess.Popen | ZygoteProcess
        if z is not None and z.fits(env) and preexec_fn is None:     # a warm interpreter (tests/zygote.py)
            log.write_text("")
            self.proc = ZygoteProcess("pipeline", argv, env, str(cwd), str(log), str(log))
        else:
            self.proc = subprocess.Popen([sys.executable, "-m", "pipeline", *argv], env=env, cwd=cwd,
                                         stdout=log.open("w"), stderr=subprocess.STDOUT, preexec_fn=preexec_fn)
        self.seen: list[tuple[int, dict]] = []
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited {self.proc.returncode}:\n{self.log.read_text()}")
            h = health(self.url)
            if h is not None:
                self.seen.append(h)
                if h[0] == 200:
                    return
            time.sleep(0.05)
        raise AssertionError(f"the server was not ready in {timeout} s:\n{self.log.read_text()}")

    def stop(self) -> None:
        stop_process(self.proc)

    def drained(self, timeout: float = 10) -> dict[str, float]:
        """The metrics once no request runs, or after `timeout` s (a cancellation is seen at the engine's next
        step): the caller asserts on them."""
        deadline = time.monotonic() + timeout
        while (m := self.metrics())["jetson_llm_requests_running"] and time.monotonic() < deadline:
            time.sleep(0.05)
        return m

    def metrics(self) -> dict[str, float]:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        with urllib.request.urlopen(urllib.request.Request(self.url + "/metrics", headers=headers), timeout=5) as r:
            text = r.read().decode()
        return parse_metrics(text)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text by series; a model's series (its `model` label) also summed under the series without that
    label, the server's total across its models (`jetson_llm_requests_running`)."""
    import re
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
            bare = re.sub(r'model="[^"]*",?', "", name).replace(",}", "}").replace("{}", "")
            if bare != name:
                out[bare] = out.get(bare, 0.0) + float(value)
    return out


@contextlib.contextmanager
def serving(kit, log: Path, *args: str, **kw):
    """`python -m pipeline serve tiny-llama-cpu ARGS` on the default recipe's build, stopped when the block ends."""
    project, _, _ = kit
    s = Served(["tiny-llama-cpu", *args], project.env, REPO, log, **kw)
    try:
        yield s
    finally:
        s.stop()


def built_goldens(project):
    """The goldens a project's `doit build` made (its one goldens stage)."""
    from pipeline import contract
    (stage,) = [p for p in (project.artifacts / "stages" / "goldens").iterdir() if (p / "stage.json").is_file()]
    return contract.Goldens.load(stage / contract.GOLDENS)


def served_golden_answers(project, recipe: str, goldens, log: Path) -> list[tuple[str, str]]:
    """`serve RECIPE` asked each golden chat prompt through the openai client, greedy and as long as its golden
    answer: (its answer, the golden text) per prompt."""
    from openai import OpenAI
    s = Served([recipe], project.env, Path(__file__).resolve().parents[1], log)
    try:
        client = OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        return [(client.chat.completions.create(model=recipe, temperature=0, max_tokens=len(p.output_ids),
                                                messages=[{"role": "user", "content": p.prompt}])
                 .choices[0].message.content, p.text) for p in goldens.prompts]
    finally:
        s.stop()


@contextlib.contextmanager
def trickling_image_host():
    """An image host on 127.0.0.1 that answers every GET with a 100,000-byte PNG's headers, then a byte every 0.2 s
    for as long as the client reads (what an allowed host that trickles looks like): yields its URL."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    stop = threading.Event()

    def trickle(conn) -> None:
        with conn:
            conn.recv(4096)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: 100000\r\n\r\n")
            while not stop.is_set():
                try:
                    conn.sendall(b"x")
                except OSError:
                    return
                time.sleep(0.2)

    def host() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=trickle, args=(conn,), daemon=True).start()
    threading.Thread(target=host, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/slow.png"
    finally:
        stop.set()
        listener.close()
