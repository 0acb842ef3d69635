"""Reference outputs ("goldens") for the device to match, and the accuracy report of a quantization.

Both come from the calibrated model saved by the quantize stage, which computes exactly what the exported checkpoint
computes (see quantize.fuse_for_export): goldens are what a correct engine must reproduce, up to fp16 arithmetic.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Protocol

from pipeline import contract
from pipeline.errors import PipelineError
from pipeline.resampling import bootstrap_interval as resampled
from pipeline.texts import TextSource

HELDOUT = "heldout-long-en"      # the default held-out text: ~4,800 tokens of varied English written for this project
HELDOUT_MAX = 64 * 2**20      # a held-out text of a few thousand tokens is tens of KB; more is not one


def heldout_path(spec: str | TextSource, recipe_file: str) -> Path:
    """The file of [validation] heldout: "builtin:NAME" (pipeline/data/corpus/NAME.txt) or "file:PATH" (relative to
    the recipe). The accuracy stage's key hashes it and the stage reads it: one resolution for both."""
    parsed = TextSource.parse(spec, recipe_file)
    path = parsed.path(recipe_file)
    if path is None:
        raise PipelineError(f"{recipe_file}: validation.heldout = {str(parsed)!r}: a held-out text is a builtin: or "
                            "file:", "use builtin:NAME or file:PATH")
    return path


def heldout_text(spec: str | TextSource, recipe_file: str) -> tuple[str, str]:
    """(name, text) of [validation] heldout: "builtin:NAME" (pipeline/data/corpus) or "file:PATH" (relative to the
    recipe)."""
    from pipeline.workstation.calibration import read_text_file
    from pipeline.workstation.tinytrain import corpus_text
    parsed = TextSource.parse(spec, recipe_file)
    if parsed.kind == "builtin":
        return parsed.value, corpus_text(parsed.value)       # its error lists the builtin corpora
    path = heldout_path(parsed, recipe_file)
    # a regular file of bounded size: a FIFO or a link to /dev/zero named here is an error, not a hang
    return path.name, read_text_file(path, f"{recipe_file}: validation.heldout = {str(parsed)!r}", HELDOUT_MAX)


def stop_ids(model_dir, tokenizer) -> list[int]:
    """The ids that end a generation: generation_config.json's eos_token_id (an int or a list: Llama-3 Instruct stops
    at <|eot_id|> and <|eom_id|> as well as <|end_of_text|>) when the checkpoint has one, else the tokenizer's eos.
    The tokenizer's alone is wrong for several Instruct models."""
    from pathlib import Path

    from pipeline.workstation.fetch import generation_stop_ids
    ids = generation_stop_ids(Path(model_dir), len(tokenizer)) or []
    if not ids and tokenizer.eos_token_id is not None:
        ids = [tokenizer.eos_token_id]
    return [int(i) for i in ids]


def greedy(model, ids: list[int], max_new_tokens: int, top_k: int, eos: list[int], **inputs) -> dict:
    """inputs: a vision-language model's image inputs (pixel_values, image_grid_thw) for the prompt's image."""
    import torch

    from pipeline.workstation.models import input_device, new_cache

    device = input_device(model)
    cache = new_cache(model)
    given = {"past_key_values": cache} if cache is not None else {}
    out = model.generate(torch.tensor([ids], device=device), max_new_tokens=max_new_tokens,
                         do_sample=False, output_logits=True, return_dict_in_generate=True,
                         eos_token_id=eos or None, pad_token_id=eos[0] if eos else None,
                         **given, **{k: v.to(device) for k, v in inputs.items()})
    new = out.sequences[0, len(ids):].tolist()
    steps = []
    for logits in out.logits:
        lp = torch.log_softmax(logits[0].float(), -1)
        vals, idx = lp.topk(top_k)
        steps.append([[int(i), round(float(v), 5)] for i, v in zip(idx, vals, strict=True)])
    return {"output_ids": new, "top_logprobs": steps}


# An engine computes the deployed numerics in another order (FP16 accumulation, fused kernels); where the reference's
# runner-up is this close to its choice, either token is the model's answer. FP16 activations: 0.03 nats, two FP16
# steps of a logit between 16 and 32 (2^-6 each), where real models' top logits lie. Where the engine rounds
# activations or K/V to 8 bits or fewer, an input that order moved across a rounding boundary lands a whole step away
# (an E4M3 step is 1/8 of the value): 0.1 nats.
TIE_LOGPROB = 0.03
TIE_LOGPROB_ROUNDED = 0.1


def tie_logprob(rounds_activations: bool) -> float:
    """The widest margin at which a golden step counts as a near tie (formats.rounds_activations says which)."""
    return TIE_LOGPROB_ROUNDED if rounds_activations else TIE_LOGPROB


