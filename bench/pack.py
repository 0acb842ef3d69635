"""Pack and verify throughput vs `tar cf - DIR | sha256sum`, measured in the same run on the same 4 GB directory.

    .venv/bin/python bench/pack.py [--gb 4] [--zstd LEVEL]

The directory holds incompressible files (like weights). Every measurement starts with the data in the page cache
(it is read once first), so all three compare hashing and copying, not the disk. pack writes (and fsyncs) its parts;
the baseline writes nothing. verify = signature + file set + sha256 of every part (what `python -m pipeline
verify` does on the device).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    from pipeline.kit.archive import check_kit, pack
    from pipeline.kit.signing import SecretKey

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=4.0)
    ap.add_argument("--zstd", type=int, default=None)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="pack-bench-"))
    try:
        src = root / "artifact"
        (src / "checkpoint").mkdir(parents=True)
        total = int(args.gb * 1e9)
        sizes = [total // 4] * 4
        block = os.urandom(16 * 2**20)
        for i, size in enumerate(sizes):
            with open(src / "checkpoint" / f"rank{i}.safetensors", "wb") as fh:
                for off in range(0, size, len(block)):
                    fh.write(block[: min(len(block), size - off)])
        (src / "config.json").write_text("{}")
        subprocess.run(f"cat {src}/checkpoint/* > /dev/null", shell=True, check=True)

        def timed(fn):
            t = time.perf_counter()
            fn()
            return time.perf_counter() - t

        base = timed(lambda: subprocess.run(f"tar cf - -C {root} artifact | sha256sum > /dev/null", shell=True,
                                            check=True))
        key = SecretKey.generate()
        kit = root / "kit"
        t_pack = timed(lambda: pack(src, kit, "bench", "kit", key, zstd_level=args.zstd))
        subprocess.run(f"cat {kit}/* > /dev/null", shell=True, check=True)
        t_verify = timed(lambda: check_kit(kit, [key.public]))
        gb = total / 1e9
        print(f"{gb:.1f} GB, {'zstd-' + str(args.zstd) if args.zstd else 'uncompressed'}")
        print(f"{'':<28}{'s':>8}{'GB/s':>8}{'vs baseline':>13}")
        print(f"{'tar cf - | sha256sum':<28}{base:>8.2f}{gb / base:>8.2f}{'1.00':>13}")
        for name, t in (("pack (tar+parts+sign)", t_pack), ("verify (sig+parts)", t_verify)):
            print(f"{name:<28}{t:>8.2f}{gb / t:>8.2f}{base / t:>13.2f}")
        ok = base / t_pack >= 0.8 and base / t_verify >= 0.8
        print(f"{'PASS' if ok else 'FAIL'}: pack and verify at >= 80% of the baseline's throughput")
        return 0 if ok else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
