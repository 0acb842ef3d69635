"""Pack and verify throughput vs a baseline that does the same work with stock tools, in the same run, on the same
4 GB directory.

    .venv/bin/python bench/pack.py [--gb 4] [--zstd LEVEL]

The directory holds incompressible files (like weights). Every measurement starts with the data in the page cache
(it is read once first), so they compare hashing, copying and writing, not reading the disk. pack writes its
parts, hashes them and fsyncs each; the baseline is `tar cf - DIR | tee PART | openssl dgst -sha256` then `sync`:
the same bytes written, hashed and flushed. verify = signature + file set + sha256 of every part (what
`python -m pipeline verify` does on the device); its baseline is `openssl dgst -sha256` of the parts.
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
# The fastest stock SHA-256: openssl uses the CPU's SHA instructions (1.07 GB/s on the 2-core CI machine, where
# coreutils' sha256sum does 0.22 GB/s and would make the baseline hash-bound).
HASH = "openssl dgst -sha256" if shutil.which("openssl") else "sha256sum"


def main() -> int:
    from pipeline.kit.archive import pack
    from pipeline.kit.signing import SecretKey
    from pipeline.kit.verify import check_kit

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

        subprocess.run("sync", check=True)       # nothing dirty left over from creating the data
        base_dir = root / "baseline"
        base_dir.mkdir()
        base = timed(lambda: subprocess.run(f"tar cf - -C {root} artifact | tee {base_dir}/part | {HASH} "
                                            "> /dev/null && sync", shell=True, check=True))
        subprocess.run(f"cat {base_dir}/part > /dev/null", shell=True, check=True)   # cached, like the kit below
        base_verify = timed(lambda: subprocess.run(f"{HASH} {base_dir}/part > /dev/null", shell=True,
                                                   check=True))
        shutil.rmtree(base_dir)
        subprocess.run("sync", check=True)
        key = SecretKey.generate()
        kit = root / "bench"
        t_pack = timed(lambda: pack(src, kit, "bench", "kit", key, zstd_level=args.zstd))
        subprocess.run(f"cat {kit}/* > /dev/null", shell=True, check=True)
        t_verify = timed(lambda: check_kit(kit, [key.public]))
        gb = total / 1e9
        print(f"{gb:.2f} GB, {'zstd-' + str(args.zstd) if args.zstd else 'uncompressed'}")
        print(f"{'':<40}{'s':>8}{'GB/s':>8}{'vs baseline':>13}")
        print(f"{'tar cf - | tee PART | ' + HASH + '; sync':<40}{base:>8.2f}{gb / base:>8.2f}{'1.00':>13}")
        print(f"{'pack (tar+parts+hash+fsync+sign)':<40}{t_pack:>8.2f}{gb / t_pack:>8.2f}{base / t_pack:>13.2f}")
        print(f"{HASH + ' PART':<40}{base_verify:>8.2f}{gb / base_verify:>8.2f}{'1.00':>13}")
        print(f"{'verify (sig+parts)':<40}{t_verify:>8.2f}{gb / t_verify:>8.2f}{base_verify / t_verify:>13.2f}")
        ok = base / t_pack >= 0.9 and base_verify / t_verify >= 0.9
        print(f"{'PASS' if ok else 'FAIL'}: pack and verify at >= 90% of their baselines' throughput")
        return 0 if ok else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
