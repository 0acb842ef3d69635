"""Qwen3.5's multi-token prediction (MTP) layer on the workstation: its reference module, its brief training for the
tiny twins, and carrying its tensors from the fetched checkpoint into the unified checkpoint Edge-LLM exports.

transformers loads Qwen3.5 without its `mtp.*` tensors (_keys_to_ignore_on_load_unexpected), so the calibrated model
has none: the export stage copies them, as the checkpoint has them, beside the quantized decoder and excludes them
from quantization (Edge-LLM 0.11's make_mtp_draft_config: a draft whose MLP is excluded is exported unquantized; its
guide: quantizing a draft lowers its acceptance). Edge-LLM's exporter then makes the base (`mtp_base`: it also emits
its final, normed hidden states) and the draft (`mtp_draft`) from that one checkpoint.

The draft, as Edge-LLM's Qwen3_5MtpDraftModel computes it: for the token at position t+1 and the base's normed hidden
state at t, fc(cat(norm_e(embed(token)), norm_h(hidden))) -> one gated-attention decoder layer -> norm -> the base's
lm_head, a guess at the token at t+2. Chained, the draft's own normed output stands in for the base's hidden state.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.errors import PipelineError

PREFIX = "mtp."
EXCLUDE = "mtp*"            # the unified checkpoint's exclude pattern for them (fnmatch, as Edge-LLM reads it)
MTP_FILE = "mtp.safetensors"


def mtp_head(config):
    """The reference MTP layer for a transformers Qwen3.5 text config (torch module, fp32)."""
    import copy

    import torch
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

    one = copy.deepcopy(config)
    one.layer_types, one.num_hidden_layers = ["full_attention"], 1
    h, eps = config.hidden_size, config.rms_norm_eps

    class MtpHead(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.pre_fc_norm_embedding = Qwen3_5RMSNorm(h, eps=eps)
            self.pre_fc_norm_hidden = Qwen3_5RMSNorm(h, eps=eps)
            self.fc = torch.nn.Linear(2 * h, h, bias=False)
            self.layers = torch.nn.ModuleList([Qwen3_5DecoderLayer(one, 0)])
            self.norm = Qwen3_5RMSNorm(h, eps=eps)

        def forward(self, embeds, hidden, position_embeddings):
            x = self.fc(torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], -1))
            for layer in self.layers:
                x = layer(x, position_embeddings=position_embeddings)
            return self.norm(x)

    return MtpHead()


def _base_states(model, x):
    """The base's normed final hidden states for token windows x [B, T] and its RoPE tables for them."""
    import torch
    inner = model.model
    hidden = inner(input_ids=x).last_hidden_state
    pos = torch.arange(x.shape[1]).view(1, 1, -1).expand(3, x.shape[0], -1)
    return hidden, inner.rotary_emb(hidden, pos)


def train_mtp(model, tokenizer, steps: int, seed: int, progress=None) -> dict:
    """Train an MTP layer for the (already trained, now frozen) base on the shipped corpus: from the base's hidden
    state at t and the token at t+1, the token at t+2. Returns its tensors as the hub names them (mtp.*)."""
    import torch

    from pipeline.workstation.tinytrain import corpus_text, train_on_windows
    torch.manual_seed(seed)
    head = mtp_head(model.config).float()
    for p in model.parameters():
        p.requires_grad_(False)
    embed, lm_head = model.get_input_embeddings(), model.get_output_embeddings()

    def loss_of(x):
        with torch.no_grad():
            hidden, (cos, sin) = _base_states(model, x)
        out = head(embed(x[:, 1:-1]), hidden[:, :-2], (cos[:, :-2], sin[:, :-2]))
        return torch.nn.functional.cross_entropy(lm_head(out).flatten(0, 1), x[:, 2:].flatten())

    train_on_windows(head.parameters(), loss_of, tokenizer(corpus_text("calib-en"))["input_ids"], steps, seed,
                     progress)
    return {PREFIX + k: v.detach().contiguous() for k, v in head.state_dict().items()}


