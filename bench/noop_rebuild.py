"""No-op rebuild: 20 recipes whose stage outputs total >= 20 GB (sparse), ours vs doit's default md5 checker.

    .venv/bin/python bench/noop_rebuild.py [--recipes 20] [--gib-per-recipe 1.05]

Both graphs are run from the same state in the same run:
  ours   the project's dodo.py: up-to-date from stage manifests + file stats, no file_dep.
  md5    the same stage outputs declared as file_dep of one task per recipe, doit's default (md5) checker.
Scenarios:
  intact-db  the doit database is as the last run left it.
  lost-db    the doit database is gone, as after a kill -9 / OOM mid-run (doit writes it only at the end of a
             run) or on a fresh checkout with restored artifacts: doit's md5 checker must re-hash every file_dep.
The acceptance figure is the lost-db ratio; both are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GiB = 2**30

MD5_DODO = textwrap.dedent("""
    import os
    from pathlib import Path
    ART = Path(os.environ["PIPELINE_ARTIFACTS"])
    DOIT_CONFIG = {"backend": "sqlite3", "dep_file": str(ART / ".md5.db"), "verbosity": 0}

    def task_use():
        for link in sorted(p for p in ART.iterdir() if p.is_dir() and not p.name.startswith((".", "stages"))):
            deps = sorted(str(f) for f in (link / "fetch").resolve().rglob("*") if f.is_file())
            yield {"name": link.name, "actions": [lambda: None], "file_dep": deps}
""")


_TOKENIZER = None


def _tokenizer():
    """A small real BPE tokenizer, trained once offline (the same as the tests' checkpoints)."""
    global _TOKENIZER
    if _TOKENIZER is None:
        from transformers import PreTrainedTokenizerFast

        from pipeline.workstation.tinymodel import train_tokenizer
        _TOKENIZER = PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(320), bos_token="<|bos|>",
                                             eos_token="<|eos|>", pad_token="<|pad|>")
    return _TOKENIZER


def make_checkpoint(path: Path, size: int) -> None:
    """A valid Llama checkpoint directory whose weights file is one sparse all-zero tensor of `size` bytes."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "num_hidden_layers": 16,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256,
        "max_position_embeddings": 8192}))
    _tokenizer().save_pretrained(path)      # fetch loads the tokenizer: a checkpoint without one is refused
    header = json.dumps({"w": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}}).encode()
    with open(path / "model.safetensors", "wb") as fh:
        fh.write(struct.pack("<Q", len(header)) + header)
        fh.truncate(8 + len(header) + size)


def run(cmd: list[str], env: dict) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def median_of(n: int, fn) -> float:
    return statistics.median(fn() for _ in range(n))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipes", type=int, default=20)
    ap.add_argument("--gib-per-recipe", type=float, default=1.05)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="noop-bench-") as tmp:
        root = Path(tmp)
        recipes, artifacts = root / "recipes", root / "artifacts"
        recipes.mkdir()
        size = int(args.gib_per_recipe * GiB)
        for i in range(args.recipes):
            ckpt = root / "models" / f"m{i:02d}"
            make_checkpoint(ckpt, size)
            (recipes / f"r{i:02d}.toml").write_text(textwrap.dedent(f"""
                targets = ["agx-orin-64gb"]
                [model]
                source = "local"
                path = "{ckpt}"
                [quantization]
                weights = "int4_awq"
                [validation]
                prompts = ["hi"]
            """))
        env = dict(os.environ, PIPELINE_RECIPES=str(recipes), PIPELINE_ARTIFACTS=str(artifacts))
        doit = [sys.executable, "-m", "doit"]
        # the plan and fetch stages of every recipe: fetch holds the multi-GB outputs whose up-to-date check is
        # measured (the checkpoints are sparse stand-ins, which nothing after fetch could load)
        ours = doit + ["-f", str(REPO / "dodo.py"), "fetch"]
        md5_dodo = root / "md5_dodo.py"
        md5_dodo.write_text(MD5_DODO)
        md5 = doit + ["-f", str(md5_dodo), "use"]

        print(f"setup: {args.recipes} recipes x {args.gib_per_recipe} GiB, first build (hashes everything once)...",
              flush=True)
        t_first = run(ours, env)
        total = sum(f.stat().st_size for f in (artifacts / "stages").rglob("*") if f.is_file())
        t_md5_first = run(md5, env)
        print(f"  stage outputs: {total / 1e9:.1f} GB apparent; first build {t_first:.1f} s; "
              f"md5 graph first run {t_md5_first:.1f} s")
        if total < 20e9 and args.recipes >= 20:
            print("FAIL: the stage outputs must total >= 20 GB", file=sys.stderr)
            return 1

        def lost(db: str):
            for p in artifacts.glob(db + "*"):
                p.unlink()

        ours_intact = median_of(args.repeat, lambda: run(ours, env))
        md5_intact = median_of(args.repeat, lambda: run(md5, env))
        ours_lost = median_of(args.repeat, lambda: (lost(".doit.db"), run(ours, env))[1])
        md5_lost = median_of(max(1, args.repeat - 2), lambda: (lost(".md5.db"), run(md5, env))[1])

        print(f"\n{'scenario':<12}{'ours (s)':>10}{'md5 (s)':>10}{'ours/md5':>10}")
        print(f"{'intact-db':<12}{ours_intact:>10.3f}{md5_intact:>10.3f}{ours_intact / md5_intact:>10.1%}")
        print(f"{'lost-db':<12}{ours_lost:>10.3f}{md5_lost:>10.3f}{ours_lost / md5_lost:>10.1%}")
        ok = ours_lost < 1.0 and ours_intact < 1.0 and ours_lost / md5_lost < 0.05
        print(f"\nno-op of {args.recipes} recipes ({total / 1e9:.1f} GB): "
              f"{'PASS' if ok else 'FAIL'} (< 1 s and < 5% of md5 after a lost database)")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
