"""EAGLE-3 draft checkpoints on the workstation: convert, check against the layout, make builtins, export to ONNX.

The draft's shape, pairing rules and memory are planning (pipeline/plan/speculative.py); this is the torch side.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.plan.speculative import DraftShape, draft_shape


def ensure_safetensors(draft_dir: Path) -> str | None:
    """Many EAGLE-3 drafts ship pytorch_model.bin: convert it (tensors only: weights_only loading runs no pickled
    code) so the rest of the pipeline reads one checked format. Returns the converted file's name, if any."""
    binary = draft_dir / "pytorch_model.bin"
    if not binary.is_file() or any(draft_dir.glob("*.safetensors")):
        return None
    import torch
    from safetensors.torch import save_file

    try:    # tensors only: a pickle that would build objects or run code is refused, never unpickled
        state = torch.load(binary, map_location="cpu", weights_only=True)
    except Exception as exc:        # UnpicklingError for a crafted pickle; a damaged zip raises others
        raise PipelineError(f"{binary}: refused: it holds something other than tensors, or is damaged "
                            f"({str(exc).splitlines()[0][:120]})", "use the draft repository's model.safetensors, or "
                            "a pytorch_model.bin of plain tensors (torch.save of a state dict)") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise PipelineError(f"{binary}: not a state dict of tensors", "use the draft repository's own weights")
    save_file({k: v.contiguous() for k, v in state.items()}, str(draft_dir / "model.safetensors"))
    binary.unlink()
    return binary.name


def check_draft_checkpoint(draft_dir: Path, source: str) -> DraftShape:
    """Config and every tensor's shape against the EAGLE-3 layout, from the safetensors headers alone."""
    from pipeline.plan.shapes import load_config
    from pipeline.workstation.safetensors_check import check_safetensors

    config_path = draft_dir / "config.json"
    if not config_path.exists():
        raise PipelineError(f"{source}: no config.json in {draft_dir}", "an EAGLE-3 draft directory has one")
    shape = draft_shape(load_config(config_path, "point [draft] at an EAGLE-3 draft's directory"), str(config_path))
    found: dict[str, tuple] = {}
    for shard in sorted(draft_dir.glob("*.safetensors")):
        found |= {k: s for k, (_, s) in check_safetensors(shard).items()}
    if not found:
        raise PipelineError(f"{source}: no weights in {draft_dir} (model.safetensors or pytorch_model.bin)",
                            "point the draft at the EAGLE-3 checkpoint's directory")
    want = shape.tensors()
    missing = sorted(set(want) - set(found))
    wrong = [f"{k} is {list(found[k])}, config says {list(s)}" for k, s in want.items()
             if k in found and tuple(found[k]) != s]
    if missing or wrong:
        raise PipelineError(f"{source}: {draft_dir} is not an EAGLE-3 draft of its config.json: "
                            + "; ".join(([f"missing {', '.join(missing[:5])}"] if missing else []) + wrong[:5]),
                            "use the draft repository's own files (config.json and weights of one revision)")
    return shape


def write_builtin(shape: DraftShape, d2t_targets, out: Path, config_extra: dict, seed: int) -> None:
    """A draft with random weights in the exact layout (acceptance is meaningless, the format is not)."""
    import json

    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, s in shape.tensors().items():
        if name == "d2t":
            tensors[name] = (d2t_targets - torch.arange(shape.draft_vocab_size)).to(torch.int64)
        elif name.endswith("norm.weight"):
            tensors[name] = torch.ones(s, dtype=torch.float16)
        else:
            tensors[name] = (torch.randn(s, generator=gen) * 0.05).to(torch.float16)
    t2d = torch.zeros(shape.vocab_size, dtype=torch.bool)
    t2d[d2t_targets] = True
    tensors["t2d"] = t2d                         # target-to-draft mask: EAGLE-3 repos ship it; Edge-LLM skips it
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"))
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": shape.hidden_size,
              "intermediate_size": shape.intermediate_size, "num_attention_heads": shape.num_heads,
              "num_key_value_heads": shape.num_kv_heads, "num_hidden_layers": shape.num_layers,
              "vocab_size": shape.vocab_size, "draft_vocab_size": shape.draft_vocab_size,
              "target_hidden_size": shape.target_hidden_size, "torch_dtype": "float16", **config_extra}
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
