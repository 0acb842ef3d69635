"""Calibrate + export at real model size: the pipeline's stages vs plain ModelOpt calls, same model, same run.

    .venv/bin/python bench/quantize.py                    # CPU: Llama-3.2-3B shape, int8_wo, 4x64 tokens
    python bench/quantize.py --samples 16 --repeat 2      # on a GPU machine: int4_awq, 16x512 tokens

The model has Llama-3.2-3B's shape (pipeline/data/model_configs.toml) and random weights, so nothing is downloaded.
  plain     load -> mtq.quantize -> export_tensorrt_llm_checkpoint, as a ModelOpt user would write it (as
            ModelOpt's own PTQ example: no calibration data for weight-only int8_wo, which needs none).
  pipeline  pipeline.workstation.calibrate.quantize (calibrate, fuse for export, save state) then
            pipeline.workstation.trtllm_export.export
            (restore, export, fix config, validate schema, independent-reader check), as the doit stages run them.
Each runs in its own process (peak host memory = that process's max RSS; GPU: max allocated). Prints wall time,
peak memory and the pipeline/plain ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.recipe import Calibration

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


WARMUP_SHAPE = {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 64, "intermediate_size": 512, "vocab_size": 1024, "max_position_embeddings": 2048}


def make_model(out: Path, shape: str | dict) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from pipeline.plan.perf import known_model_configs
    from pipeline.workstation.tinymodel import train_tokenizer

    if shape == "tiny":         # the warm-up model's shape: seconds on a CPU (bench/smoke.py)
        shape = WARMUP_SHAPE
    cfg = dict(known_model_configs()[shape]) if isinstance(shape, str) else dict(shape)
    cfg.pop("architectures", None)
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = LlamaForCausalLM(LlamaConfig(**cfg, rope_theta=500000.0)).half()
    model.save_pretrained(out)
    PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(1000), eos_token="<|eos|>").save_pretrained(out)


def run_plain(model_dir: Path, out: Path, weights: str, group: int | None, cal: Calibration) -> None:
    import modelopt.torch.quantization as mtq
    import torch
    from modelopt.torch.export import export_tensorrt_llm_checkpoint
    from modelopt.torch.quantization.config import need_calibration
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.formats import KV_FORMATS, WEIGHT_FORMATS
    from pipeline.workstation.calibrate import modelopt_config
    from pipeline.workstation.calibration import load_texts, token_windows

    steps, t = {}, time.perf_counter()

    def step(name):
        nonlocal t
        now = time.perf_counter()
        steps[name] = round(now - t, 2)
        t = now
        if torch.cuda.is_available():
            print(json.dumps({"gpu_step": name, "peak_gb": round(torch.cuda.max_memory_allocated() / 1e9, 3),
                              "held_gb": round(torch.cuda.memory_allocated() / 1e9, 3)}), file=sys.stderr)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    step("load")
    tok = AutoTokenizer.from_pretrained(model_dir)
    windows = token_windows(tok, load_texts(cal.source), cal.samples, cal.seq_len, cal.seed)
    step("tokenize")

    def loop(m):
        for w in windows:
            m(torch.tensor([w], device=device))
    cfg = modelopt_config(WEIGHT_FORMATS[weights], KV_FORMATS["fp16"], group)
    with torch.no_grad():   # as ModelOpt's own PTQ example: no data where no quantizer needs it (weight-only)
        mtq.quantize(model, cfg, loop if need_calibration(cfg) else None)
    step("calibrate")
    if weights == "int8_wo":
        mtq.disable_quantizer(model, "*weight_quantizer")
    export_tensorrt_llm_checkpoint(model, decoder_type="llama", dtype=torch.float16, export_dir=out,
                                   inference_tensor_parallel=1)
    step("export")
    print(json.dumps({"steps": steps}), file=sys.stderr)


def run_pipeline(model_dir: Path, out: Path, weights: str, group: int | None, cal: Calibration) -> None:
    from transformers import AutoTokenizer

    from pipeline.workstation.calibrate import quantize
    from pipeline.workstation.calibration import load_texts
    from pipeline.workstation.state import ModelHandoff
    from pipeline.workstation.trtllm_export import export

    qdir, edir = out / "quantize", out / "export"
    qdir.mkdir(parents=True)
    t0 = time.perf_counter()
    handoff = ModelHandoff()        # as doit runs the stages: the calibrated model passes to export in-process
    steps = quantize(model_dir, qdir, weights, "fp16", group, cal, ".", handoff=handoff).seconds or {}
    t1 = time.perf_counter()
    probe = AutoTokenizer.from_pretrained(model_dir)(" ".join(load_texts("builtin:heldout-en")))["input_ids"][:32]
    t2 = time.perf_counter()
    info = export(model_dir, qdir, edir, weights, probe, handoff=handoff).to_dict()
    t3 = time.perf_counter()
    print(json.dumps({"steps": {"quantize": steps, "export": info["seconds"],
                                "walls": {"quantize": round(t1 - t0, 2), "probe": round(t2 - t1, 2),
                                          "export": round(t3 - t2, 2)}}, "reader": info["reader_check"]}),
          file=sys.stderr)


def trace_gpu_steps() -> None:
    """Each pipeline step's GPU memory on stderr: the peak it raised the process's peak to (null: it did not) and
    what it left allocated, so a peak above plain ModelOpt's names the step that reached it."""
    import torch

    from pipeline import progress
    original = progress.StepTimer.__call__

    def call(self, name):
        @contextlib.contextmanager
        def traced():
            before = torch.cuda.max_memory_allocated()
            with original(self, name):
                yield
            peak = torch.cuda.max_memory_allocated()
            print(json.dumps({"gpu_step": name, "new_peak_gb": round(peak / 1e9, 3) if peak > before else None,
                              "held_gb": round(torch.cuda.memory_allocated() / 1e9, 3)}), file=sys.stderr)
        return traced()
    progress.StepTimer.__call__ = call


