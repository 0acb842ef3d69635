"""Validation runners, one per backend (named by each backend's registry record): run the kit's golden prompts
on the built engine and return what each produced, timed.

    trtllm-0.12   python -m pipeline.device.trtllm_runner (ModelRunnerCpp; returns token ids)
    edgellm       llm_inference (Edge-LLM's C++ runtime; returns text, so agreement is measured on the text)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from pipeline import contract
from pipeline.device.process import run_logged


def edgellm_inference_input(goldens: contract.Goldens) -> dict:
    """llm_inference's input file, greedy, asking the engine exactly what the goldens asked the reference model:
    with the chat template, the user message and apply_chat_template + add_generation_prompt (the runtime renders the
    kit's chat_template.jinja, as transformers did for the goldens); raw, the rendered text, which keeps the special
    tokens the goldens' ids began with (raw mode encodes with addBos=false, FACTS.md)."""
    chat = goldens.chat_template
    return {"batch_size": 1, "temperature": 0.0, "top_p": 1.0, "top_k": 1,
            "max_generate_length": goldens.max_new_tokens, "apply_chat_template": chat,
            "add_generation_prompt": chat,
            "requests": [{"messages": [{"role": "user", "content": p.prompt if chat else (p.rendered or p.prompt)}]}
                         for p in goldens.prompts]}


def validate_edgellm(kit_dir: Path, engine: Path, plan: contract.Plan, goldens: contract.Goldens, work: Path) -> dict:
    """Edge-LLM's C++ runtime gives text, not token ids: agreement is then measured on the text (report.py)."""
    (work / "inference-input.json").write_text(json.dumps(edgellm_inference_input(goldens), indent=1))
    results = []
    for i, golden in enumerate(goldens.prompts):
        single = edgellm_inference_input(goldens)
        single["requests"] = single["requests"][i:i + 1]
        (work / f"input-{i}.json").write_text(json.dumps(single))
        seconds = run_logged(["llm_inference", "--engineDir", str(engine), "--inputFile", str(work / f"input-{i}.json"),
                              "--outputFile", str(work / f"output-{i}.json"), "--warmup", "1",
                              *(["--specDecode"] if plan.speculative else [])],
                             cwd=work, log=work / f"validate-{i}.log", timeout=3600)
        text = json.loads((work / f"output-{i}.json").read_text())["responses"][0]["output_text"]
        results.append({"prompt": golden.prompt, "output_text": text, "seconds": seconds,
                        "ttft_s": None, "decode_tok_s": None})
    return {"runtime": "llm_inference", "prompts": results}


def validate_trtllm(kit_dir: Path, engine: Path, plan: contract.Plan, goldens: contract.Goldens, work: Path) -> dict:
    out = work / contract.VALIDATION
    run_logged([sys.executable, "-m", "pipeline.device.trtllm_runner", "--engine-dir", str(engine),
                "--goldens", str(kit_dir / contract.GOLDENS), "--out", str(out),
                "--kv-tokens", str(plan.limits.max_batch_size * plan.limits.max_seq_len)],
               cwd=work, log=work / "validate.log", timeout=3600,
               env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                   [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])))
    return json.loads(out.read_text())
