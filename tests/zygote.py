"""A warm interpreter for the tests' `python -m doit` and `python -m pipeline serve` runs: test infrastructure, not a
double. On this 2-core CI machine a run that imports torch, transformers and ModelOpt spends 13-15 s importing them
(a tiny recipe's whole build takes 16-27 s), and the tests start well over a hundred such runs.

The zygote is a process (one per pytest worker) that has imported those libraries and nothing of the pipeline. Each
run is a fork of it, into which the run's working directory, environment, argv and output files are set before the
module's own `__main__` runs: a fresh process with its own pid and exit status, running the code under test
exactly as `python -m doit ...` does (the pipeline's modules are imported in the child, after its environment is
set). A run whose environment differs from the zygote's in anything a library reads when it is imported (HF_*,
PYTHON*, OMP_*, TORCH*, ...) runs as a plain subprocess instead, as does every run when JETSON_TEST_ZYGOTE=off, and
every run on a machine where those imports initialize CUDA (a GPU machine: unforkable()), whose forks could not use it.
The one difference taken is directories added in front of PYTHONPATH (overlay()): the device half's runs carry the
test doubles' (the TensorRT-LLM and Edge-LLM runtime doubles), and the fork puts them on sys.path where a fresh
interpreter has them and forgets every warm module they shadow.

The processes those runs spawn with multiprocessing (the reference server's engine process, runtime/process.py:
11-13 s of imports each on this machine) come warm too. Each run's multiprocessing executable is `spawn-shim`, a
tiny interpreter script: multiprocessing execs it exactly as it would exec python (`-c "...spawn_main(...)"
--multiprocessing-fork`, the child's pipes and the resource tracker's descriptor passed at their numbers); the shim
hands those descriptors, its environment and directory to the zygote (SCM_RIGHTS), which forks a child that puts
them back at the same numbers and runs the same `-c` program: multiprocessing's own spawn_main, unpickling the same
process object. The shim stays the spawned child's parent-visible pid: it forwards signals to the fork and exits
with its status; killed itself, the zygote kills the fork. Anything else the shim is exec'd for (the resource
tracker, a run whose environment does not fit) is exec'd as the real interpreter.

The same shim starts the Edge-LLM exporter warm: the pipeline runs Edge-LLM's own export command as a subprocess
(`python -m tensorrt_edgellm.scripts.export`: each tower, audio encoder and speech graph), ~8 s of imports each on
this machine; and the device half's processes: its runner (`python -m pipeline.device.session_runner`), a served
bundle, the doubles' executables (trtllm-build, llm_inference, ...: python3 scripts, each importing torch), and a
board's `python -m pipeline ...` over ssh (its wrapper execs the shim: tests/sshserver.py remote_exec). In a run, a
subprocess of `[sys.executable, "-m", M, ...]` with M in EXEC_MODULES (or of a double's script) execs the shim in
python's place (the same argv after it); the shim hands its descriptors (the caller's pipes), environment and
directory to the zygote, whose fork runs M's `__main__` as `python -m M` would, and the caller reads its output and
exit status from the shim as it would from python. The zygote has imported the exporter's API (not the command's
module, which configures logging at import).
"""

from __future__ import annotations

import contextlib
import fcntl
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
        "modelopt.torch.export", "onnx", "safetensors.torch", "tokenizers", "fastapi", "uvicorn",
        "tensorrt_edgellm._export_api")
MODULES = ("doit", "pipeline")      # what a run may start (python -m MODULE)
# what a run's own subprocesses start warm (python -m M): Edge-LLM's exporter, and the device half's processes (its
# runners, a served bundle's `pipeline serve`, a board's commands over ssh)
EXEC_MODULES = ("tensorrt_edgellm.scripts.export", "pipeline", "pipeline.device.session_runner",
                "pipeline.device.set_runner", "pipeline.device.transducer_runner")
# the test doubles' executables (`#!/usr/bin/env python3` scripts standing in for trtllm-build, llm_inference, ...):
# a run's subprocess of one of them, where python3 on its PATH is this interpreter, is a warm fork too
DOUBLES_BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "doubles", "bin")


def import_env(env: dict) -> dict:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_ENV)}


def changed(env: dict, base: dict) -> list[str]:
    """The import-time variables whose values in `env` differ from `base`'s."""
    mine, theirs = import_env(base), import_env(env)
    return sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))


