"""On a GPU workstation: a model spread over GPUs, spread over a GPU and host memory (layers moved in for their
forward), or with no GPU room at all (calibrated on the CPU), calibrates and exports the same checkpoint format, and
the reader gate holds. Skipped without CUDA (CI); run on a GPU machine with `pytest -m gpu` (alone or with -n 4).
PIPELINE_GPU_BUDGET_BYTES shrinks what each GPU may hold so a tiny model spreads."""

import json

import pytest
import torch

from tests.workstation.test_export import CAL, builtin, probe_ids  # noqa: F401  (fixture)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _run(src, tmp_path, monkeypatch, budgets):
    from pipeline.workstation.calibrate import quantize
    from pipeline.workstation.trtllm_export import export

    if budgets:
        monkeypatch.setenv("PIPELINE_GPU_BUDGET_BYTES", budgets)
    else:
        monkeypatch.delenv("PIPELINE_GPU_BUDGET_BYTES", raising=False)
    qdir, edir = tmp_path / "q", tmp_path / "e"
    qdir.mkdir(parents=True)
    info = quantize(src, qdir, "int4_awq", "int8", 64, CAL, ".").to_dict()
    # export takes the live model (moved to the CPU), or reloads it where it is spread over devices
    check = export(src, qdir, edir, "int4_awq", probe_ids(src)).to_dict()["reader_check"]
    return info, check, edir


@pytest.mark.parametrize("layout", ["multi-gpu", "gpu+cpu", "cpu"])
def test_spread_model_calibrates_and_exports(builtin, tmp_path, monkeypatch, layout):  # noqa: F811
    if layout == "multi-gpu" and torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    from pipeline.workstation.placement import checkpoint_bytes

    src = builtin("tiny-llama")
    nbytes = checkpoint_bytes(src)
    one, _, one_dir = _run(src, tmp_path / "one", monkeypatch, None)
    # gpu+cpu: three quarters on the GPU, beside the room accelerate keeps there to run the offloaded layers
    budgets = {"multi-gpu": f"{nbytes * 8 // 10},{nbytes * 8 // 10}", "gpu+cpu": str(nbytes * 3 // 4),
               "cpu": "0"}[layout]
    spread, check, spread_dir = _run(src, tmp_path / "spread", monkeypatch, budgets)
    # where the whole model fits one GPU it goes there; tests running beside it (-n 4) leave a tiny model room
    assert one["placement"]["kind"] == "gpu", one["placement"]
    assert spread["placement"]["kind"] == layout, spread["placement"]
    if layout == "gpu+cpu":     # really spread: layers on the GPU and layers in host memory
        assert {"0", "cpu"} <= set(spread["placement"]["devices"]), spread["placement"]
        assert spread["placement"]["gathered"] is True
    assert check["logit_cosine"] >= 0.999 and check["top1_tie_aware"] >= 0.99, check
    a = json.loads((one_dir / "config.json").read_text())
    b = json.loads((spread_dir / "config.json").read_text())
    assert a == b
    print(layout, json.dumps(spread["placement"]), json.dumps(check))
