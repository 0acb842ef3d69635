"""The calibrated model's saved state (ModelOpt state + the tensors calibration changed), its restore, and the
hand-off of the live model from quantize to the next stage of the same process.

The saved model is exactly the numerics that get deployed: weights AWQ / SmoothQuant rescaled are saved as their
levels on the export grid, and every later stage (export, goldens, accuracy) restores this state, or takes the
live model quantize handed off, which is the same model bit for bit (tests/workstation/test_export.py).
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError
from pipeline.workstation.grid import grid_modules, snap_to_export_grid, split_levels
from pipeline.workstation.models import import_modelopt, load_model, param_fingerprint

STATE = "modelopt_state.pth"
TENSORS = "calibrated.safetensors"      # the tensors calibration changed, beside STATE


class ModelHandoff:
    """The live calibrated model, handed from quantize to the next stage that would restore the same saved state
    (export, goldens, accuracy) in the same process, instead of loading the checkpoint and the state again (for a
    3B model on a CPU that reload was the largest part of the pipeline's overhead). Keyed by the state file's inode,
    mtime and size: the stage directory's rename keeps them; a re-run or a copy changes them. The doit process
    holds one (pipeline/graph/tasks.py) and hands it to the stages through their recipe's graph; without one, every
    stage restores."""

    def __init__(self) -> None:
        self.models: dict[tuple, Any] = {}

    @staticmethod
    def key(model_dir: Path, quant_dir: Path) -> tuple:
        st = (quant_dir / STATE).stat()
        return (str(Path(model_dir).resolve()), st.st_ino, st.st_mtime_ns, st.st_size)

    def put(self, model_dir: Path, quant_dir: Path, model) -> None:
        self.drop()
        self.models[self.key(model_dir, quant_dir)] = model

    def get(self, model_dir: Path, quant_dir: Path, consume: bool):
        key = self.key(model_dir, quant_dir)
        return self.models.pop(key, None) if consume else self.models.get(key)

    def drop(self) -> None:
        """Let go of every handed-off model (before loading another one: never two models at once)."""
        if self.models:
            self.models.clear()
            gc.collect()

    def __bool__(self) -> bool:
        return bool(self.models)


def unchanged_parameters(model, model_dir: Path) -> set[str]:
    """Parameters still equal to what load_model makes of the checkpoint (max calibration changes no weight;
    AWQ and SmoothQuant rescale the linears)."""
    import torch
    from safetensors import safe_open

    params = dict(model.named_parameters())
    # AWQ and SmoothQuant fold their smoothing into the weight of every linear that has a pre-quant scale: those
    # changed for certain, and comparing them would only re-read gigabytes of checkpoint
    smoothed = {f"{name}.weight" for name, m in model.named_modules()
                if getattr(getattr(m, "input_quantizer", None), "pre_quant_scale", None) is not None}
    # load_model recorded each parameter's fingerprint: one that still matches was not written through the
    # parameter. ModelOpt also writes through `.data` (SVDQuant, pre-quant-scale folding), which no version counter
    # sees, so the first and last rows are compared with the checkpoint too; without a record, the whole tensor is.
    # (Comparing whole tensors re-reads the checkpoint: 5 s of a 1B model's 13 s save on a CPU.)
    loaded = getattr(model, "pipeline_loaded", None)

    def equal(stored: torch.Tensor, p: torch.Tensor) -> bool:
        return torch.equal(stored.to(p.device).half().to(p.dtype), p)

    same = set()
    for shard in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            for key in f.keys():
                p = params.get(key)
                if p is None or key in smoothed:
                    continue
                if loaded is None or p.dim() < 2:
                    ok = equal(f.get_tensor(key), p)
                else:
                    rows, last = f.get_slice(key), p.shape[0] - 1
                    ok = loaded.get(key) == param_fingerprint(p) and equal(rows[0:1], p[0:1]) and \
                        equal(rows[last:last + 1], p[last:last + 1])
                if ok:
                    same.add(key)
    return same


def save_quantized(model, out_dir: Path, unchanged: set[str], levels: dict) -> int:
    """ModelOpt state (STATE) + every tensor calibration changed (TENSORS: amax, pre-quant scales, and the
    weights AWQ / SmoothQuant rescaled); returns bytes of tensors.

    Unchanged weights are not saved again: load_quantized re-reads them from the fetched checkpoint. Changed
    weights on the export grid are saved as their integer levels (`levels`, from snap_to_export_grid, keyed by
    weight name + a levels suffix): a 3B INT4-AWQ model calibrated on a GPU saved 6 GB of fp16 weights in 6 s,
    a third of the pipeline's overhead there; as INT4 levels, 1.5 GB.
    The tensors go to safetensors, one write of their bytes (torch.save's zip writer took 3x as long).
    """
    import modelopt.torch.opt as mto
    from safetensors.torch import save_file

    params = dict(model.named_parameters())
    # tied weights (lm_head = embed_tokens) appear in the state dict under a name the checkpoint does not have
    shared = {params[k].data_ptr() for k in unchanged}
    tensors, storages = dict(levels), set()
    as_levels = {k.rsplit(".", 1)[0] for k in levels}
    for k, v in model.state_dict().items():
        if k in unchanged or k in as_levels or v.data_ptr() in shared:
            continue
        # safetensors refuses two names on one storage (K and V quantizers share one amax): copy the repeats
        storage = v.untyped_storage().data_ptr()
        tensors[k] = v.detach().clone() if storage in storages else v.detach().contiguous()
        storages.add(storage)
    # how the grid was made (grid.snap_to_export_grid), for the restore to make it again
    grid = {"fp16_scales": bool(getattr(model, "pipeline_grid_fp16_scales", False))}
    save_state_deterministically({"modelopt_state": _sorted(mto.modelopt_state(model)), "grid": grid},
                                 out_dir / STATE)
    save_file(tensors, str(out_dir / TENSORS))
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _sorted(obj):
    """Dicts with their keys in sorted order, recursively: ModelOpt collects quantizer attributes through sets, so
    their order (and the pickle's bytes) changes from run to run while the state is equal."""
    if isinstance(obj, dict):
        return {k: _sorted(obj[k]) for k in sorted(obj, key=str)}
    if isinstance(obj, list):
        return [_sorted(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_sorted(v) for v in obj)
    return obj


def save_state_deterministically(obj, path: Path) -> None:
    """torch.save, then the archive rewritten without what changes between identical saves: the random
    `.data/serialization_id` (replaced by a digest of the pickle) and zip timestamps. Same state, same bytes, so a
    re-run of quantize does not change its content digest and re-run everything downstream. torch.load reads it."""
    import hashlib
    import io
    import zipfile

    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zout:
        pickled = b"".join(zin.read(i) for i in zin.infolist() if i.filename.endswith("data.pkl"))
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith(".data/serialization_id"):
                data = str(int(hashlib.sha256(pickled).hexdigest(), 16)).encode()[:len(data)].rjust(len(data), b"0")
            zout.writestr(zipfile.ZipInfo(info.filename, date_time=(1980, 1, 1, 0, 0, 0)), data)
    Path(path).write_bytes(out.getvalue())


def check_saved_state(quant_dir: Path) -> None:
    """The saved state's files hash as the quantize stage recorded them (where it recorded them: its stage.json):
    a file swapped in a shared artifacts/ since, same size and mtime or not, is refused before it is read."""
    from pipeline.contract import STAGE_MANIFEST, ContractError, StageManifest
    from pipeline.files import sha256_file
    if not (quant_dir / STAGE_MANIFEST).exists():
        return          # not a stage directory (a direct call); torch.load below reads data only either way
    try:
        recorded = StageManifest.load(quant_dir / STAGE_MANIFEST).files
    except ContractError:
        recorded = {}   # a record that does not read vouches for nothing: refused below, the stage re-runs
    for name in (STATE, TENSORS):
        entry = recorded.get(name)
        want = entry.sha256 if entry is not None else None
        try:
            same = want is not None and sha256_file(quant_dir / name) == want
        except (PipelineError, OSError):
            same = False
        if not same:
            (quant_dir / STAGE_MANIFEST).unlink(missing_ok=True)    # the quantize stage re-runs on the next build
            raise PipelineError(f"{quant_dir / name}: its bytes are not what the quantize stage recorded (changed or "
                                "replaced since); nothing was loaded", "run the build again: quantize re-runs")


RERUN = "run the build again: the quantize stage is computed here (a stage cache entry it came from is not used again)"


def load_quantized(model_dir: Path, quant_dir: Path, device: str = "cpu", consume: bool = False,
                   handoff: ModelHandoff | None = None):
    """The deployed-numerics model: the fetched checkpoint with the saved ModelOpt state restored.

    consume=True: the caller may change the model (export disables quantizers), so a handed-off model is taken,
    not shared, and later stages restore from disk. A model no GPU holds (placement "gpu+cpu" or "cpu") is restored
    on the CPU in fp32 for its reference forwards; the caller reads where it went with models.input_device."""
    from pipeline.workstation.models import dispatched, input_device

    import_modelopt()
    if (quant_dir / STATE).is_file():
        model = handoff.get(model_dir, quant_dir, consume) if handoff is not None else None
        spread = model is not None and dispatched(model)
        if model is not None and not (spread and device == "cpu"):
            model = model if spread else model.to(device)
            if not spread and isinstance(getattr(model, "placement", None), dict):
                model.placement = dict(model.placement, device=str(next(model.parameters()).device))
            return model.float() if device == "cpu" else model
    if handoff is not None:
        handoff.drop()      # never hold a handed-off model while loading another one
    if device != "cpu":
        from pipeline.workstation.placement import probe
        if probe(model_dir).kind in ("gpu+cpu", "cpu"):
            device = "cpu"
    model = load_model(model_dir, device, engine_numerics=True)   # a pre-quantized checkpoint: as the engine computes
    device = input_device(model)
    if (quant_dir / STATE).is_file():
        import modelopt.torch.opt as mto
        import torch
        from safetensors.torch import load_file

        from pipeline.oci.stagecache import forget_stage

        check_saved_state(quant_dir)
        try:        # data only: a pickle planted in a shared artifacts/ cannot run code here
            blob = torch.load(quant_dir / STATE, map_location=device, weights_only=True)
        except Exception as exc:    # UnpicklingError and whatever a damaged zip gives
            forget_stage(quant_dir)
            raise PipelineError(f"{quant_dir / STATE}: not the ModelOpt state the quantize stage saves "
                                f"({(str(exc).splitlines() or [''])[0][:120]})", RERUN) from None
        try:        # a state ModelOpt cannot restore (damaged, or planted in a shared cache) is refused, not a crash
            model = mto.restore_from_modelopt_state(model, blob["modelopt_state"])
        except Exception as exc:    # noqa: BLE001 - ModelOpt asserts, KeyErrors and TypeErrors alike
            forget_stage(quant_dir)
            raise PipelineError(f"{quant_dir / STATE}: not a ModelOpt state this model can take "
                                f"({type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:120]})", RERUN) from None
        tensors = load_file(str(quant_dir / TENSORS), device=device)
        levels = split_levels(tensors)
        result = model.load_state_dict(tensors, strict=False)
        unknown = result.unexpected_keys + sorted(set(levels) - {n + ".weight" for n, _ in grid_modules(model)})
        if unknown:
            forget_stage(quant_dir)
            raise PipelineError(f"{quant_dir / STATE} does not fit the model in {model_dir}: {unknown[:3]}", RERUN)
        if device == "cpu":
            model = model.float()
        grid = blob.get("grid") if isinstance(blob.get("grid"), dict) else {}
        snap_to_export_grid(model, levels, fp16_scales=grid.get("fp16_scales") is True)
    return model
