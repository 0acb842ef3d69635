"""Reference outputs ("goldens") for the device to match, and the accuracy report of a quantization.

Both come from the calibrated model saved by the quantize stage, which computes exactly what the exported checkpoint
computes (see quantize.fuse_for_export): goldens are what a correct engine must reproduce, up to fp16 arithmetic.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from pipeline import contract
from pipeline.errors import PipelineError

HELDOUT = "heldout-en"


def stop_ids(model_dir, tokenizer) -> list[int]:
    """The ids that end a generation: generation_config.json's eos_token_id (an int or a list: Llama-3 Instruct stops
    at <|eot_id|> and <|eom_id|> as well as <|end_of_text|>) when the checkpoint has one, else the tokenizer's eos.
    The tokenizer's alone is wrong for several Instruct models."""
    import json
    from pathlib import Path
    try:
        eos = json.loads((Path(model_dir) / "generation_config.json").read_text()).get("eos_token_id")
    except (OSError, ValueError, AttributeError):
        eos = None
    ids = eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else []
    if not ids and tokenizer.eos_token_id is not None:
        ids = [tokenizer.eos_token_id]
    return [int(i) for i in ids]


def greedy(model, ids: list[int], max_new_tokens: int, top_k: int, eos: list[int]) -> dict:
    import torch

    out = model.generate(torch.tensor([ids], device=model.device), max_new_tokens=max_new_tokens, do_sample=False,
                         output_logits=True, return_dict_in_generate=True, eos_token_id=eos or None,
                         pad_token_id=eos[0] if eos else None)
    new = out.sequences[0, len(ids):].tolist()
    steps = []
    for logits in out.logits:
        lp = torch.log_softmax(logits[0].float(), -1)
        vals, idx = lp.topk(top_k)
        steps.append([[int(i), round(float(v), 5)] for i, v in zip(idx, vals, strict=True)])
    return {"output_ids": new, "top_logprobs": steps}


def uses_chat_template(tokenizer, validation: dict) -> bool:
    """[validation] chat_template, defaulting to whether the tokenizer has one (Instruct models do)."""
    wanted = validation.get("chat_template")
    return bool(tokenizer.chat_template) if wanted is None else bool(wanted)


def render_prompt(tokenizer, prompt: str, chat: bool) -> tuple[str, list[int]]:
    """The text and the exact token ids the deployed model is given for `prompt`.

    chat: the tokenizer's chat template with the generation prompt, as a chat application asks an Instruct model.
    The ids are the rendered text encoded without adding special tokens (the template already holds BOS where the
    model wants one: Llama-3's `{{ bos_token }}`), which is what transformers' apply_chat_template does and what
    Edge-LLM's runtime does with apply_chat_template: true. raw: the tokenizer's own encoding (it adds BOS where the
    model wants one); the rendered text then keeps the special tokens, so Edge-LLM's raw mode (which encodes with
    addBos=false) sees exactly these ids."""
    if chat:
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                 tokenize=False)
        return rendered, tokenizer(rendered, add_special_tokens=False)["input_ids"]
    ids = tokenizer(prompt)["input_ids"]
    return tokenizer.decode(ids, skip_special_tokens=False), ids


def make_goldens(model, tokenizer, validation: dict, model_dir=None) -> dict:
    """Greedy completions and per-step top-k log-probs for every validation prompt, asked as the deployed model is
    asked (render_prompt)."""
    chat = uses_chat_template(tokenizer, validation)
    if chat and not tokenizer.chat_template:
        raise PipelineError("validation.chat_template = true, but the model's tokenizer has no chat template",
                            "set [validation] chat_template = false for a base model, or use the instruct model")
    prompts = []
    stops = stop_ids(model_dir, tokenizer) if model_dir is not None else \
        ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])
    for prompt in validation["prompts"]:
        rendered, ids = render_prompt(tokenizer, prompt, chat)
        g = greedy(model, ids, validation["max_new_tokens"], validation["top_k_logprobs"], stops)
        prompts.append({"prompt": prompt, "rendered": rendered, "input_ids": ids, **g,
                        "text": tokenizer.decode(g["output_ids"], skip_special_tokens=True)})
    return {"format": contract.Goldens.FORMAT, "max_new_tokens": validation["max_new_tokens"],
            "min_token_agreement": validation["min_token_agreement"], "top_k": validation["top_k_logprobs"],
            "eos_token_id": stops[0] if stops else None, "stop_token_ids": stops, "chat_template": chat,
            "prompts": prompts}


