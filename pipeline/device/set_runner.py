"""On the device: every model of a set loaded at once through the session `serve` uses, then each asked its golden
prompts, all models at the same time (a thread per model), so the board holds the whole set while its memory is
watched (install_set.py). Each model's answers are returned as a validation record of its own.

    python3 -m pipeline.device.set_runner --out set-validation.json --model KIT ENGINE [--model KIT ENGINE ...]

Runs with the device's runtime (Python 3.10 on JetPack 6); standard library and the runtime only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from pathlib import Path

from pipeline import contract
from pipeline.device.session_runner import golden_results
from pipeline.runtime.session import Limits, Session


def run(models: list[tuple[Path, Path]]) -> list[contract.Validation]:
    from pipeline.runtime.engines import SESSIONS

    opened: list[tuple[Session, contract.Goldens, str]] = []
    try:
        for kit_dir, engine_dir in models:        # one after another: each load sees the others' memory taken
            plan = contract.Plan.load(kit_dir / contract.PLAN)
            lim = plan.limits
            session_type = SESSIONS[plan.backend or ""]
            session = session_type.open(engine_dir, plan, Limits(lim.max_batch_size, lim.max_input_len,
                                                                 lim.max_seq_len))
            opened.append((session, contract.Goldens.load(kit_dir / contract.GOLDENS), session_type.__name__))
        results: list[list[contract.PromptResult] | BaseException | None] = [None] * len(opened)

        def ask(i: int) -> None:
            try:
                results[i] = golden_results(opened[i][0], opened[i][1])
            except BaseException as exc:        # noqa: BLE001 - reported below, in the main thread
                results[i] = exc
        threads = [threading.Thread(target=ask, args=(i,), daemon=True) for i in range(len(opened))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out = []
        for (session, _, name), r in zip(opened, results, strict=True):
            if not isinstance(r, list):
                raise RuntimeError(f"{name}: {r}")
            out.append(contract.Validation(runtime=f"{name} (the serve session, every model of the set loaded)",
                                           speed_source="not measured: the models ran at the same time",
                                           prompts=r, kv_cache_stats=session.kv_stats()))
        return out
    finally:
        for session, _, _ in opened:
            session.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m pipeline.device.set_runner", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", nargs=2, action="append", required=True, metavar=("KIT_DIR", "ENGINE_DIR"),
                    help="a verified bundle's kit records and its engine directory (repeat for each model)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    result = run([(Path(k), Path(e)) for k, e in args.model])
    # created, never written through: the work directory may hold anything under this name
    fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as fh:
        json.dump({"validations": [v.to_dict() for v in result]}, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
