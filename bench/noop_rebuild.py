"""No-op rebuild of the whole graph: 20 recipes whose outputs, kits included, total > 20 GB, ours vs doit's md5 checker.

    .venv/bin/python bench/noop_rebuild.py [--recipes 20] [--gib-per-recipe 1.05] [--repeat 3]

Setup (once, minutes): one local Llama-shaped checkpoint of --gib-per-recipe GiB of fp16 weights (random, with the
tests' offline tokenizer) and --recipes recipes of it in fp16, which share their fetch, quantize, export, goldens and
accuracy stages and each get their own plan and signed kit of that size; then `doit build` of all of them.
Measured, from that finished state, in the same run:
  ours   `doit build` of every recipe (plan ... package: every stage task, every kit): up to date from the stage
         manifests (sizes and mtimes; a kit's folder listing against what was packed), nothing re-hashed.
  md5    one task per recipe with every file of its stages and its kit as file_dep: doit's default (md5) checker.
Scenarios:
  intact-db  the doit databases are as the last run left them.
  lost-db    the doit databases are gone, as after a kill -9 / OOM mid-run (doit writes them only at the end of a
             run) or on a fresh checkout with restored artifacts: doit's md5 checker must re-hash every file_dep.
The verdict asks the no-op build to stay under 1 s in both scenarios.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
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
        for recipe in sorted(p for p in ART.iterdir() if p.is_dir() and not p.name.startswith((".", "stages"))):
            deps = sorted({str(f) for link in recipe.iterdir() if link.is_symlink()
                           for f in link.resolve().rglob("*") if f.is_file()})
            yield {"name": recipe.name, "actions": [lambda: None], "file_dep": deps}
""")


def make_checkpoint(path: Path, gib: float) -> int:
    """A Llama checkpoint of ~gib GiB of fp16 weights (random, 2 layers, MLP 4x hidden) with the tests' offline
    tokenizer; returns its parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from transformers.utils import logging

    from pipeline.workstation.tinymodel import train_tokenizer

    logging.disable_progress_bar()

    tok = PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(320), bos_token="<|bos|>", eos_token="<|eos|>",
                                  pad_token="<|pad|>")
    params, layers = gib * GiB / 2, 2
    hidden = max(64, round(math.sqrt(params / (16 * layers)) / 64) * 64)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=4 * hidden,
                         num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64,
                         max_position_embeddings=2048, tie_word_embeddings=False, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float16)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def run(cmd: list[str], env: dict, check: bool = True) -> float:
    t = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if check and r.returncode:
        sys.exit(f"{' '.join(cmd[-3:])} failed (exit {r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return time.perf_counter() - t


def median_of(n: int, fn) -> float:
    return statistics.median(fn() for _ in range(n))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipes", type=int, default=20)
    ap.add_argument("--gib-per-recipe", type=float, default=1.05, help="fp16 weights per kit (GiB)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="noop-bench-") as tmp:
        root = Path(tmp)
        recipes, artifacts, ckpt = root / "recipes", root / "artifacts", root / "model"
        recipes.mkdir()
        params = make_checkpoint(ckpt, args.gib_per_recipe)
        from pipeline.workstation.tinymodel import corpus_text
        (root / "heldout.txt").write_text(corpus_text("heldout-long-en")[:3000])
        for i in range(args.recipes):
            (recipes / f"r{i:02d}.toml").write_text(textwrap.dedent(f"""
                targets = ["agx-orin-64gb"]
                [model]
                source = "local"
                path = "{ckpt}"
                [quantization]
                weights = "fp16"
                [build]
                max_batch_size = 1
                max_input_len = 256
                max_seq_len = 512
                [validation]
                prompts = ["The small computer"]
                max_new_tokens = 4
                chat_template = false
                heldout = "file:{root / 'heldout.txt'}"
            """))
        env = dict(os.environ, PIPELINE_RECIPES=str(recipes), PIPELINE_ARTIFACTS=str(artifacts),
                   JETSON_PIPELINE_HOME=str(root / "home"), HF_HUB_OFFLINE="1")
        doit = [sys.executable, "-m", "doit"]
        ours = doit + ["-f", str(REPO / "dodo.py"), "build"]
        md5_dodo = root / "md5_dodo.py"
        md5_dodo.write_text(MD5_DODO)
        md5 = doit + ["-f", str(md5_dodo), "use"]

        print(f"setup: {args.recipes} recipes of one {params / 1e6:.0f}M-parameter fp16 model, first build "
              "(every stage, every kit)...", flush=True)
        t_first = run(ours, env)
        stages = sum(f.stat().st_size for f in (artifacts / "stages").rglob("*") if f.is_file())
        kits = sum(f.stat().st_size for f in (artifacts / "stages" / "package").rglob("*") if f.is_file())
        t_md5_first = run(md5, env)
        print(f"  outputs: {stages / 1e9:.1f} GB, of which kits {kits / 1e9:.1f} GB in {args.recipes} kits; first "
              f"build {t_first:.0f} s; md5 graph first run {t_md5_first:.1f} s")
        if stages < 20e9 and args.recipes >= 20:
            print("FAIL: the outputs must total >= 20 GB", file=sys.stderr)
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
        ok = ours_lost < 1.0 and ours_intact < 1.0
        print(f"\nno-op `doit build` of {args.recipes} recipes ({stages / 1e9:.1f} GB of outputs, kits included): "
              f"{'PASS' if ok else 'FAIL'} (< 1 s with the doit database intact and lost)")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
