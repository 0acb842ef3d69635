"""Model families as data: one `Family` record per Hugging Face architecture (pipeline/families/records.py).

A record says what every consumer needs to know about an architecture, so that none of them carries its own
per-family `if` chain:

  the planner      which backend versions build it, with which formats, and what each version cannot run as the
                   checkpoint defines it (a sliding window, soft-capping, a RoPE scaling it lacks): refused before
                   any download, naming what would be lost and where the family does run;
  the shapes       attention bias and embedding tying defaults, fused projections (pipeline/plan/shapes.py);
  the exporters    the TensorRT-LLM 0.12 model class and ModelOpt decoder type; the checkpoint's parameter map;
  the reader       norm kind, activation, embedding scale, the parameter map (pipeline/workstation/reader.py);
  the tiny models  the transformers classes (pipeline/workstation/tinymodel.py).

What a *particular* checkpoint uses of its family's features (its window, its RoPE scaling, its caps) is read from
its config.json into `ModelFeatures`; `Support.losses` compares that with what a backend version runs. Standard
library only: the device imports the planner on Python 3.10 without torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Support:
    """One backend version's support of a family. `refused` set: it does not build the family, and why."""
    backend: str                            # a pipeline.backends name
    refused: str | None = None
    formats: tuple[str, ...] | None = None  # weight formats it builds for the family; None: all its stack builds
    kv_cache: tuple[str, ...] | None = None
    trtllm_class: str | None = None         # TensorRT-LLM 0.12 MODEL_MAP class the checkpoint's architecture loads
    modelopt_decoder: str | None = None     # ModelOpt's decoder_type for its TensorRT-LLM checkpoint converter
    rope_types: tuple[str, ...] = ("default",)  # HF rope_type values it computes as the checkpoint defines them
    sliding_window: bool = False            # runs a sliding-window attention as the checkpoint defines it
    softcapping: bool = False               # applies attention / final logit soft-capping
    partial_rotary: bool = False            # rotates only part of each head (partial_rotary_factor < 1)
    verified: str = ""                      # how we know (source file, test)

    def losses(self, features: ModelFeatures, max_seq_len: int) -> list[str]:
        """What this backend version would compute differently from the checkpoint, at max_seq_len: each item
        says what is lost and what to do. Empty: it runs the model as defined."""
        out = []
        if features.rope_type not in self.rope_types:
            out.append(f"RoPE scaling {features.rope_type!r} is not one it computes ({', '.join(self.rope_types)}): "
                       "positions would be encoded differently from training")
        if features.partial_rotary < 1 and not self.partial_rotary:
            out.append(f"partial rotary embedding (factor {features.partial_rotary}) is not supported")
        if features.softcaps and not self.softcapping:
            out.append(f"it ignores soft-capping ({', '.join(features.softcaps)}): logits would be uncapped")
        w = features.sliding_window
        if w and w < max_seq_len and not self.sliding_window:
            out.append(f"it has no sliding-window attention: past {w} tokens the engine would attend to tokens the "
                       f"model never saw together; set build.max_seq_len <= {w} to stay inside the window")
        return out


@dataclass(frozen=True)
class Family:
    architecture: str                       # the HF class name in config.json's "architectures"
    name: str
    examples: tuple[str, ...]               # models users deploy, for the README table
    transformers_config: str                # the transformers config class (tiny models are made from it)
    support: tuple[Support, ...]
    norm: str = "rms"                       # "rms": x * w; "rms_plus_one": x * (1 + w) (Gemma)
    sandwich_norms: bool = False            # norms after attention and MLP too (Gemma 2/3)
    activation: str = "silu"                # gated MLP activation: "silu" | "gelu_tanh"
    attention_bias: bool = False            # q/k/v bias when config.json does not say
    qk_norm: bool = False                   # per-head RMSNorm of q and k (Qwen3, Gemma 3)
    embedding_scale: str | None = None      # "sqrt_hidden": embeddings times sqrt(hidden_size) (Gemma)
    fused_projections: tuple[tuple[str, tuple[str, ...]], ...] = ()  # HF fused tensor -> the parts it holds
    notes: str = ""

    def support_for(self, backend: str) -> Support | None:
        return next((s for s in self.support if s.backend == backend), None)

    def builds_on(self, backend: str) -> bool:
        s = self.support_for(backend)
        return s is not None and s.refused is None

    @property
    def separate_projections(self) -> bool:
        return not self.fused_projections


@dataclass(frozen=True)
class ModelFeatures:
    """What one checkpoint's config.json uses of its family's features."""
    rope_type: str = "default"
    partial_rotary: float = 1.0
    sliding_window: int | None = None
    softcaps: tuple[str, ...] = ()
    tied_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False


def _rope(config: dict) -> tuple[str, float]:
    """(rope_type, partial_rotary_factor) from legacy rope_scaling or transformers 5's rope_parameters."""
    params: dict = config["rope_parameters"] if isinstance(config.get("rope_parameters"), dict) else {}
    scaling: dict = config["rope_scaling"] if isinstance(config.get("rope_scaling"), dict) else {}
    kind = scaling.get("rope_type") or scaling.get("type") or params.get("rope_type") or "default"
    kind = {"su": "longrope"}.get(str(kind), str(kind))        # Phi-3's first configs called longrope "su"
    factor = config.get("partial_rotary_factor", params.get("partial_rotary_factor", 1.0))
    return kind, float(factor) if isinstance(factor, (int, float)) and not isinstance(factor, bool) else 1.0


def features_of(config: dict, family: Family) -> ModelFeatures:
    kind, partial = _rope(config)
    window = config.get("sliding_window")
    if config.get("use_sliding_window") is False:       # Qwen2 configs carry a window they do not use
        window = None
    window = window if isinstance(window, int) and not isinstance(window, bool) and window > 0 else None
    caps = tuple(k for k in ("attn_logit_softcapping", "final_logit_softcapping")
                 if isinstance(config.get(k), (int, float)) and config.get(k))
    bias = config.get("attention_bias", family.attention_bias)
    return ModelFeatures(rope_type=kind, partial_rotary=partial, sliding_window=window, softcaps=caps,
                         tied_embeddings=bool(config.get("tie_word_embeddings", False)),
                         attention_bias=bool(bias), mlp_bias=bool(config.get("mlp_bias", False)))


def registry() -> dict[str, Family]:
    from pipeline.families.records import FAMILIES
    return {f.architecture: f for f in FAMILIES}


def family(architecture: str) -> Family | None:
    return registry().get(architecture)


def known() -> list[str]:
    return sorted(registry())


def refusal(fam: Family, backend: str, label: str) -> str | None:
    """Why `backend` (its label, with version) does not build `fam`, and where the family does run (one sentence,
    no closing period: callers join several); None if it does."""
    s = fam.support_for(backend)
    if s is not None and s.refused is None:
        return None
    why = s.refused if s is not None else "not supported"
    from pipeline import backends
    elsewhere = [backends.get(o.backend).label for o in fam.support if o.refused is None and o.backend != backend]
    alt = (f"{fam.name} builds with {' or '.join(elsewhere)}" if elsewhere else
           f"no engine backend here builds {fam.name} yet; llama.cpp and Ollama run it on Jetson (GGUF)")
    return f"{label} does not build {fam.name} ({fam.architecture}): {why}; {alt}"