def near_ties(tokenizer, output_ids: list[int], top_logprobs: list[list[list[float]]],
              tie: float) -> list[contract.NearTie]:
    """Each step's runner-ups within `tie` of the golden token (top_logprobs: greedy()'s [id, logprob] per step),
    with the answer's text as it reads through that token (for runtimes that return text only)."""
    ties = []
    for step, (chosen, top) in enumerate(zip(output_ids, top_logprobs, strict=False)):
        best = next((v for i, v in top if int(i) == chosen), None)
        if best is None:
            continue
        for i, v in top:
            if int(i) != chosen and best - v <= tie:
                text = tokenizer.decode([*output_ids[:step], int(i)], skip_special_tokens=True)
                ties.append(contract.NearTie(step=step, token_id=int(i), margin=round(best - v, 5), text=text))
    return ties


RENDER_TIMEOUT_S = 10
RENDER_MAX_BYTES = 1 * 2**20       # a prompt rendered by its template: a few KB; a megabyte is a runaway template
RENDER_MEMORY = 1 * 2**30          # what the rendering may allocate beyond the process it is forked from


def render_chat(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """The tokenizer's chat template applied as transformers applies it (its Jinja sandbox), in a forked child with
    a time, memory and output bound: a template from a model directory that raises, loops for ever, allocates
    without end or probes the sandbox is one error naming the template, never a hang or a crash of this process."""
    import json
    import os
    import resource
    import select
    import signal
    import time

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:        # the child: render, write the JSON answer, exit without running the parent's handlers
        code = 0
        try:
            os.close(r)
            with open("/proc/self/statm") as fh:
                vm = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            resource.setrlimit(resource.RLIMIT_AS, (vm + RENDER_MEMORY, vm + RENDER_MEMORY))
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                 tokenize=False)
            out = json.dumps({"text": text} if isinstance(text, str) and len(text) <= RENDER_MAX_BYTES else
                             {"error": f"it rendered more than {RENDER_MAX_BYTES} bytes for one prompt"}
                             if isinstance(text, str) else {"error": "it rendered no text"})
        except BaseException as exc:    # noqa: BLE001 - whatever the template raised is the answer
            out = json.dumps({"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"})
        try:
            data = out.encode()[:RENDER_MAX_BYTES + 64]
            while data:
                data = data[os.write(w, data):]
        except BaseException:           # noqa: BLE001
            code = 1
        os._exit(code)
    os.close(w)
    chunks, size, deadline, why = [], 0, time.monotonic() + RENDER_TIMEOUT_S, None
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                why = f"ran longer than {RENDER_TIMEOUT_S} s"
                break
            if not select.select([r], [], [], left)[0]:
                continue
            chunk = os.read(r, 65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > RENDER_MAX_BYTES + 64:
                why = f"rendered more than {RENDER_MAX_BYTES} bytes for one prompt"
                break
    finally:
        os.close(r)
        if why:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    hint = "fix or remove the chat template, or set [validation] chat_template = false"
    if why:
        raise PipelineError(f"{template_source(tokenizer)}: the chat template {why}", hint)
    try:
        answer = json.loads(b"".join(chunks))
    except ValueError:
        answer = {"error": "the renderer died (out of memory?)"}
    if "text" not in answer:
        raise PipelineError(f"{template_source(tokenizer)}: the chat template fails: {answer.get('error')}", hint)
    return answer["text"]


def template_source(tokenizer) -> str:
    """Where the tokenizer's chat template came from, to name it in an error: chat_template.jinja beside the
    tokenizer (transformers prefers it), else tokenizer_config.json's chat_template."""
    from pathlib import Path
    where = Path(str(getattr(tokenizer, "name_or_path", "") or "."))
    jinja = where / "chat_template.jinja"
    return str(jinja) if jinja.is_file() else f"{where / 'tokenizer_config.json'} (chat_template)"


class GoldenSettings(Protocol):
    """What the goldens read of a recipe's [validation] (pipeline.recipe.ValidationSettings)."""
    @property
    def prompts(self) -> tuple[str, ...]: ...
    @property
    def max_new_tokens(self) -> int: ...
    @property
    def top_k_logprobs(self) -> int: ...
    @property
    def min_token_agreement(self) -> float: ...
    @property
    def chat_template(self) -> bool | None: ...


def uses_chat_template(tokenizer, validation: GoldenSettings) -> bool:
    """[validation] chat_template, defaulting to whether the tokenizer has one (Instruct models do)."""
    wanted = validation.chat_template
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
        rendered = render_chat(tokenizer, [{"role": "user", "content": prompt}])
        return rendered, tokenizer(rendered, add_special_tokens=False)["input_ids"]
    ids = tokenizer(prompt)["input_ids"]
    return tokenizer.decode(ids, skip_special_tokens=False), ids


def prompts_too_long(lengths: list[tuple[str, int]], max_new_tokens: int, max_input_len: int,
                     max_seq_len: int) -> list[str]:
    """Each validation prompt that the engine could not take: longer than max_input_len, or with its answer longer
    than max_seq_len (TensorRT-LLM refuses such a request; the device would fail after the kit was signed)."""
    out = []
    for i, (prompt, n) in enumerate(lengths):
        short = prompt if len(prompt) <= 40 else prompt[:37] + "..."
        if n > max_input_len:
            out.append(f"validation.prompts[{i}] ({short!r}) is {n} tokens as the model is asked it; the engine "
                       f"takes at most build.max_input_len = {max_input_len}")
        elif n + max_new_tokens > max_seq_len:
            out.append(f"validation.prompts[{i}] ({short!r}) is {n} tokens + max_new_tokens {max_new_tokens} = "
                       f"{n + max_new_tokens}, more than build.max_seq_len = {max_seq_len}")
    return out


def prompt_lengths(model_dir, validation: GoldenSettings) -> list[tuple[str, int]]:
    """(prompt, tokens) as the goldens will render each validation prompt (chat template or raw)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    chat = uses_chat_template(tok, validation) and bool(tok.chat_template)
    return [(p, len(render_prompt(tok, p, chat)[1])) for p in validation.prompts]


def make_goldens(model, tokenizer, validation: GoldenSettings, model_dir=None, images=None,
                 tie: float = TIE_LOGPROB) -> contract.Goldens:
    """Greedy completions and per-step top-k log-probs for every validation prompt, asked as the deployed model is
    asked (render_prompt); with `images` (workstation/image_prompts.py ImagePrompts, or a speech model's
    audio_prompts.py RecordingPrompts) the first prompts are asked with their images (recordings). `tie`
    (tie_logprob): the margin within which a runner-up is recorded as a near tie, and a router's experts are
    (routing_ties.py: a text prompt's; an image prompt's routing is not re-run)."""
    from pipeline.workstation.routing_ties import routing_ties
    chat = uses_chat_template(tokenizer, validation)
    if chat and not tokenizer.chat_template:
        raise PipelineError("validation.chat_template = true, but the model's tokenizer has no chat template",
                            "set [validation] chat_template = false for a base model, or use the instruct model")
    prompts = []
    stops = stop_ids(model_dir, tokenizer) if model_dir is not None else \
        ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])
    for i, prompt in enumerate(validation.prompts):
        if images is not None and i < len(images):
            prompts.append(images.golden(model, tokenizer, prompt, i, validation.max_new_tokens,
                                         validation.top_k_logprobs, stops))
            continue
        rendered, ids = render_prompt(tokenizer, prompt, chat)
        g = greedy(model, ids, validation.max_new_tokens, validation.top_k_logprobs, stops)
        prompts.append(contract.GoldenPrompt(
            prompt=prompt, rendered=rendered, input_ids=ids, output_ids=g["output_ids"],
            top_logprobs=g["top_logprobs"], text=tokenizer.decode(g["output_ids"], skip_special_tokens=True),
            near_ties=routing_ties(model, tokenizer, ids, g["output_ids"], tie)))
    goldens = contract.Goldens(max_new_tokens=validation.max_new_tokens,
                            min_token_agreement=validation.min_token_agreement, top_k=validation.top_k_logprobs,
                            eos_token_id=stops[0] if stops else None, stop_token_ids=stops, chat_template=chat,
                            prompts=[dataclasses.replace(p, near_ties=near_ties(tokenizer, p.output_ids,
                                                                                p.top_logprobs, tie) + p.near_ties)
                                     for p in prompts], tie_logprob=tie)
    bad = goldens.non_finite()
    if bad is not None:
        raise PipelineError(f"the reference model's log-probabilities are not finite ({bad}): it computes NaN or Inf, "
                            "and no goldens are written from it",
                            "check the checkpoint's weights and scales (a pre-quantized checkpoint with NaN or Inf "
                            "scales computes NaN), or quantize it from the original weights")
    return goldens


def weak_prompts(goldens: contract.Goldens) -> list[str]:
    """Prompts whose golden answer is shorter than half of max_new_tokens: few tokens to compare, a weak check."""
    return [p.prompt for p in goldens.prompts if len(p.output_ids) < goldens.max_new_tokens / 2]


def _windows(tokenizer, text: str, seq_len: int) -> list[list[int]]:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return [ids[i:i + seq_len] for i in range(0, max(1, len(ids) - 1), seq_len) if len(ids[i:i + seq_len]) > 1]


def bootstrap_interval(per_window: list[tuple[float, float, int]], rounds: int = 2000, seed: int = 0,
                       level: float = 0.95) -> tuple[float, float]:
    """Interval of the perplexity change from resampling the held-out windows with replacement: per window (nll of
    the original, nll of the quantized, predicted tokens). A change inside the interval of 0 is noise."""
    def change(sample: list[tuple[float, float, int]]) -> float:
        tokens = sum(s[2] for s in sample)
        return math.exp((sum(s[1] for s in sample) - sum(s[0] for s in sample)) / tokens) - 1

    lo, hi = resampled(per_window, change, rounds, seed, level)
    return round(lo, 4), round(hi, 4)


def accuracy_report(original, quantized, tokenizer, text: str, name: str,
                    seq_len: int = 256) -> contract.AccuracyFigures:
    """Perplexity of both models on held-out text (with a bootstrap interval over its windows), logit cosine and
    top-1 agreement."""
    import torch

    from pipeline.workstation.models import input_device

    count, cos_sum, agree = 0, 0.0, 0
    per_window: list[tuple[float, float, int]] = []
    with torch.no_grad():
        for w in _windows(tokenizer, text, seq_len):
            x = torch.tensor([w], device=input_device(original))
            lo, lq = original(x).logits[0].float(), quantized(x).logits[0].float()
            target = x[0, 1:]
            nll = [float(torch.nn.functional.cross_entropy(lg[:-1], target, reduction="sum")) for lg in (lo, lq)]
            per_window.append((nll[0], nll[1], len(w) - 1))
            cos_sum += float(torch.nn.functional.cosine_similarity(lo, lq, dim=-1).sum())
            agree += int((lo.argmax(-1) == lq.argmax(-1)).sum())
            count += len(w)
    predicted = sum(p[2] for p in per_window)
    ppl = {"original": math.exp(sum(p[0] for p in per_window) / predicted),
           "quantized": math.exp(sum(p[1] for p in per_window) / predicted)}
    return contract.AccuracyFigures(
        heldout=name, tokens=count, windows=len(per_window), perplexity_original=round(ppl["original"], 4),
        perplexity_quantized=round(ppl["quantized"], 4),
        perplexity_change=round(ppl["quantized"] / ppl["original"] - 1, 4),
        perplexity_change_interval=list(bootstrap_interval(per_window)), logit_cosine=round(cos_sum / count, 6),
        top1_agreement=round(agree / count, 6))


def advice(figures: contract.AccuracyFigures, weights: str) -> str:
    change, top1 = figures.perplexity_change, figures.top1_agreement
    if change <= 0.02 and top1 >= 0.95:
        return f"{weights} keeps the model's behaviour: perplexity {change:+.1%}, top-1 agreement {top1:.1%}."
    lo, hi = figures.perplexity_change_interval
    noise = " (within noise: the interval holds 0)" if lo <= 0 <= hi else ""
    return f"{weights} changes the model measurably: perplexity {change:+.1%}{noise}, top-1 agreement " \
           f"{top1:.1%}. Build the recipe with other quantization.weights to measure them on " \
           "this model (the package stage names those within the recipe's quality gate), or try more calibration " \
           "samples or calibration text closer to your prompts."


def write_report(out: Path, figures: contract.AccuracyFigures, weights: str, recipe: str,
                 model_digest: str | None = None, original: str | None = None) -> contract.AccuracyReport:
    """accuracy.json (the record) and accuracy.md (for people). model_digest: the fetched model's content digest,
    so formats compare on the same model. original: what "original" is where it is not the unquantized model."""
    fields = {f.name: getattr(figures, f.name) for f in dataclasses.fields(figures)}     # nested records kept
    r = contract.AccuracyReport(**fields, weights=weights, recipe=recipe,
                                advice=advice(figures, weights), model_digest=model_digest, original=original)
    r.dump(out / contract.ACCURACY_JSON)
    lo, hi = r.perplexity_change_interval
    md = [f"# Accuracy: {recipe} ({weights})", "", *([f"original: {original}", ""] if original else []),
          "| metric | original | quantized |", "|---|---|---|",
          f"| perplexity ({r.heldout}, {r.tokens} tokens) | {r.perplexity_original} | {r.perplexity_quantized} "
          f"({r.perplexity_change:+.2%}; 95% interval {lo:+.2%} to {hi:+.2%}) |",
          f"| logit cosine vs original | 1 | {r.logit_cosine} |",
          f"| top-1 agreement vs original | 1 | {r.top1_agreement:.2%} |",
          *([f"| top-1 agreement on the {r.image_prompts} image prompts | 1 | {r.image_top1_agreement:.2%} |"]
            if r.image_top1_agreement is not None else []),
          *(f"| {q.metric.upper()} on the speech set, {q.language} ({q.utterances} utterances) | {o.rate:.2%} | "
            f"{q.rate:.2%} (95% interval {q.low:.2%} to {q.high:.2%}) |"
            for o, q in zip(r.speech_original, r.speech_quantized, strict=False)), "", r.advice, ""]
    (out / contract.ACCURACY_MD).write_text("\n".join(md))
    return r