def weak_prompts(goldens: dict) -> list[str]:
    """Prompts whose golden answer is shorter than half of max_new_tokens: few tokens to compare, a weak check."""
    return [p["prompt"] for p in goldens["prompts"] if len(p["output_ids"]) < goldens["max_new_tokens"] / 2]


def _windows(tokenizer, seq_len: int) -> list[list[int]]:
    from pipeline.workstation.tinymodel import corpus_text

    ids = tokenizer(corpus_text(HELDOUT), add_special_tokens=False)["input_ids"]
    return [ids[i:i + seq_len] for i in range(0, max(1, len(ids) - 1), seq_len) if len(ids[i:i + seq_len]) > 1]


def accuracy_report(original, quantized, tokenizer, seq_len: int = 256) -> dict:
    """Perplexity of both models on held-out text shipped with the repo, logit cosine and top-1 agreement."""
    import torch

    nll = {"original": 0.0, "quantized": 0.0}
    count, cos_sum, agree = 0, 0.0, 0
    with torch.no_grad():
        for w in _windows(tokenizer, seq_len):
            x = torch.tensor([w], device=original.device)
            lo, lq = original(x).logits[0].float(), quantized(x).logits[0].float()
            target = x[0, 1:]
            for name, lg in (("original", lo), ("quantized", lq)):
                nll[name] += float(torch.nn.functional.cross_entropy(lg[:-1], target, reduction="sum"))
            cos_sum += float(torch.nn.functional.cosine_similarity(lo, lq, dim=-1).sum())
            agree += int((lo.argmax(-1) == lq.argmax(-1)).sum())
            count += len(w)
    predicted = count - len(_windows(tokenizer, seq_len))
    ppl = {k: math.exp(v / predicted) for k, v in nll.items()}
    return {"heldout": HELDOUT, "tokens": count, "perplexity_original": round(ppl["original"], 4),
            "perplexity_quantized": round(ppl["quantized"], 4),
            "perplexity_change": round(ppl["quantized"] / ppl["original"] - 1, 4),
            "logit_cosine": round(cos_sum / count, 6), "top1_agreement": round(agree / count, 6)}


def advice(report: dict, weights: str) -> str:
    change = report["perplexity_change"]
    if change <= 0.02 and report["top1_agreement"] >= 0.95:
        return f"{weights} keeps the model's behaviour: perplexity {change:+.1%}, top-1 agreement " \
               f"{report['top1_agreement']:.1%}."
    alt = "int8_sq or int8_wo (Orin), fp8 (Thor)" if weights in ("int4_awq", "w4a8_awq", "nvfp4") else "fp16"
    return f"{weights} changes the model measurably: perplexity {change:+.1%}, top-1 agreement " \
           f"{report['top1_agreement']:.1%}. If validation answers degrade, try {alt}, more calibration samples, " \
           "or calibration text closer to your prompts."


def write_report(out: Path, report: dict, weights: str, recipe: str, model_digest: str | None = None) -> None:
    report = {**report, "advice": advice(report, weights), "weights": weights, "recipe": recipe,
              "model_digest": model_digest}     # the fetched model's content digest: formats compare on the same model
    (out / contract.ACCURACY_JSON).write_text(json.dumps(report, indent=1) + "\n")
    md = [f"# Accuracy: {recipe} ({weights})", "",
          "| metric | original | quantized |", "|---|---|---|",
          f"| perplexity ({report['heldout']}, {report['tokens']} tokens) | {report['perplexity_original']} | "
          f"{report['perplexity_quantized']} ({report['perplexity_change']:+.2%}) |",
          f"| logit cosine vs original | 1 | {report['logit_cosine']} |",
          f"| top-1 agreement vs original | 1 | {report['top1_agreement']:.2%} |", "", report["advice"], ""]
    (out / contract.ACCURACY_MD).write_text("\n".join(md))
