"""pull + verify of a kit from a local OCI registry vs `curl` of the same blobs + `sha256sum`, side by side in one
run; and a push of the unchanged kit, which must upload nothing.

    .venv/bin/python bench/registry.py [--gb 4] [--repeat 2]

The registry is the CNCF distribution registry (Debian's docker-registry; `./bootstrap.sh --test-tools`) on
127.0.0.1 with filesystem storage; the kit holds incompressible data (like weights). After the push every blob is in
the page cache, so both sides compare fetching over HTTP, hashing and writing, not the disk. Baseline: for each of
the kit's blobs, `curl -o FILE URL` then `sha256sum FILE` (the hash a user would check by hand; `openssl dgst
-sha256`, the fastest stock hash, is printed too). Ours: `pull` (manifest, signature and checksums first, each part
hashed while it streams, then the whole kit verified as `verify` does, then moved into place). Best of --repeat each,
alternating. PASS: pull + verify within 1.3x of curl + sha256sum, and the second push sent 0 bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    from pipeline.kit.archive import pack
    from pipeline.kit.signing import SecretKey
    from pipeline.oci.refs import RegistryRef
    from pipeline.oci.transfer import open_store, pull, push
    from tests.ociregistry import BINARY, Registry

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=4.0)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    if BINARY is None or not shutil.which("curl"):
        print("bench/registry.py needs docker-registry and curl: ./bootstrap.sh --test-tools", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="registry-bench-"))
    os.environ["JETSON_PIPELINE_HOME"] = str(root / "home")
    reg = None
    try:
        src = root / "artifact"
        (src / "checkpoint").mkdir(parents=True)
        total = int(args.gb * 1e9)
        block = os.urandom(16 * 2**20)
        with open(src / "checkpoint" / "rank0.safetensors", "wb") as fh:
            for off in range(0, total, len(block)):
                fh.write(block[: min(len(block), total - off)])
        (src / "config.json").write_text("{}")
        key = SecretKey.generate()
        kit = pack(src, root / "bench", "bench", "kit", key).path
        shutil.rmtree(src)
        reg = Registry(root / "registry")
        ref = RegistryRef(reg.host, "bench/kits", "v1")
        t = time.perf_counter()
        _, sent_first, _ = push(kit, open_store(ref, plain_http=True), [key.public], signer=key)
        t_push = time.perf_counter() - t
        t = time.perf_counter()
        _, sent_again, kept = push(kit, open_store(ref, plain_http=True), [key.public], signer=key)
        t_repush = time.perf_counter() - t

        manifest = json.loads(subprocess.run(
            ["curl", "-sf", "-H", "Accept: application/vnd.oci.image.manifest.v1+json",
             f"http://{reg.host}/v2/bench/kits/manifests/v1"], capture_output=True, check=True).stdout)
        digests = [layer["digest"] for layer in manifest["layers"]]
        size = sum(layer["size"] for layer in manifest["layers"])

        def baseline(hasher: str) -> float:
            out = root / "curl"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            t = time.perf_counter()
            for d in digests:
                subprocess.run(["curl", "-sf", "-o", str(out / d[7:]), f"http://{reg.host}/v2/bench/kits/blobs/{d}"],
                               check=True)
                subprocess.run(f"{hasher} {out / d[7:]} > /dev/null", shell=True, check=True)
            return time.perf_counter() - t

        def ours() -> float:
            dest = root / "device"
            shutil.rmtree(dest, ignore_errors=True)
            t = time.perf_counter()
            pull(open_store(ref, plain_http=True), dest, [key.public], say=lambda _: None)
            return time.perf_counter() - t

        base, base_ssl, mine = [], [], []
        for _ in range(max(1, args.repeat)):
            base.append(baseline("sha256sum"))
            mine.append(ours())
            base_ssl.append(baseline("openssl dgst -sha256"))
        b, o, m = min(base), min(base_ssl), min(mine)
        gb = size / 1e9
        print(f"{gb:.2f} GB kit, {len(digests)} blobs, local registry ({reg.host}); best of {len(base)}")
        print(f"{'':<44}{'s':>8}{'GB/s':>8}{'vs baseline':>13}")
        print(f"{'curl each blob + sha256sum (baseline)':<44}{b:>8.2f}{gb / b:>8.2f}{'1.00':>13}")
        print(f"{'curl each blob + openssl dgst -sha256':<44}{o:>8.2f}{gb / o:>8.2f}{o / b:>13.2f}")
        print(f"{'pull + verify (pipeline)':<44}{m:>8.2f}{gb / m:>8.2f}{m / b:>13.2f}")
        print(f"push: {sent_first / 1e9:.2f} GB in {t_push:.2f} s; again unchanged: {sent_again} bytes sent, "
              f"{kept / 1e9:.2f} GB already there, {t_repush:.2f} s")
        ok = m <= 1.3 * b and sent_again == 0
        print(f"{'PASS' if ok else 'FAIL'}: pull + verify within 1.3x of curl + sha256sum ({m / b:.2f}x), "
              f"unchanged push uploads nothing ({sent_again} bytes)")
        return 0 if ok else 1
    finally:
        if reg is not None:
            reg.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
