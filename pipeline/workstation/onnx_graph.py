"""An exported ONNX graph against what its consumer (llm_build, visual_build) expects: inputs, outputs, custom ops and
the files beside it. ONNX Runtime cannot run graphs with Edge-LLM's plugins, so this structural check runs on every
export; the numeric checks are the exporters' own (the reader, the tower check)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from pipeline.errors import PipelineError


def check_graph(path: Path, inputs, outputs, ops=(), extra_files=(), consumer: str = "llm_build",
                path_name: str = "Edge-LLM", attention: str = "trt_edgellm:AttentionPlugin",
                counts: dict[str, int] | None = None) -> dict:
    """An exported graph's inputs, outputs, custom ops and sidecar files against what `consumer` expects (ONNX
    Runtime cannot check graphs with Edge-LLM's plugins, so this is what we can check on the workstation). counts:
    ops (domain:type) that must occur exactly so many times."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    have_in, have_out = [i.name for i in m.graph.input], [o.name for o in m.graph.output]
    made = Counter(f"{n.domain}:{n.op_type}" for n in m.graph.node)
    have_ops = sorted(made)
    problems = [f"missing input {n}" for n in inputs if n not in have_in]
    problems += [f"missing output {n}" for n in outputs if n not in have_out]
    problems += [f"no {f} beside it" for f in extra_files if not (path.parent / f).is_file()]
    problems += [f"no {op} node" for op in (attention, *ops) if op not in have_ops]
    problems += [f"{made[op]} {op} nodes where {n} were expected" for op, n in (counts or {}).items()
                 if made[op] != n]
    if problems:
        raise PipelineError(f"{path} is not what {consumer} expects: " + "; ".join(problems),
                            f"this is a bug in the {path_name} export path; please report it with the recipe")
    return {"inputs": have_in, "outputs": have_out, "custom_ops": [o for o in have_ops if not o.startswith(":")],
            "ops": len(m.graph.node)}