def child(which: str, model_dir: str, out: str, weights: str, group: str, cal: str) -> None:
    import torch

    if torch.cuda.is_available():
        trace_gpu_steps()
    fn = run_plain if which == "plain" else run_pipeline
    t = time.perf_counter()
    from pipeline.recipe import Calibration
    fn(Path(model_dir), Path(out), weights, None if group == "None" else int(group), Calibration(**json.loads(cal)))
    wall = time.perf_counter() - t
    gpu = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
    print(json.dumps({"wall_s": wall, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "peak_gpu": gpu}))


def drop_page_cache() -> None:
    with contextlib.suppress(OSError):  # not root: both runs still start after the same sync and cache warm-up
        Path("/proc/sys/vm/drop_caches").write_text("1")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", default=None, help="int8_wo on CPU, int4_awq on a GPU by default")
    ap.add_argument("--shape", default="meta-llama/Llama-3.2-3B-Instruct",
                    help="a repo of pipeline/data/model_configs.toml, or 'tiny' (a smoke run)")
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--workdir", default=None, help="where to write the model and outputs (default: a temp dir)")
    ap.add_argument("--repeat", type=int, default=1, help="alternate plain/pipeline N times; the minimum counts "
                    "(calibration on a GPU varies run to run by ~10%%)")
    args = ap.parse_args()
    import torch
    gpu = torch.cuda.is_available()
    weights = args.weights or ("int4_awq" if gpu else "int8_wo")
    from pipeline.recipe import Calibration
    cal = Calibration("builtin:calib-en", args.samples or (128 if gpu else 4), args.seq_len or (512 if gpu else 64), 0)
    group = 128 if weights == "int4_awq" else None

    root = Path(args.workdir or tempfile.mkdtemp(prefix="quant-bench-"))
    model_dir = root / "model"
    if not (model_dir / "config.json").is_file():
        t = time.perf_counter()
        make_model(model_dir, args.shape)
        print(f"made {args.shape}-shaped random model in {time.perf_counter() - t:.0f} s", flush=True)
    results = {}
    # Warm-up, untimed: a tiny model through the same format builds ModelOpt's CUDA extension (a one-time JIT of
    # ~45 s, cached in TORCH_EXTENSIONS_DIR) so that neither timed run pays it; then warm the page cache.
    warm = root / "warmup-model"
    if not (warm / "config.json").is_file() and args.shape != "tiny":
        make_model(warm, WARMUP_SHAPE)
    # On a virtual machine the first touch of guest memory is slow (here 2.5 GB took 4.7 s the first time and
    # 0.9 s after): touch most of it once, so that whichever run comes first does not pay that alone.
    smoke = args.shape == "tiny"    # bench/smoke.py: the code path only, no figures worth preparing for
    if not gpu and not smoke:
        code = ("import torch; n = int(open('/proc/meminfo').read().split('MemAvailable:')[1].split()[0]) * 1024;"
                "x = torch.empty(int(n * 0.85) // 4); x.fill_(0)")
        subprocess.run([sys.executable, "-c", code], check=False)
    jobs = [] if smoke else [("warmup", warm)]
    jobs += [("plain", model_dir), ("pipeline", model_dir)] * args.repeat
    for which, mdir in jobs:
        out = root / which
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        # every run starts from the same page cache: no writeback left over from the run before (a 3B export
        # leaves GBs of dirty pages that would compete with this run's reads and writes), none of its output
        # cached (a 3B run fills a 24 GB machine: whichever run comes second would pay the kernel's reclaim of the
        # first one's 7 GB checkpoint; dropped where this user may), and the model's checkpoint cached
        os.sync()
        drop_page_cache()
        subprocess.run(["cat", *map(str, mdir.glob("*.safetensors"))], stdout=subprocess.DEVNULL)
        kind = "plain" if which == "warmup" else which
        code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from bench.quantize import child; "
                f"child({kind!r}, {str(mdir)!r}, {str(out)!r}, {weights!r}, {str(group)!r}, "
                f"{json.dumps(dataclasses.asdict(cal))!r})")
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=dict(os.environ, PYTHONWARNINGS="ignore"))
        print(f"{which}: {time.perf_counter() - t:.0f} s (rc {proc.returncode})", flush=True)
        if proc.returncode:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
        run = json.loads(proc.stdout.strip().splitlines()[-1])
        run["detail"] = json.loads(proc.stderr.strip().splitlines()[-1]) if which != "warmup" else {}
        print(f"  {which} steps (s):", json.dumps(run["detail"].get("steps")), flush=True)
        for line in proc.stderr.splitlines():
            if line.startswith('{"gpu_step"'):
                print(f"  {which} GPU:", line, flush=True)
        if which == "pipeline":
            print("  reader check:", json.dumps(run["detail"]["reader"]), flush=True)
        if which not in results or run["wall_s"] < results[which]["wall_s"]:
            results[which] = run
    p, q = results["plain"], results["pipeline"]
    where = "cuda: " + torch.cuda.get_device_name() if gpu else "cpu"
    print(f"\nminimum of {args.repeat} run(s) each; {weights} on {where}, {args.shape} shape, "
          f"{cal.samples}x{cal.seq_len} calibration tokens")
    print(f"{'':<10}{'wall s':>10}{'peak RSS GB':>14}{'peak GPU GB':>14}")
    for name, r in (("plain", p), ("pipeline", q)):
        print(f"{name:<10}{r['wall_s']:>10.1f}{r['peak_rss'] / 1e9:>14.2f}{r['peak_gpu'] / 1e9:>14.2f}")
    ratio = q["wall_s"] / p["wall_s"]
    print(f"pipeline / plain wall time: {ratio:.3f} ({(ratio - 1):+.1%} overhead)")
    if p["peak_gpu"]:
        print(f"pipeline / plain peak GPU memory: {q['peak_gpu'] / p['peak_gpu']:.3f}")
    print(f"pipeline / plain peak RSS: {q['peak_rss'] / p['peak_rss']:.3f}")
    # The export stage proves the checkpoint: a reference forward of the calibrated model and a forward of the
    # independent reader over the written file. Plain ModelOpt does neither; shown apart from the stage machinery.
    detail = q["detail"]
    proof = detail["steps"]["export"]["reference"] + detail["steps"]["export"]["reader"]
    ratio = (q["wall_s"] - proof) / p["wall_s"]
    print(f"of which the reader proof (reference + reader forwards): {proof:.1f} s; "
          f"without it: {ratio:.3f} ({(ratio - 1):+.1%} overhead)")
    if not args.workdir:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
