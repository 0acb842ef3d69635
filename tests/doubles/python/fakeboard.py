"""For the TEST DOUBLES of builders and runtimes: a recorded board's /proc/meminfo made to show memory being taken.

A real build or runtime takes memory from the board; on a recorded board (tests/fixtures/devices, copied by the test)
nothing would. `taking(root, n, seconds)` lowers MemAvailable by n bytes (and, past what is available, SwapFree) for
`seconds`, as the driver's memory watch sees a real process do, then restores the file; `held(root, n)` lowers it
until the function it returns is called (a served model's memory, taken for as long as it is loaded).
"""
import contextlib
import os
import re
import time
from pathlib import Path


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".meminfo.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


@contextlib.contextmanager
def taking(root: Path, n: int, seconds: float):
    path = Path(root) / "proc" / "meminfo"
    before = path.read_text()
    fields = {k: int(v) * 1024 for k, v in re.findall(r"^(\w+):\s+(\d+) kB", before, re.M)}
    avail, swap = fields.get("MemAvailable", 0), fields.get("SwapFree", 0)
    ram = min(n, avail)
    after = re.sub(r"^(MemAvailable:\s+)\d+", lambda m: f"{m.group(1)}{(avail - ram) // 1024}", before, flags=re.M)
    if n > ram:
        after = re.sub(r"^(SwapFree:\s+)\d+", lambda m: f"{m.group(1)}{max(0, swap - (n - ram)) // 1024}", after,
                       flags=re.M)
    _write(path, after)
    try:
        time.sleep(seconds)
        yield
    finally:
        _write(path, before)


def _shift(path: Path, delta: int) -> None:
    """MemAvailable moved by delta bytes (never below zero), the rest of the file as it is now."""
    text = path.read_text()
    _write(path, re.sub(r"^(MemAvailable:\s+)(\d+)",
                        lambda m: f"{m.group(1)}{max(0, int(m.group(2)) + delta // 1024)}", text, flags=re.M))


def held(root: Path, n: int):
    path = Path(root) / "proc" / "meminfo"
    _shift(path, -n)
    done = []

    def release() -> None:
        if not done:
            done.append(True)
            _shift(path, n)
    return release
