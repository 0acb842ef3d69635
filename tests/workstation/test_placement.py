"""Where the workstation calibrates: one GPU, spread over GPUs, offloaded, or the CPU (decided from free memory)."""

import pytest

from pipeline.errors import PipelineError
from pipeline.workstation.placement import GiB, checkpoint_bytes, choose

GB = 10**9


def test_small_model_on_one_gpu():
    p = choose(6 * GB, [80 * GiB], 100 * GB)
    assert (p.kind, p.device, p.max_memory) == ("gpu", "cuda:0", {})


def test_model_larger_than_one_gpu_is_spread_over_all_gpus():
    # Llama-3.1-70B in fp16 (141 GB) on 2 x 80 GB: each GPU keeps 15% free for activations and statistics
    p = choose(141 * GB, [80 * GiB, 80 * GiB], 200 * GB)
    assert p.kind == "multi-gpu" and set(p.max_memory) == {0, 1}
    assert p.max_memory == {0: 68 * GiB, 1: 68 * GiB}
    assert sum(p.max_memory.values()) >= 141 * GB and "spread over 2 GPUs" in p.note


def test_larger_than_all_gpus_is_spread_over_the_gpus_and_host_memory():
    # 141 GB on one 80 GB GPU: 68 GiB on the GPU, the rest (~68 GB) in host memory, moved in per layer
    p = choose(141 * GB, [80 * GiB], 300 * GB)
    assert (p.kind, p.device) == ("gpu+cpu", "cuda:0")
    assert p.max_memory == {0: 68 * GiB, "cpu": 300 * GB - 4 * GiB}
    assert "in host memory, moved to a GPU per layer" in p.note
    # the offloaded part must fit the host, with its headroom; GPUs with no room at all calibrate on the CPU
    assert choose(141 * GB, [80 * GiB], 141 * GB - 68 * GiB + 4 * GiB).kind == "gpu+cpu"
    with pytest.raises(PipelineError, match="does not fit the GPUs"):
        choose(141 * GB, [80 * GiB], 141 * GB - 68 * GiB + 4 * GiB - 1)
    p = choose(10 * GB, [80 * GiB], 300 * GB, budgets=[0])
    assert (p.kind, p.device) == ("cpu", "cpu") and "does not fit the GPUs" in p.note


def test_nothing_fits():
    with pytest.raises(PipelineError, match=r"does not fit the GPUs \(.* usable\), and calibrating on the CPU in "
                                            r"fp32 needs 286.3 GB of host memory, 110.0 GB free"):
        choose(141 * GB, [24 * GiB], 110 * GB)


def test_cpu_only_needs_fp32_in_host_memory():
    assert choose(1 * GB, [], 24 * GB).kind == "cpu"
    with pytest.raises(PipelineError, match=r"fp32: 20.3 GB of host memory, 19.0 GB free") as e:
        choose(8 * GB, [], 19 * GB)
    assert "NVIDIA GPU" in e.value.hint


def test_checkpoint_bytes_reads_headers_only(tmp_path):
    import torch
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(10, 20, dtype=torch.float32), "b": torch.zeros(7, dtype=torch.bfloat16)},
              str(tmp_path / "model-00001.safetensors"))
    save_file({"c": torch.zeros(3, 3, dtype=torch.float16)}, str(tmp_path / "model-00002.safetensors"))
    assert checkpoint_bytes(tmp_path) == (200 + 7 + 9) * 2
