"""What a model kind is to the planner: a `Part` of a decoder's shape (pipeline/plan/shapes.py ModelShape = core
dimensions + a tuple of parts), with one small protocol every consumer iterates instead of asking which kinds a model
has.

A part is built from the config and its family's record (`from_config`), and answers, each where its kind has
something to say (the defaults: nothing):

  the layers      it edits each decoder layer's linears (Layer: its quantizable linears under their module names,
                  the K/V it caches per token, whether it attends) and adds linears of its own outside the layers:
                  what weight bytes per format, the bytes a decoded token reads, the prefill FLOPs and the tensors
                  fetch expects are all counted from;
  its memory      small tensors, per-sequence state, per-layer tables outside the engine, a prefill workspace;
  its speed       a term of decode step time and of prefill time beyond what the dense fits price (its own fit of
                  published rows), the notes where that fit borrows, and its error band where it has one;
  its refusals    against a backend version's `Support` for the family (what that version does not build of it), and
                  the tensors fetch checks;
  its plan lines  what the plan table prints of it.

Standard library only, and nothing of the planner above: parts sit under the shape (`Core` is what they read of it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pipeline.errors import Problem

if TYPE_CHECKING:
    from pipeline.contract import AudioPlan, BuildLimits, Plan, VisualLimits, VisualPlan
    from pipeline.families.kinds import Family, Support
    from pipeline.formats import WeightFormat
    from pipeline.plan.targets import TargetProfile

# a layer's linear: (module prefix in the checkpoint's layer, name, in_features, out_features)
Row = tuple[str, str, int, int]
ATTENTION_MODULE, MLP_MODULE = "self_attn.", "mlp."
MLP_NAMES = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Layer:
    """One decoder layer as the parts leave it."""
    rows: tuple[Row, ...]       # its quantizable linears
    kv_width: int               # K (and V) channels it caches per token (0: none of its own)
    attends: bool = True        # attends over the context (a recurrent layer keeps a state instead)


class Core(Protocol):
    """What a part reads of the shape it belongs to (plan/shapes.py ModelShape)."""
    @property
    def architecture(self) -> str: ...

    @property
    def hidden_size(self) -> int: ...

    @property
    def num_layers(self) -> int: ...

    @property
    def num_heads(self) -> int: ...

    @property
    def head_dim(self) -> int: ...

    @property
    def q_size(self) -> int: ...

    @property
    def kv_size(self) -> int: ...

    def linears(self, tokens: int | None = None) -> list[tuple[str, int, int, float]]: ...


@dataclass(frozen=True)
class ConfigReader:
    """What a part is built from: the (language model's) config, its family's record, the core dimensions read so
    far, and how to report an odd field (`need`: an integer field from `low` to `most`, reported and replaced by
    `fallback` where it is not one)."""
    config: dict
    family: Family
    dims: dict                  # hidden_size, num_layers, num_heads, num_kv_heads, head_dim, intermediate_size, ...
    source: str
    prefix: str                 # where the config sits in config.json ("text_config." for a VLM)
    problems: list[Problem]
    whole: dict                 # the whole config.json (a tower's vision_config sits beside text_config)
    built: tuple[Part, ...] = ()    # the parts read before this one

    def need(self, key: str, most: int, low: int = 1, default: Any = None, fallback: int = 1) -> int:
        return int_field(self.config, key, most, self.problems, self.source, self.prefix, low=low, default=default,
                         fallback=fallback)

    def problem(self, field: str, value: Any, what: str, hint: str = "use the model's own config.json") -> None:
        self.problems.append(Problem(self.source, self.prefix + field, value, what, hint))


def int_field(config: dict, key: str, most: int, problems: list[Problem], source: str, prefix: str, low: int = 1,
              default=None, fallback: int = 1) -> int:
    """config[key] (default where absent) as an integer from `low` to `most`. Anything else is a problem naming the
    field (a huge number shown shortened), and `fallback` stands in so that the other fields are still checked."""
    value = config.get(key, default)
    if isinstance(value, int) and not isinstance(value, bool) and low <= value <= most:
        return value
    shown = value if not isinstance(value, int) or value < 10**12 else f"{str(value)[:12]}... " \
        f"({len(str(value))} digits)"
    what = f"a positive integer up to {most}" if low == 1 else f"an integer from {low} to {most}"
    problems.append(Problem(source, prefix + key, shown, f"must be {what}",
                            "use the model's own config.json, as transformers saved it"))
    return fallback


class Part:
    """One kind a decoder carries (see the module's docstring); subclasses answer what their kind changes."""
    # what the plan calls a model with it ("a mixture-of-experts model"), and the part itself in a sentence
    adjective: ClassVar[str] = ""
    called: ClassVar[str] = ""
    # the pre-quantized checkpoints of a model with this part the pipeline takes, as (kind, algo) pairs of
    # workstation/prequantized.Prequantized (None: whatever a dense model's may hold; empty: none, the pipeline
    # quantizes such models itself)
    prequantized_taken: ClassVar[tuple[tuple[str, str], ...] | None] = None
    # has a speed fit of its own: the first such part of a shape gives the plan's error bands
    own_speed_fit: ClassVar[bool] = False
    # the modules outside plan/parts that implement this kind on their side (the workstation's export, the server's
    # image inputs): they may ask for the part; every other module iterates the parts
    modules: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_config(cls, r: ConfigReader) -> Part | None:
        """This kind's part of the config (None: the model has none), odd fields reported to r.problems."""
        return None

    def routed_layers(self) -> tuple[int, ...]:
        """The layers whose MLP this part makes an MoE block (a hybrid's block list decides them); () elsewhere."""
        return ()

    def indexed_modules(self) -> dict[str, int]:
        """Module lists a checkpoint keeps by index under this part, {name: count} (an MoE's `experts.<j>.`): fetch
        names a tensor whose index is past the count."""
        return {}

    # -- the layers
    def edit_layers(self, core: Core, layers: list[Layer]) -> list[Layer]:
        return layers

    def model_rows(self, core: Core, tokens: int | None) -> list[tuple[str, int, int, float]]:
        """Linears outside the layers' own (name, in, out, copies); tokens: an MoE's experts that many tokens reach
        (None: all of them)."""
        return []

    def kept_fp16(self, core: Core, fmt: WeightFormat, kept: tuple[str, ...]) -> tuple[str, ...]:
        return kept

    # -- memory
    def small_params(self, core: Core, counted: int) -> int:
        """The model's small tensors (norms, biases, routers) with this part's: `counted` so far."""
        return counted

    def state_bytes(self, sequences: int) -> int:
        """A fixed-size state per resident sequence (a recurrent layer's), whatever the context."""
        return 0

    def table_params(self, core: Core) -> int:
        """Tables the runtime holds outside the engine, never read whole per token (per-layer input embeddings)."""
        return 0

    def workspace_bytes(self, max_batch_size: int, sm: float) -> int:
        return 0

    # -- speed
    def prefill_flops_per_token(self) -> float:
        """FLOPs per prompt token beyond the linears and attention (a recurrence's state update)."""
        return 0.0

    def decode_s(self, core: Core, weights: str, target: str, batch: int, fit: dict) -> float:
        """Seconds one decode step of `batch` sequences takes beyond what the dense decode fit prices of the bytes
        it reads (fit: perf_fit.json)."""
        return 0.0

    def prefill_ms(self, core: Core, target: str, tokens: int, fit: dict) -> float:
        """Milliseconds a prompt of `tokens` takes beyond what the dense prefill fit prices."""
        return 0.0

    def speed_notes(self, target: str, weights: str, fit: dict) -> list[str]:
        """Where this part's speed terms borrow or lack a fit, said in the plan's warnings."""
        return []

    def decode_band(self, fit: dict) -> float | None:
        return None

    def ttft_band(self, fit: dict) -> float | None:
        return None

    # -- refusals and checks
    def refusals(self, support: Support, weights: str, backend_name: str, family: Family) -> list[str]:
        """What a backend version (its Support for the family) does not build of this part."""
        return []

    def unbuilt(self, support: Support) -> str | None:
        """Why this version plans the part but does not export it yet (None: it does)."""
        return None

    def expected_tensors(self, core: Core, base: str) -> dict[str, tuple[int, ...]]:
        """Tensors beside the layers' linears that a checkpoint of this shape holds (fetch checks their shapes)."""
        return {}

    def externalizable(self) -> tuple[str, ...]:
        """Edge-LLM's external-weight kinds this part's linears go out with (int4_moe for experts)."""
        return ()

    def externalizable_rows(self) -> tuple[str, ...]:
        """Name prefixes of its linears (model_rows) that those kinds keep outside the engine."""
        return ()

    def plugin_rows(self) -> tuple[str, ...]:
        """Name prefixes of its linears (model_rows) that a plugin of its kind computes, not a GEMM each (the MoE
        plugins' routed experts): the export's GEMM count leaves them out."""
        return ()

    def keeps_dense_ffn(self, core: Core) -> bool:
        """Whether any layer keeps a dense MLP beside this part (False: every MLP is this part's)."""
        return True

    # -- an engine beside the language model's (a visual tower's: plan/parts/tower.py)
    def visual_plan(self, target: TargetProfile, build: BuildLimits, limits: VisualLimits | None, precision: str,
                    refused: list[str], fit: dict | None) -> VisualPlan | None:
        return None

    def default_visual_limits(self, max_input_len: int) -> VisualLimits | None:
        """The image profile the plan gives this part where the recipe sets none (None: it takes no images)."""
        return None

    # -- an audio encoder's engine beside the language model's (plan/parts/audio.py)
    def audio_plan(self, target: TargetProfile, build: BuildLimits, max_seconds: int | None, refused: list[str],
                   fit: dict | None) -> AudioPlan | None:
        return None

    def audio_speed(self, audio: AudioPlan, target: str, decode_tok_s: float | None,
                    prefill_ms: Callable[[int], float | None], fit: dict, model: str) -> AudioPlan | None:
        """`audio` (this part's plan) with the model's transcription speed, once the decoder's is predicted (its
        decode rate, and its prefill time for a prompt of n tokens)."""
        return None

    # -- the plan table
    @classmethod
    def plan_lines(cls, plan: Plan) -> list[str]:
        """What the plan table prints of this kind (from the plan's record of it; none where it has none)."""
        return []


def merge_layers(layers: list[Layer]) -> list[tuple[str, int, int, float]]:
    """(name, in, out, copies) of every layer's linears, equal rows merged in the order they first appear."""
    rows: dict[tuple[str, int, int], float] = {}
    for layer in layers:
        for _, name, i, o in layer.rows:
            rows[(name, i, o)] = rows.get((name, i, o), 0.0) + 1.0
    return [(n, i, o, c) for (n, i, o), c in rows.items()]
