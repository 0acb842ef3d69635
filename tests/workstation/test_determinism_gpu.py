"""Same inputs, same bytes on a GPU too (issue 16, defect 3): FP8 calibration on CUDA and the Edge-LLM ONNX export,
each run in two separate processes from the same model, give byte-identical outputs. Runs where CUDA is available
(`-m gpu`), or as `python tests/workstation/test_determinism_gpu.py` on a GPU machine without pytest.

Measured on an H100 (2026-11-23, tiny-llama, FP8 weights + FP8 KV): at 80089ce modelopt_state.pth differed between
the two processes (ModelOpt collects quantizer attributes through sets; torch.save adds a random serialization id),
the ONNX did not; with state.save_state_deterministically both are identical."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from pipeline.recipe import Calibration

REPO = Path(__file__).resolve().parents[2]


def _tree(d: Path) -> dict:
    return {p.relative_to(d).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file() and p.name != "quantize.json"}


def run_once(weights: str = "fp8", kv: str = "fp8") -> dict:
    from pipeline.workstation.calibrate import quantize
    from pipeline.workstation.edgellm_export import export
    from pipeline.workstation.tinymodel import materialize

    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        materialize("tiny-llama", root / "model")
        (root / "q").mkdir()
        info = quantize(root / "model", root / "q", weights, kv, None,
                        Calibration("builtin:calib-en", 8, 64, 0), ".")
        export(root / "model", root / "q", root / "e", root / "e" / "onnx", weights, kv, "11.0")
        return {"device": info.device, "quantize": _tree(root / "q"), "onnx": _tree(root / "e" / "onnx")}


def two_processes() -> list[dict]:
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, __file__, "--once"], capture_output=True, text=True, cwd=REPO,
                             timeout=900)
        assert out.returncode == 0, out.stderr[-2000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return runs


try:
    import pytest
    import torch

    @pytest.mark.gpu
    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
    def test_fp8_calibration_and_onnx_export_are_byte_identical_across_processes_on_a_gpu():
        a, b = two_processes()
        assert a["device"] == "cuda"
        assert a["quantize"] == b["quantize"] and a["onnx"] == b["onnx"]
except ImportError:         # a GPU machine without pytest runs __main__ below
    pass


if __name__ == "__main__":
    if sys.argv[1:] == ["--once"]:
        print(json.dumps(run_once()))
    else:
        a, b = two_processes()
        for part in ("quantize", "onnx"):
            diff = sorted(k for k in a[part] if a[part][k] != b[part].get(k))
            print(f"{part} on {a['device']}: {'IDENTICAL' if not diff else 'DIFFER: ' + ', '.join(diff)}")