def overlay(env: dict, base: dict) -> list[str] | None:
    """The directories `env`'s PYTHONPATH adds to `base`'s, where that is all that differs between their
    import-time variables (the device half's processes run with the doubles' directories in front: a fork of the
    zygote puts them on sys.path and forgets the warm modules they shadow, as a fresh interpreter would never have
    imported those); None where anything else differs, or an entry is not an absolute directory."""
    if set(changed(env, base)) - {"PYTHONPATH"}:
        return None
    mine, theirs = import_env(base), import_env(env)
    had = [p for p in mine.get("PYTHONPATH", "").split(os.pathsep) if p]
    wants = [p for p in theirs.get("PYTHONPATH", "").split(os.pathsep) if p]
    added = [p for p in wants if p not in had]
    if [p for p in wants if p in had] != had or not all(os.path.isabs(p) and os.path.isdir(p) for p in added):
        return None
    return added


def _put_on_path(added: list[str]) -> None:
    """In a fork: the PYTHONPATH entries its request adds go where a fresh interpreter has them (after the script's
    directory, before the standard library), and every warm module one of them provides is forgotten, so that its
    import finds the entry's (the Edge-LLM runtime double's tensorrt_edgellm, not the wheel's)."""
    import importlib
    if not added:
        return
    sys.path[1:1] = added
    names = set()
    for entry in added:
        for name in os.listdir(entry):
            stem = name.split(".", 1)[0]
            if stem.isidentifier() and (name.endswith((".py", ".so")) or os.path.isdir(os.path.join(entry, name))):
                names.add(stem)
    for mod in [m for m in sys.modules if m.split(".", 1)[0] in names]:
        del sys.modules[mod]
    importlib.invalidate_caches()


def _child(req: dict, shim: str, added: list[str]) -> None:
    """In the forked child: become `python -m MODULE ARGS` in the request's directory and environment, its
    multiprocessing children spawned through `shim`."""
    import multiprocessing
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
        _put_on_path(added)
        sys.argv = [req["module"], *req["args"]]
        multiprocessing.set_executable(shim)
        _exec_warm(shim)
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


def _exec_warm(shim: str) -> None:
    """In a run: its subprocesses of `python -m M` (M in EXEC_MODULES), and of a test double's executable whose
    `python3` (its PATH's) is this interpreter, exec the shim in python's place."""
    popen = subprocess.Popen.__init__
    if getattr(popen, "_warm", False):
        return

    def init(self, args, *rest, **kw) -> None:
        if isinstance(args, list | tuple) and args:
            args = _warm_argv(list(args), shim, kw.get("env"))
        popen(self, args, *rest, **kw)
    init._warm = True       # type: ignore[attr-defined]
    subprocess.Popen.__init__ = init        # type: ignore[method-assign]


def _warm_argv(args: list, shim: str, env: dict | None) -> list:
    if len(args) > 2 and args[0] == sys.executable and args[1] == "-m" and args[2] in EXEC_MODULES:
        return [shim, *args[1:]]
    path = (env if env is not None else os.environ).get("PATH")
    exe = shutil.which(str(args[0]), path=path) if os.sep not in str(args[0]) else str(args[0])
    if exe is None or os.path.dirname(os.path.abspath(exe)) != DOUBLES_BIN:
        return args
    python3 = shutil.which("python3", path=path)
    with open(exe, "rb") as fh:
        interpreted = fh.readline().strip() == b"#!/usr/bin/env python3"
    if interpreted and python3 is not None and os.path.dirname(os.path.abspath(python3)) == os.path.dirname(
            sys.executable):        # this environment's python3, not another interpreter's (python3.10's)
        return [shim, os.path.abspath(exe), *args[1:]]
    return args


