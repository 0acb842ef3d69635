"""The shape of a decoder-only transformer, read from a Hugging Face config.json: what the planner needs to count."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import InputError, Problem

# Architectures whose config.json this module understands (dense decoder, GQA attention, gated MLP).
DENSE_DECODERS = {
    "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Phi3ForCausalLM",
    "Gemma2ForCausalLM", "GemmaForCausalLM",
}


@dataclass(frozen=True)
class ModelShape:
    architecture: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def layer_linears(self) -> list[tuple[str, int, int]]:
        """(name, in_features, out_features) of the quantizable linears of one decoder layer."""
        h, i = self.hidden_size, self.intermediate_size
        return [("q_proj", h, self.q_size), ("k_proj", h, self.kv_size), ("v_proj", h, self.kv_size),
                ("o_proj", self.q_size, h), ("gate_proj", h, i), ("up_proj", h, i), ("down_proj", i, h)]

    def quantized_input_dims(self) -> list[int]:
        return sorted({inp for _, inp, _ in self.layer_linears()})

    @property
    def linear_params(self) -> int:
        return self.num_layers * sum(i * o for _, i, o in self.layer_linears())

    @property
    def small_params_per_layer(self) -> int:
        """Norm weights and biases: kept in fp16 whatever the format."""
        bias = (self.q_size + 2 * self.kv_size) if self.attention_bias else 0
        return 2 * self.hidden_size + bias

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        lm_head = 0 if self.tie_word_embeddings else self.embedding_params
        return (self.linear_params + self.num_layers * self.small_params_per_layer + self.hidden_size
                + self.embedding_params + lm_head)

    def kv_bytes_per_token(self, bytes_per_element: int) -> int:
        """K and V for one token across all layers."""
        return 2 * self.num_layers * self.kv_size * bytes_per_element


def shape_from_config(config: dict, source: str = "config.json") -> ModelShape:
    """Validate and read the fields the planner needs; every missing or odd field is reported at once."""
    problems: list[Problem] = []
    archs = config.get("architectures") or []
    arch = archs[0] if archs else config.get("model_type", "?")
    if arch not in DENSE_DECODERS:
        problems.append(Problem(source, "architectures", archs, "not a dense decoder architecture this pipeline knows",
                                f"supported: {', '.join(sorted(DENSE_DECODERS))}"))
    if config.get("num_local_experts") or config.get("num_experts"):
        problems.append(Problem(source, "num_experts", config.get("num_local_experts") or config.get("num_experts"),
                                "mixture-of-experts models are not supported yet", "use a dense model"))

    def need_int(key: str, default=None) -> int:
        value = config.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            problems.append(Problem(source, key, value, "must be a positive integer"))
            return 1
        return value

    hidden = need_int("hidden_size")
    heads = need_int("num_attention_heads")
    shape = dict(
        hidden_size=hidden, num_layers=need_int("num_hidden_layers"), num_heads=heads,
        num_kv_heads=need_int("num_key_value_heads", heads),
        head_dim=need_int("head_dim", config.get("head_dim") or hidden // max(heads, 1)),
        intermediate_size=need_int("intermediate_size"), vocab_size=need_int("vocab_size"),
        max_position_embeddings=need_int("max_position_embeddings", 2048),
    )
    if problems:
        raise InputError(problems)
    return ModelShape(architecture=arch, tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                      attention_bias=bool(config.get("attention_bias", arch == "Qwen2ForCausalLM")), **shape)


def load_shape(path: str | Path) -> ModelShape:
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError([Problem(str(path), "(file)", None, "no such file", "pass a model's config.json")]) from None
    except json.JSONDecodeError as exc:
        raise InputError([Problem(str(path), "(file)", None, f"not valid JSON: {exc}")]) from None
    return shape_from_config(config, str(path))
