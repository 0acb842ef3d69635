"""A ModelOpt NVFP4 checkpoint, written here by ModelOpt on a CUDA GPU as NVIDIA's *-NVFP4 repositories are, through
the quantize stage's restore (workstation/restore.py): its global scales set from the checkpoint's, every per-block
scale and packed weight ModelOpt recomputes from the dequantized weights equal to the checkpoint's bit for bit, the
restored model's weights the checkpoint's dequantized independently, and a checkpoint with a block whose
scale is not the one max calibration gives its values refused naming the tensor. `-m gpu` (ModelOpt's FP4 quantizer
runs on CUDA only); on a GPU machine without pytest: `python tests/workstation/test_prequantized_nvfp4.py`."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINEARS_PER_LAYER, LAYERS = 7, 2


def _tiny_llama(path: Path) -> Path:
    """A random Llama whose projections are all multiples of NVFP4's 16-input blocks, and a BPE tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from pipeline.workstation.tinymodel import train_tokenizer
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=LAYERS, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=320, max_position_embeddings=512, eos_token_id=1,
                         tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(path)
    PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(320), bos_token="<|bos|>", eos_token="<|eos|>",
                            pad_token="<|pad|>").save_pretrained(path)
    return path


def restore_nvfp4(root: Path) -> dict:
    """Write, restore and compare (see the module doc): the figures the test asserts on."""
    import torch
    from safetensors.torch import load_file, save_file

    from pipeline.errors import PipelineError
    from pipeline.workstation.prequantized import dequantized, detect, read_tensors, split_quantized
    from pipeline.workstation.restore import restore
    from pipeline.workstation.state import load_quantized
    sys.path.insert(0, str(REPO / "tests"))
    from prequant_checkpoints import write_modelopt

    base = _tiny_llama(root / "base")
    ckpt = write_modelopt(base, root / "nvfp4", "nvfp4", "fp16", device="cuda")
    held = detect(ckpt)
    assert held is not None and held.algo == "NVFP4"
    (root / "q").mkdir()
    info = restore(ckpt, root / "q", held, "fp16").to_dict()
    # what the restored reference model multiplies by (its fake-quantized fp16 weights) against the checkpoint's
    # weights dequantized independently (prequantized.dequantized, fp32, rounded to fp16 as the model holds them).
    # Not against the model that wrote the checkpoint: ModelOpt's export gives q/k/v and gate/up one shared global
    # scale and re-quantizes them to it, so the checkpoint is not that model's numerics (its logits: cosine 0.98 here)
    restored = load_quantized(ckpt, root / "q", "cuda")
    linears, _ = split_quantized(held, read_tensors(ckpt))
    differing = total = 0
    with torch.no_grad():
        for name, m in restored.named_modules():
            if name in linears:
                ours = m.weight_quantizer(m.weight).float().cpu()
                want = dequantized(held, linears[name], True).half().float()
                differing += int((ours != want).sum())
                total += want.numel()
    # an input through the restored model: its activation quantizers run (NVFP4 blocks at the checkpoint's scale)
    probe = torch.tensor([[5, 17, 42, 99, 150, 7, 201, 33, 64, 12, 250, 3]], device="cuda")
    with torch.no_grad():
        finite = bool(torch.isfinite(restored(probe).logits).all())

    bad = root / "bad"
    shutil.copytree(ckpt, bad)
    (shard,) = bad.glob("*.safetensors")
    tensors = load_file(str(shard))
    # one block written as another quantizer might (its scale not max-calibrated: its largest code 4, not 6): the
    # block's own scale is then not what ModelOpt computes from its values, and the engine would not get the
    # checkpoint's numerics from ModelOpt's export
    key = "model.layers.0.self_attn.q_proj.weight"
    packed = tensors[key].clone()
    block = packed[0, :8].to(torch.int64)                   # row 0, inputs 0-15: two codes a byte
    lo, hi = block & 0xF, block >> 4
    lo, hi = (torch.where(c & 0x7 == 7, c - 1, c) for c in (lo, hi))     # 6 -> 4, sign kept
    assert not torch.equal(lo | (hi << 4), block)
    packed[0, :8] = (lo | (hi << 4)).to(torch.uint8)
    tensors[key] = packed
    save_file(tensors, str(shard), metadata={"format": "pt"})
    (root / "q-bad").mkdir()
    try:
        restore(bad, root / "q-bad", detect(bad), "fp16")
        refusal = None
    except PipelineError as exc:
        refusal = exc.message
    return {"reproduced_tensors": info.get("reproduced_tensors"), "device": info.get("device"),
            "restored_quantizers": info.get("restored_quantizers"), "weights_differing": differing,
            "weights": total, "finite": finite, "refusal": refusal, "damaged": key}


def check(r: dict) -> list[str]:
    problems = []
    # each linear: its packed weight, its block scales and both global scales
    if r["reproduced_tensors"] != 4 * LINEARS_PER_LAYER * LAYERS:
        problems.append(f"reproduced_tensors {r['reproduced_tensors']}, expected {4 * LINEARS_PER_LAYER * LAYERS}")
    if not str(r["device"]).startswith("cuda"):
        problems.append(f"restored on {r['device']}")
    if r["weights_differing"] or r["weights"] != LAYERS * 128 * (2 * 128 + 2 * 64 + 3 * 256) or not r["finite"]:
        problems.append(f"{r['weights_differing']} of {r['weights']} weights differ from the checkpoint's "
                        f"(finite logits: {r['finite']})")
    if r["refusal"] is None or f"{r['damaged']}: ModelOpt's NVFP4 quantizer does not give the checkpoint's values " \
            "back" not in r["refusal"]:
        problems.append(f"the damaged checkpoint was not refused naming {r['damaged']}: {r['refusal']}")
    return problems


try:
    import pytest
    import torch

    @pytest.mark.gpu
    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
    def test_an_nvfp4_checkpoint_is_restored_bit_for_bit_and_a_block_not_max_calibrated_is_refused(tmp_path):
        r = restore_nvfp4(tmp_path)
        assert not check(r), (check(r), r)
except ImportError:         # a GPU machine without pytest runs __main__ below
    pass


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    with tempfile.TemporaryDirectory() as d:
        result = restore_nvfp4(Path(d))
    print(json.dumps(result))
    print("\n".join(check(result)) or "ALL OK")