def _spawned(req: dict, fds: list[int], shim: str, added: list[str]) -> None:
    """In the forked child: the process multiprocessing spawned (the shim's request): its descriptors back at the
    numbers the shim had them at, its environment and directory, then the `-c` program it was exec'd with; or the
    module a run's subprocess asked for (kind "module": `-m M ARGS`), as `python -m M ARGS` runs it."""
    import runpy
    code = 1
    try:
        for sig in (signal.SIGTERM, signal.SIGPIPE, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)     # as a fresh interpreter has it
        with contextlib.suppress(OSError):      # the spawner's process group, as an exec'd child would be in
            os.setpgid(0, req["pgid"])
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 1024) for fd in fds]     # above every number they go back to
        for fd in fds:
            os.close(fd)
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, number in zip(high, req["fds"], strict=True):
            os.dup2(fd, number)     # fds 0-2 too: sys.stdout and sys.stderr write to the spawner's from here on
            os.close(fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        # the PYTHONPATH directories it adds (a spawned child's sys.path is then its parent's: what they shadow is
        # forgotten all the same)
        _put_on_path(added)
        # its own subprocesses warm too (a run's stage in a process of its own starts the exporter; the device half's
        # runner, the doubles' executables), and a module's or script's multiprocessing children
        _exec_warm(shim)
        if req["kind"] in ("module", "script"):
            import multiprocessing
            multiprocessing.set_executable(shim)
        if req["kind"] == "module":
            sys.argv = req["argv"][1:]
            sys.path[0] = req["cwd"]
            runpy.run_module(req["argv"][1], run_name="__main__", alter_sys=True)
        elif req["kind"] == "script":       # `python3 SCRIPT ARGS`: its directory first on sys.path
            sys.argv = req["argv"]
            sys.path[0] = os.path.dirname(req["argv"][0])
            runpy.run_path(req["argv"][0], run_name="__main__")
        else:
            sys.argv = ["-c", "--multiprocessing-fork"]
            sys.path[0] = ""
            exec(compile(req["argv"][-2], "<string>", "exec"), {"__name__": "__main__"})     # noqa: S102 - multiprocessing's own
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:       # noqa: BLE001 - printed as the interpreter would, then the exit status says it
        import traceback
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _flags() -> list[str]:
    """This interpreter's flags as multiprocessing passes them on (-B under PYTHONDONTWRITEBYTECODE, ...): a spawn
    asking for others gets an interpreter of its own. (Imported in serve(), before any thread forks: a fork made
    while another thread held a module's import lock would inherit it held.)"""
    from multiprocessing import util
    return util._args_from_interpreter_flags()


def _request(conn: socket.socket) -> tuple[dict, list[int]]:
    """A request: one JSON line, and the descriptors sent with it (a spawn request's)."""
    data, fds = b"", []
    while not data.endswith(b"\n"):
        chunk, got, _, _ = socket.recv_fds(conn, 1 << 16, 256)
        fds += got
        if not chunk:
            raise EOFError
        data += chunk
    return json.loads(data), fds


def _log_cold(req: dict, flags: bool) -> None:
    """JETSON_TEST_ZYGOTE_LOG=FILE (set when the tests start): each request the shim execs the interpreter for, with
    the import-time variables that kept it cold (to find a run that starts cold and need not)."""
    log = _STARTED_WITH.get("JETSON_TEST_ZYGOTE_LOG")
    if log:
        with open(log, "a") as fh:
            fh.write(json.dumps({"argv": req["argv"][:4], "changed": changed(req["env"], _STARTED_WITH),
                                 "flags": flags}) + "\n")


def _serve_one(conn: socket.socket, shim: str) -> None:
    with conn:
        try:
            req, fds = _request(conn)
        except (EOFError, OSError, ValueError):
            return
        shimmed = req.get("kind") in ("spawn", "module", "script")     # the shim's (else a run's, from the tests)
        flags = req["argv"][:-3] != _flags() if req.get("kind") == "spawn" else False
        added = overlay(req["env"], _STARTED_WITH)      # a run's fits it (its client asked: Zygote.fits)
        if shimmed and (added is None or flags):
            for fd in fds:
                os.close(fd)
            _log_cold(req, flags)
            conn.sendall(b"exec\n")        # the shim execs the real interpreter
            return
        pid = os.fork()
        if pid == 0:
            conn.close()
            _spawned(req, fds, shim, added or []) if shimmed else _child(req, shim, added or [])
        for fd in fds:
            os.close(fd)
        reaped = threading.Event()

        def lifeline() -> None:     # the shim's end closing before its fork has exited: the shim was killed
            with contextlib.suppress(OSError):
                conn.recv(1)
            if not reaped.is_set():
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        watch = threading.Thread(target=lifeline, daemon=True)
        if shimmed:
            watch.start()
        conn.sendall(f"{pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        reaped.set()
        with contextlib.suppress(OSError):
            conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
        if shimmed:
            watch.join(5)       # the shim reads the status and exits: its end closes


SHIM = """#!{python} -IS
# tests/zygote.py's spawn shim: multiprocessing (or a run, for python -m M) execs this as it would exec python; the
# zygote forks the process
import json, os, signal, socket, sys
argv = sys.argv[1:]
spawn = len(argv) >= 3 and argv[-3] == "-c" and "spawn_main(" in argv[-2] and argv[-1] == "--multiprocessing-fork"
module = len(argv) >= 2 and argv[0] == "-m" and argv[1] in {modules!r}
script = len(argv) >= 1 and os.path.dirname(argv[0]) == {doubles!r}
if spawn or module or script:
    fds = []
    for name in os.listdir("/proc/self/fd"):
        try:
            os.fstat(int(name))
            fds.append(int(name))
        except OSError:
            pass        # the listing's own directory, closed by now
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect({path!r})
    except OSError:         # the zygote is gone (its tests ended): the interpreter runs it
        os.execv({python!r}, [{python!r}, *argv])
    kind = "spawn" if spawn else "module" if module else "script"
    req = json.dumps({{"kind": kind, "argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "fds": fds,
                      "pgid": os.getpgid(0)}}).encode() + b"\\n"
    socket.send_fds(sock, [req[:1]], fds)
    sock.sendall(req[1:])
    lines = sock.makefile("r")
    first = lines.readline().strip()
    if first.isdigit():
        pid = int(first)
        for fd in fds:
            if fd > 2:
                os.close(fd)    # the fork holds them: they close when it exits, as the spawned child's would
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, lambda s, _f: os.kill(pid, s))
        status = lines.readline().strip()
        code = int(status) if status.lstrip("-").isdigit() else -signal.SIGKILL
        if code < 0:
            if -code != signal.SIGKILL:
                signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
        os._exit(code)
    sock.close()
os.execv({python!r}, [{python!r}, *argv])
"""


_STARTED_WITH: dict[str, str] = {}     # the zygote's environment before its imports (torch's add to it)


def unforkable() -> str | None:
    """Why a fork of this process could not run the code under test, if it could not: CUDA initialized by an import
    (a GPU machine: a forked child then fails with "Cannot re-initialize CUDA in forked subprocess" at its first
    CUDA call, and every doit-driven test with it)."""
    import torch
    return "CUDA was initialized while importing" if torch.cuda.is_initialized() else None


def serve(path: str) -> None:
    _STARTED_WITH.update(os.environ)
    for name in WARM:
        __import__(name)
    why = unforkable()
    if why:
        print(f"unforkable: {why}", flush=True)
        return
    _flags()
    shim = os.path.join(os.path.dirname(path), "spawn-shim")
    with open(shim, "w") as f:
        f.write(SHIM.format(python=sys.executable, path=path, modules=EXEC_MODULES, doubles=DOUBLES_BIN))
    os.chmod(shim, 0o755)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(64)
    print("ready", flush=True)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=_serve_one, args=(conn, shim), daemon=True).start()


class Unforkable(RuntimeError):
    """The zygote's imports left it in a state its forks cannot run in (unforkable() says which)."""


class Zygote:
    """The client side: start the zygote once, then run modules through it."""

    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="zygote-")
        self.path = os.path.join(self._dir, "sock")
        self.env = dict(os.environ)
        self.proc = subprocess.Popen([sys.executable, __file__, self.path], stdout=subprocess.PIPE, text=True,
                                     env=self.env, cwd=str(Path(__file__).parent))
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line.startswith("unforkable: "):
            self.proc.wait()
            shutil.rmtree(self._dir, ignore_errors=True)
            raise Unforkable(line.removeprefix("unforkable: "))
        if line != "ready":
            raise RuntimeError("the test zygote did not start")

    def changed(self, env: dict) -> list[str]:
        """The import-time variables whose values in `env` differ from the zygote's."""
        return changed(env, self.env)

    def fits(self, env: dict) -> bool:
        return overlay(env, self.env) is not None

    @property
    def shim(self) -> str:
        return os.path.join(self._dir, "spawn-shim")

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
_UNFORKABLE: list[str] = []     # why this machine's zygote could not be used (once found, runs start plain)


def zygote() -> Zygote | None:
    global _ZYGOTE
    if os.environ.get("JETSON_TEST_ZYGOTE") == "off" or not hasattr(os, "fork") or _UNFORKABLE:
        return None
    if _ZYGOTE is None:
        try:
            _ZYGOTE = Zygote()
        except Unforkable as exc:
            _UNFORKABLE.append(str(exc))
            print(f"tests/zygote.py: {exc}; doit and serve runs start as plain interpreters here", file=sys.stderr)
            return None
        import atexit
        atexit.register(_ZYGOTE.close)
    return _ZYGOTE


def warm_python() -> str:
    """An interpreter to exec as `python` for the device half's commands (a board's `python -m pipeline ...` over
    ssh, a device run): the shim, which forks the zygote where the command and environment fit it and execs this
    interpreter otherwise; this interpreter where the zygote is off."""
    z = zygote()
    return z.shim if z is not None else sys.executable


def zygote_started() -> Zygote | None:
    """The zygote if this process has started it (without starting it)."""
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
