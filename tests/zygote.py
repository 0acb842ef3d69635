"""A warm interpreter for the tests' `python -m doit` and `python -m pipeline serve` runs: test infrastructure, not a
double. On this 2-core CI machine a run that imports torch, transformers and ModelOpt spends 13-15 s importing them
(a tiny recipe's whole build takes 16-27 s), and the tests start well over a hundred such runs.

The zygote is a process (one per pytest worker) that has imported those libraries and nothing of the pipeline. Each
run is a fork of it, into which the run's working directory, environment, argv and output files are set before the
module's own `__main__` runs: a fresh process with its own pid and exit status, running the code under test
exactly as `python -m doit ...` does (the pipeline's modules are imported in the child, after its environment is
set). A run whose environment differs from the zygote's in anything a library reads when it is imported (HF_*,
PYTHON*, OMP_*, TORCH*, ...) runs as a plain subprocess instead, as does every run when JETSON_TEST_ZYGOTE=off.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

# what a library may read when it is imported: a run whose values differ from the zygote's gets a fresh interpreter
IMPORT_TIME_ENV = ("HF_", "HUGGINGFACE", "TRANSFORMERS", "TORCH", "PYTORCH", "OMP_", "MKL_", "CUDA", "PYTHON",
                   "TOKENIZERS", "MODELOPT", "XDG_", "HOME", "LD_", "NVIDIA", "TRITON", "KMP_")
WARM = ("torch", "transformers", "transformers.models.llama.modeling_llama", "modelopt.torch.quantization",
        "modelopt.torch.export", "onnx", "safetensors.torch", "tokenizers", "fastapi", "uvicorn")
MODULES = ("doit", "pipeline")      # what a run may start (python -m MODULE)


def _import_env(env: dict) -> dict:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_ENV)}


def _child(req: dict) -> None:
    """In the forked child: become `python -m MODULE ARGS` in the request's directory and environment."""
    import runpy
    code = 1
    try:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        if req.get("new_group"):
            os.setpgid(0, 0)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(f, fd)
            os.close(f)
        sys.stdout = open(1, "w", buffering=1, closefd=False)     # noqa: SIM115 - fds 1/2 live as long as the child
        sys.stderr = open(2, "w", buffering=1, closefd=False)     # noqa: SIM115
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        sys.path[0] = req["cwd"]
        sys.argv = [req["module"], *req["args"]]
        runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int | type(None)):
            print(exc.code, file=sys.stderr)
    except BaseException:       # noqa: BLE001 - printed as the interpreter would, then the exit status says it
        import traceback
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _serve_one(conn: socket.socket) -> None:
    with conn:
        req = json.loads(conn.makefile("r").readline())
        pid = os.fork()
        if pid == 0:
            conn.close()
            _child(req)
        conn.sendall(f"{pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        with contextlib.suppress(OSError):
            conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())


def serve(path: str) -> None:
    for name in WARM:
        __import__(name)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(64)
    print("ready", flush=True)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=_serve_one, args=(conn,), daemon=True).start()


class Zygote:
    """The client side: start the zygote once, then run modules through it."""

    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="zygote-")
        self.path = os.path.join(self._dir, "sock")
        self.env = dict(os.environ)
        self.proc = subprocess.Popen([sys.executable, __file__, self.path], stdout=subprocess.PIPE, text=True,
                                     env=self.env, cwd=str(Path(__file__).parent))
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the test zygote did not start")

    def fits(self, env: dict) -> bool:
        return _import_env(env) == _import_env(self.env)

    def start(self, module: str, args: list[str], env: dict, cwd: str, stdout: str, stderr: str,
              new_group: bool = False) -> tuple[socket.socket, int]:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(self.path)
        sock.sendall((json.dumps({"module": module, "args": args, "env": env, "cwd": cwd, "stdout": stdout,
                                  "stderr": stderr, "new_group": new_group}) + "\n").encode())
        return sock, int(sock.makefile("r").readline())

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)      # its socket's directory: none left behind in /tmp


_ZYGOTE: Zygote | None = None


def zygote() -> Zygote | None:
    global _ZYGOTE
    if os.environ.get("JETSON_TEST_ZYGOTE") == "off" or not hasattr(os, "fork"):
        return None
    if _ZYGOTE is None:
        _ZYGOTE = Zygote()
        import atexit
        atexit.register(_ZYGOTE.close)
    return _ZYGOTE


def run_module(module: str, args: list[str], env: dict, cwd: Path | str | None = None,
               timeout: float | None = None) -> subprocess.CompletedProcess:
    """`subprocess.run([python, -m, module, *args], env=env, cwd=cwd, capture_output=True, text=True,
    timeout=timeout)`, through the zygote where the environment fits it."""
    assert module in MODULES
    cwd = str(cwd or os.getcwd())
    z = zygote()
    argv = [sys.executable, "-m", module, *args]
    if z is None or not z.fits(env):
        return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    with tempfile.TemporaryDirectory(prefix="zrun-") as tmp:
        out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        sock, pid = z.start(module, list(args), env, cwd, out, err)
        with sock:
            sock.settimeout(timeout)
            try:
                line = sock.makefile("r").readline()
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(argv, timeout or 0) from None
            code = int(line) if line.strip() else -signal.SIGKILL
        return subprocess.CompletedProcess(argv, code, Path(out).read_text(errors="replace"),
                                           Path(err).read_text(errors="replace"))


class ZygoteProcess:
    """What the tests use of a `subprocess.Popen` of a long-running module (a server), started through the zygote:
    pid, poll(), wait(), terminate(), kill(), send_signal(), returncode."""

    def __init__(self, module: str, args: list[str], env: dict, cwd: str, stdout: str, stderr: str):
        z = zygote()
        assert z is not None
        self.args = [sys.executable, "-m", module, *args]
        self._sock, self.pid = z.start(module, args, env, cwd, stdout, stderr)
        self.returncode: int | None = None
        self._lines = self._sock.makefile("r")
        self._done = threading.Event()
        threading.Thread(target=self._reap, daemon=True).start()

    def _reap(self) -> None:
        try:
            line = self._lines.readline()
            self.returncode = int(line) if line.strip() else -signal.SIGKILL
        except (OSError, ValueError):
            self.returncode = -signal.SIGKILL
        self._done.set()
        self._sock.close()

    def poll(self) -> int | None:
        return self.returncode if self._done.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if not self._done.is_set():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


if __name__ == "__main__":
    serve(sys.argv[1])
