"""NVFP4 through the pipeline on a GPU: calibrate (ModelOpt's FP4 quantizer runs only on CUDA), then the edgellm
export stage (unified HF checkpoint -> Edge-LLM ONNX for SM 110, checked). Prints wall time and peak GPU memory.

    python bench/nvfp4.py [--builtin tiny-llama]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from pipeline.recipe import Calibration

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    import torch

    from pipeline.workstation.calibrate import quantize
    from pipeline.workstation.state import ModelHandoff
    from pipeline.workstation.tinymodel import materialize

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--builtin", default="tiny-llama")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="nvfp4-"))
    model_dir, qdir, edir = root / "model", root / "quantize", root / "export"
    materialize(args.builtin, model_dir)
    qdir.mkdir()
    cal = Calibration("builtin:calib-en", 16, 64, 0)
    torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    handoff = ModelHandoff()
    info = quantize(model_dir, qdir, "nvfp4", "fp8", None, cal, ".", handoff=handoff).to_dict()
    t_quant = time.perf_counter() - t

    from pipeline.workstation.edgellm_export import export
    t = time.perf_counter()
    exported = export(model_dir, qdir, edir, edir / "onnx", "nvfp4", "fp8", "11.0", handoff=handoff).to_dict()
    t_export = time.perf_counter() - t
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "model": args.builtin, "device": info["device"],
                      "calibrate_s": round(t_quant, 2), "calibrate_steps_s": info["seconds"],
                      "edgellm_export_s": round(t_export, 2), "peak_gpu_bytes": torch.cuda.max_memory_allocated(),
                      "export": exported}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