def acceptance_on(model, model_dir: Path, answers: list[tuple[list[int], list[int]]], steps: int
                  ) -> tuple[float, float] | None:
    """What the MTP draft earns on the golden answers, in deployed numerics: the calibrated base's normed hidden
    states and the checkpoint's MTP layer with its weights as exported (fp16), run as Edge-LLM's MTP chain runs it
    (the runtime double's edgellm_mtp.py): each step the draft proposes `steps` tokens, the first from the base's
    hidden state, the later ones from its own output, and the base keeps those that are its answer's next tokens,
    plus its own. Returns (how often the first proposal was right, the tokens per base step after the first token,
    as a mean over the answers as the device report averages its prompts'); None: no answer long enough to ask the
    draft. answers: (prompt ids, answer ids), the answers the base's greedy
    ones (so the base's hidden states along them are what it computes while decoding)."""
    import torch

    head = mtp_head(model.config).float().eval()
    head.load_state_dict({k[len(PREFIX):]: v.to(torch.float16).float() for k, v in checkpoint_mtp(model_dir).items()})
    device = next(model.parameters()).device
    head.to(device)
    embed, lm_head = model.get_input_embeddings(), model.get_output_embeddings()
    first_hits = first_asked = 0
    rates: list[float] = []
    with torch.no_grad():
        for prompt, answer in answers:
            ids = prompt + answer
            if len(answer) < 2:
                continue
            x = torch.tensor([ids], device=device)
            hidden, (cos, sin) = _base_states(model, x)
            hidden, cos, sin = hidden[0].float(), cos.float(), sin.float()
            vectors = embed(x)[0].float()

            def draft(pairs_e, pairs_h, cos=cos, sin=sin):
                """The draft over pairs (token at p + 1, hidden state for p), p = 0..: its last output and guess."""
                n = pairs_e.shape[0]
                out = head(pairs_e[None], pairs_h[None], (cos[:, :n], sin[:, :n]))[0, -1]
                return out, int(lm_head(out.to(lm_head.weight.dtype)).argmax())

            start = len(prompt)             # the answer's first token, made by the prefill
            tokens = rounds = 0
            while start < len(ids) - 1:
                # the draft's context: every token the base has accepted, with the base's hidden state before it
                e, h = vectors[1:start + 1], hidden[:start]
                own, guess = draft(e, h)
                proposals = [guess]
                for _ in range(1, steps):
                    e = torch.cat([e, embed(torch.tensor([proposals[-1]], device=device)).float()])
                    h = torch.cat([h, own[None]])
                    own, guess = draft(e, h)
                    proposals.append(guess)
                first_asked += 1
                first_hits += int(proposals[0] == ids[start + 1])
                accepted = 0
                for j, d in enumerate(proposals, start=1):
                    if start + j >= len(ids) or d != ids[start + j]:
                        break
                    accepted += 1
                made = min(accepted + 1, len(ids) - 1 - start)      # the base's own token ends the step
                tokens += made
                rounds += 1
                start += made
            rates.append(tokens / rounds)
    if not rates:
        return None
    return round(first_hits / first_asked, 4), round(sum(rates) / len(rates), 3)


def checkpoint_mtp(model_dir: Path) -> dict:
    """The checkpoint's mtp.* tensors as it stores them (every shard's header read; only those tensors loaded)."""
    from safetensors import safe_open
    out: dict = {}
    for shard in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            out |= {k: f.get_tensor(k) for k in f.keys() if k.startswith(PREFIX)}
    return out


