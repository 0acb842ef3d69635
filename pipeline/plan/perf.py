"""Decode-speed model: a token costs the bytes it reads over the effective bandwidth, plus a fixed cost.

    seconds/token = bytes_read / (efficiency x bandwidth) + fixed_s

Single-stream decode on Jetson is memory-bound: every token reads all weights (embedding excepted: one row) and the
KV cache so far. `efficiency` and `fixed_s` are fitted per engine class to the published Jetson rows in
data/perf_rows.csv (extracted from the workspace's jetson-llm-benchmarks.csv with their sources by
`python -m pipeline.perf extract`, refitted by `python -m pipeline.perf fit`, which rewrites
data/perf_fit.json).
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.formats import ROW_PRECISIONS, row_precision
from pipeline.plan.rows import DATA, PublishedFit, max_abs, median_abs, read_rows, weighted_line
from pipeline.plan.shapes import ModelShape, shape_from_config
from pipeline.tomlcompat import load_toml

ROWS = DATA / "perf_rows.csv"
FIT = DATA / "perf_fit.json"

# Engine classes of the published rows: "tensorrt" = TensorRT engines built from ModelOpt checkpoints (the rows are
# TensorRT Edge-LLM's; each backend's registry record names the class whose constants predict it), "mlc" = MLC/TVM.
# How each class stores each row precision is the format registry's (pipeline/formats.py ROW_PRECISIONS).
TENSORRT, MLC = "tensorrt", "mlc"


@cache
def known_model_configs() -> dict[str, dict]:
    return load_toml(DATA / "model_configs.toml")["models"]


def known_shape(repo: str) -> ModelShape | None:
    cfg = known_model_configs().get(repo)
    return shape_from_config(cfg, f"model_configs.toml[{repo}]") if cfg else None


def bytes_per_token(shape: ModelShape, body_bits: float, lm_head_bits: float, context: int, kv_bytes: int,
                    tokens: int = 1) -> float:
    """What one decode step reads (`tokens` sequences: an MoE model's experts they reach) for one sequence."""
    body = shape.active_linear_params(tokens) * body_bits / 8 + shape.small_params * 2
    lm_head = shape.embedding_params * lm_head_bits / 8
    return body + lm_head + shape.sequence_read_bytes(kv_bytes, context)


@dataclass(frozen=True)
class Constants:
    efficiency: float
    fixed_s: float

    def tok_s(self, bytes_read: float, bandwidth: float) -> float:
        return 1.0 / (bytes_read / (self.efficiency * bandwidth) + self.fixed_s)

    def aggregate_tok_s(self, bytes_read: float, kv_bytes: float, batch: int, bandwidth: float) -> float:
        """Generated tok/s of `batch` sequences decoding together (in-flight batching): one step reads the weights
        once and each sequence's own KV cache, and yields one token per sequence. Memory-bound, as single-stream
        decode is; on a board whose GPU becomes compute-bound at that batch it is an upper bound."""
        step = (bytes_read + (batch - 1) * kv_bytes) / (self.efficiency * bandwidth) + self.fixed_s
        return batch / step


@cache
def fit_data() -> dict:
    """perf_fit.json: the decode constants per class, the prefill constants and both fits' leave-one-out errors."""
    return json.loads(FIT.read_text())


@cache
def fitted() -> dict[str, Constants]:
    return {k: Constants(v["efficiency"], v["fixed_s"]) for k, v in fit_data()["classes"].items()}


# ------------------------------------------------------------------------------------------------------------ rows
@dataclass(frozen=True)
class Row:
    target: str
    power_mode: str
    engine_class: str
    model: str
    precision: str
    context: int
    decode_tok_s: float
    source: str

    def bytes_read(self) -> float:
        body, head = ROW_PRECISIONS[self.precision].bits[self.engine_class]
        shape = known_shape(self.model)
        if shape is None:
            raise PipelineError(f"perf_rows.csv: model {self.model!r} is not in model_configs.toml",
                                "add its config there, or drop the row")
        return bytes_per_token(shape, body, head, self.context, 2)

    def bandwidth(self) -> float:
        from pipeline.plan.targets import get_target
        return get_target(self.target).bandwidth_bytes(self.power_mode)


def load_rows(path: Path = ROWS) -> list[Row]:
    return read_rows(path, Row)


def fastest_published(target: str, rows: list[Row] | None = None) -> Row | None:
    """The fastest single-stream decode published for this target (any model, format, engine): the shortest gap
    between two tokens a user of that board sees, against which a fixed per-token cost (the HTTP server's framing
    and hand-offs) is judged."""
    mine = [r for r in (load_rows() if rows is None else rows) if r.target == target]
    return max(mine, key=lambda r: r.decode_tok_s) if mine else None


def fit(rows: list[Row]) -> dict[str, Constants]:
    """Per engine class, least squares on seconds/token with weights 1/y^2, i.e. on relative error.

    y = a*x + b with x = bytes/bandwidth, y = 1/tok_s; efficiency = 1/a, fixed_s = b (clamped at >= 0).
    """
    out = {}
    for cls in sorted({r.engine_class for r in rows}):
        a, b = weighted_line([(r.bytes_read() / r.bandwidth(), 1.0 / r.decode_tok_s, r.decode_tok_s ** 2)
                              for r in rows if r.engine_class == cls])
        out[cls] = Constants(round(1 / a, 6), round(b, 9))
    return out


def predict(constants: dict[str, Constants], r: Row) -> float:
    return constants[r.engine_class].tok_s(r.bytes_read(), r.bandwidth())


DECODE: PublishedFit[Row, dict[str, Constants]] = PublishedFit(ROWS, Row, fit, predict, lambda r: r.decode_tok_s)


def fit_report(rows: list[Row] | None = None) -> dict:
    rows = rows if rows is not None else load_rows()
    constants = fit(rows)
    errs = DECODE.errors(rows, constants)
    loo = DECODE.leave_one_out(rows)
    by_class = {c: median_abs([e for r, e in zip(rows, errs, strict=True) if r.engine_class == c]) for c in constants}
    return {"classes": {k: {"efficiency": v.efficiency, "fixed_s": v.fixed_s} for k, v in constants.items()},
            "rows": len(rows), "median_abs_error": median_abs(errs), "median_abs_error_by_class": by_class,
            "max_abs_error": max_abs(errs), "loo_median_abs_error": median_abs(loo), "loo_max_abs_error": max_abs(loo)}


# ---------------------------------------------------------------------------------------------- extraction (once)
DEVICE_MAP = {  # reference device name -> (target id, power mode the benchmark ran in)
    "Jetson Orin Nano 8GB (original clocks)": ("orin-nano-8gb", "15W"),
    "Jetson Orin Nano 8GB Super": ("orin-nano-8gb-super", "MAXN_SUPER"),
    # Edge-LLM's Orin Nano rows do not state the power mode; 68 GB/s fits them better than 102 (median error 6.4%
    # vs 7.2% for the class): both small-model rows are still over-predicted, the 8-SM GPU is compute-bound there.
    "Jetson Orin Nano 8GB": ("orin-nano-8gb", "15W"),
    "Jetson Orin NX 16GB": ("orin-nx-16gb", "MAXN"),
    "Jetson AGX Orin 64GB": ("agx-orin-64gb", "MAXN"),
    "Jetson AGX Orin (presumed 64GB)": ("agx-orin-64gb", "MAXN"),
    "Jetson AGX Thor T5000 devkit": ("agx-thor", "MAXN"),
}
MODEL_MAP = {
    r"^llama[ -]3\.1[ -]8b": "meta-llama/Llama-3.1-8B-Instruct",
    r"^llama[ -]3\.2[ -]3b": "meta-llama/Llama-3.2-3B-Instruct",
    r"^llama-3\.2-1b": "meta-llama/Llama-3.2-1B-Instruct",
    r"^llama-3-8b": "meta-llama/Meta-Llama-3-8B-Instruct",
    r"^llama-2-7b": "meta-llama/Llama-2-7b-hf",
    r"^llama2-70b": "meta-llama/Llama-2-70b-hf",
    r"^tinyllama-1\.1b": "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
    r"^smollm2 \(1\.7b\)": "HuggingFaceTB/SmolLM2-1.7B-Instruct",
    r"^qwen2\.5 7b": "Qwen/Qwen2.5-7B-Instruct",
    r"^qwen3-0\.6b$": "Qwen/Qwen3-0.6B",
    r"^qwen3-1\.7b$": "Qwen/Qwen3-1.7B",
    r"^qwen3-4b-instruct-2507$": "Qwen/Qwen3-4B-Instruct-2507",
    r"^qwen3-8b$": "Qwen/Qwen3-8B",
    r"^gemma 2 2b": "google/gemma-2-2b-it",
    r"^gemma 2 9b": "google/gemma-2-9b-it",
    r"^phi 3\.5 3b": "microsoft/Phi-3.5-mini-instruct",
}


def _precision(engine_class: str, text: str) -> str | None:
    """The row precision (pipeline/formats.py ROW_PRECISIONS) of a reference row's precision text, for this engine
    class;
    None for a row that is no single-model decode figure."""
    t = text.lower()
    if any(s in t for s in ("eagle", "dflash", "/", "draft")):
        return None  # speculative decoding or several precisions in one row: not a single-model decode figure
    row = row_precision(t)
    if row is None or engine_class not in row.bits:
        return None
    if engine_class == MLC and not any(t.startswith(a) for a in row.aliases):
        return None  # MLC's rows name their quantization first (q4f16 = "int4 ...")
    return row.name


def reference_match(r: dict) -> tuple[tuple[str, str], str] | None:
    """((target, power mode), model repo) of a batch-1 reference row on a known board and model, else None."""
    dev = DEVICE_MAP.get(r["device"])
    model = next((m for pat, m in MODEL_MAP.items() if re.search(pat, r["model"].lower())), None)
    return (dev, model) if dev and model and r["batch_or_concurrency"] == "1" else None


def extract(reference_csv: Path) -> list[dict]:
    """Rows of the reference CSV this model can be fitted to: batch 1, known device and model, one precision."""
    out = []
    with open(reference_csv, newline="") as fh:
        for r in csv.DictReader(fh):
            engine = r["engine"]
            cls = TENSORRT if engine.startswith("TensorRT Edge-LLM") and "EAGLE" not in engine else \
                MLC if engine == "MLC/TVM" else None
            match = reference_match(r)
            prec = _precision(cls, r["precision"]) if cls else None
            try:
                tok = float(r["decode_tok_s"])
            except ValueError:
                continue
            if not (cls and match and prec):
                continue
            dev, model = match
            isl = re.sub(r"[^0-9]", "", r["isl_tokens"]) or "16"
            osl = re.sub(r"[^0-9]", "", r["osl_tokens"]) or "128"
            out.append({"target": dev[0], "power_mode": dev[1], "engine_class": cls, "model": model,
                        "precision": prec, "context": int(isl) + int(osl) // 2, "decode_tok_s": tok,
                        "reference_device": r["device"], "reference_engine": engine,
                        "reference_model": r["model"], "reference_precision": r["precision"],
                        "source": r["source_url"]})
    return out
