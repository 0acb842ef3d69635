"""A hybrid recurrent checkpoint as TensorRT Edge-LLM 0.11's loader reads it, and proof that it read it.

transformers 5 saves a Nemotron-H checkpoint under the hub's `backbone.` prefix with its embedding as
`backbone.embedding.weight` (its conversion mapping: hub `embedding.weight` <-> `embeddings.weight`), and derives
`num_hidden_layers` from the block list without saving it. Edge-LLM's nemotron_h loader reads
`backbone.embeddings.weight` and `num_hidden_layers`: without the first it keeps its own random embedding and exports
without a word (seen here: every logit wrong, the graph otherwise sound); without the second it stops with a
KeyError. So the checkpoint the export reads is given both, and the exported embedding table is compared with the
checkpoint's, tensor for tensor, before the stage succeeds.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.workstation.export_steps import PartExport


def _shards(hf: Path) -> list[Path]:
    return sorted(hf.glob("*.safetensors"))


def prepare(hf: Path) -> list[str]:
    """Put right, in the checkpoint directory `hf` the export reads, what Edge-LLM's loader reads differently from
    what transformers writes (the tensors its Support for the family renames: backends/edgellm.py); returns what was
    changed (for the stage's log)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from pipeline.backends import family_support
    from pipeline.backends.edgellm import BACKEND

    config_path = hf / "config.json"
    config = json.loads(config_path.read_text())
    done = []
    blocks = config.get("layers_block_type")
    if config.get("num_hidden_layers") is None and isinstance(blocks, list):
        config["num_hidden_layers"] = len(blocks)
        config_path.write_text(json.dumps(config, indent=2))
        done.append(f"num_hidden_layers = {len(blocks)} (from layers_block_type)")
    support = family_support(BACKEND.name, (config.get("architectures") or ["?"])[0])
    renames = dict(support.checkpoint_renames if support is not None else ())
    for shard in _shards(hf):
        with safe_open(str(shard), "pt") as fh:
            names, metadata = set(fh.keys()), fh.metadata()
        hits = {old: new for old, new in renames.items() if old in names}
        if not hits:
            continue
        tensors = load_file(str(shard))
        for old, new in hits.items():
            tensors[new] = tensors.pop(old)
            done.append(f"{old} -> {new}")
        save_file(tensors, str(shard), metadata=metadata)
        index = hf / "model.safetensors.index.json"
        if index.is_file():
            data = json.loads(index.read_text())
            weight_map = data.get("weight_map", {})
            for old, new in hits.items():
                if old in weight_map:
                    weight_map[new] = weight_map.pop(old)
            index.write_text(json.dumps(data, indent=2))
    return done


def check_embedding(onnx_dir: Path, hf: Path, names: tuple[str, ...]) -> None:
    """The exported embedding table (embedding.safetensors) is the checkpoint's, exactly: a loader that skipped the
    checkpoint's tensor leaves a random one that nothing else in the graph would show."""
    import numpy as np
    from safetensors import safe_open

    with safe_open(str(onnx_dir / "embedding.safetensors"), "np") as fh:
        exported = fh.get_tensor("embedding")
    for shard in _shards(hf):
        with safe_open(str(shard), "np") as fh:
            found = [k for k in fh.keys() if k.rsplit(".", 2)[-2] in names and k.endswith(".weight")]
            if found:
                original = fh.get_tensor(found[0])
                break
    else:
        raise PipelineError(f"{hf}: no embedding tensor ({' or '.join(names)}) to check the export against",
                            "this is a bug in the Edge-LLM export path; please report it with the recipe")
    if exported.shape != original.shape or not np.array_equal(exported.astype(np.float16),
                                                               original.astype(np.float16)):
        raise PipelineError(f"{onnx_dir / 'embedding.safetensors'}: Edge-LLM's exporter wrote an embedding table "
                            f"that is not the checkpoint's {found[0]} ({list(exported.shape)} vs "
                            f"{list(original.shape)}): its loader did not read the checkpoint's tensor",
                            "this is a bug in the Edge-LLM export path; please report it with the recipe")


class HybridExport(PartExport):
    """The Edge-LLM export's steps for a hybrid's recurrent layers (workstation/export_steps.py)."""

    def prepare(self, part, hf: Path) -> list[str]:  # noqa: ARG002  (the protocol's: a hybrid needs only hf)
        return prepare(hf)

    def check(self, part, shape, onnx_dir: Path, hf: Path) -> None:  # noqa: ARG002
        from pipeline.families import family
        fam = family(shape.architecture)
        check_embedding(onnx_dir, hf, fam.embedding_names if fam is not None else ("embeddings",))

    def graph(self, part, shape, weights: str) -> dict:
        """check_onnx's expectations: each recurrent layer's states and plugins, and exactly its INT4 GEMMs (routed
        experts, where it has them, are in the format's MoE plugin instead)."""
        from pipeline.formats import WEIGHT_FORMATS
        return {"recurrent": (part.recurrent.kind, len(part.recurrent.layer_ids)),
                "int4_linears": shape.gemm_linears(WEIGHT_FORMATS[weights])}