def carry_into(unified: Path, tensors: dict) -> int:
    """Write the MTP tensors (fp16, as the unified checkpoint's others) beside the unified checkpoint and exclude
    them from its quantization (hf_quant_config.json and config.json's quantization_config), so that Edge-LLM's
    exporter reads an unquantized draft. Returns how many tensors were written."""
    import torch
    from safetensors.torch import save_file
    if not tensors:
        raise PipelineError(f"{unified}: the checkpoint has no {PREFIX}* tensors to export an MTP draft from",
                            "use the model's own checkpoint (its hub repository ships them), or remove [draft]")
    save_file({k: v.to(torch.float16).contiguous() for k, v in tensors.items()}, str(unified / MTP_FILE),
              metadata={"format": "pt"})
    index = unified / "model.safetensors.index.json"
    if index.is_file():
        data = json.loads(index.read_text())
    elif (unified / "model.safetensors").is_file():
        # Edge-LLM's loader (checkpoint/loader.py _build_shard_map) reads a lone model.safetensors and nothing
        # beside it: an index naming both files makes it read the MTP file too
        from safetensors import safe_open
        with safe_open(str(unified / "model.safetensors"), "pt") as f:
            data = {"metadata": {}, "weight_map": dict.fromkeys(f.keys(), "model.safetensors")}
    else:
        raise PipelineError(f"{unified}: no model.safetensors beside which to put the MTP layer",
                            "this is a bug in the export stage; please report it")
    data.setdefault("weight_map", {}).update(dict.fromkeys(tensors, MTP_FILE))
    index.write_text(json.dumps(data, indent=2))
    for name, key in (("hf_quant_config.json", "quantization"), ("config.json", "quantization_config")):
        path = unified / name
        if not path.is_file():
            continue
        data = json.loads(path.read_text())
        quant = data.get(key)
        if isinstance(quant, dict):
            excluded = list(quant.get("exclude_modules") or [])
            if EXCLUDE not in excluded:
                quant["exclude_modules"] = [*excluded, EXCLUDE]
            path.write_text(json.dumps(data, indent=2))
    return len(tensors)


# what Edge-LLM 0.11's MTP draft graph takes and gives beside a plain decoder's (seen in its export of the tiny twin)
DRAFT_INPUTS = ("inputs_embeds", "hidden_states_input", "hidden_states_from_draft", "past_key_values_0")
DRAFT_OUTPUTS = ("logits", "hidden_states", "present_key_values_0")


def base_extra_outputs(onnx_dir: Path) -> tuple[str, ...]:
    """The MTP base's outputs beyond a plain decoder's: its normed hidden states (the draft reads them) and, for each
    recurrent state it carries, that state after every token (the runtime restores the last accepted one)."""
    import onnx
    graph = onnx.load(str(onnx_dir / "model.onnx"), load_external_data=False).graph
    states = [i.name for i in graph.input if i.name.startswith(("conv_state_", "recurrent_state_"))]
    return ("hidden_states", *(f"intermediate_{s}" for s in states))


def export_draft(hf: Path, onnx_dir: Path) -> dict:
    """The checkpoint's MTP layer as Edge-LLM's draft ONNX (AutoModel(mtp_draft=True), as its export command's
    _export_mtp_draft does): model.onnx(.data) and config.json (spec_decode_type mtp, engine_role draft)."""
    from tensorrt_edgellm import AutoModel, export_onnx

    from pipeline.workstation.onnx_graph import check_graph
    onnx_dir.mkdir(parents=True)
    export_onnx(AutoModel.from_pretrained(str(hf), device="cpu", mtp_draft=True), str(onnx_dir / "model.onnx"),
                model_dir=str(hf))
    cfg = json.loads((onnx_dir / "config.json").read_text())
    if cfg.get("spec_decode_type") != "mtp" or cfg.get("engine_role") != "draft":
        raise PipelineError(f"{onnx_dir / 'config.json'}: Edge-LLM's exporter wrote spec_decode_type "
                            f"{cfg.get('spec_decode_type')!r}, engine_role {cfg.get('engine_role')!r} for the MTP "
                            "draft", "please report it with the recipe")
    return check_graph(onnx_dir / "model.onnx", DRAFT_INPUTS, DRAFT_OUTPUTS, consumer="llm_build --specDraft",
                       path_name="MTP")
