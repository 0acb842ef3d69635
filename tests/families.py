"""The family conformance registry: one row per shipped tiny recipe (vLLM's tests/models/registry.py: one row per
architecture, iterated by parametrized tests). tests/conformance.py is the suite every row passes: the recipe builds
through doit into a kit per target, each kit validates on its recorded boards through the runtime doubles, `serve`
answers the goldens, and the runtime double computes what the build calibrated. A row is run in the module that builds
its recipe (`module`): that module's fixtures give the suite the build and the device runs it already makes, so the
suite adds no build; what is particular to a kind stays in that module's own tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Double:
    """The runtime double against the calibrated model, on one target's export (tests/edgellm_run.py)."""
    target: str | None          # the export compared (None: the recipe's one target)
    kv: str = "fp16"
    min_cosine: float = 0.9999
    prompt_tokens: int | None = None    # a longer prompt where the kind needs one (past a recurrence's chunk)
    tie_aware: bool = False     # agreement counted as the goldens count it (near ties: FP8)
    greedy: bool = True         # the engine's own greedy answer is the model's too
    device: str = "cpu"         # where the calibrated model runs (NVFP4: ModelOpt's FP4 quantizer is CUDA-only)
    # a top-1 the double picks otherwise is taken where the calibrated model's own margin is inside its own spread
    # between fp16 and fp32 at that position, measured in the same run (NVFP4 quantizes activations per 16 values: a
    # rounding either side of a level moves a logit by more than a fixed tie rule allows)
    within_own_spread: bool = False


@dataclass(frozen=True)
class Tiny:
    recipe: str
    boards: dict[str, str]      # target -> the recorded board (tests/fixtures/devices) its kit is validated on
    backend: str
    module: str                 # the test module (its path in the repository) that builds it and runs the suite on it
    built: str                  # that module's fixture: (project, {target: kit}, the build's output)
    validated: str              # ... and {target: (the device run's directory, its process)}
    double: Double | None = None    # None: the backend's export checks itself (TensorRT-LLM 0.12's read-back)
    images: bool = False        # its goldens ask images: served as image chats
    recordings: bool = False    # its goldens ask recordings: served as chats with input_audio parts
    # text to speech: its goldens are texts the reference spoke (codes and waveforms, not token answers); the double is
    # the TTS runtime's, held to the reference's codes on the device and its Code2Wav graph at export
    speaks: bool = False
    # speech to text through an RNN-T: its goldens are the speech set the reference transcribed (no token answers);
    # the double is the RNN-T runtime's, held to the reference's error rates on the device and its graphs at export
    hears: bool = False
    serves: bool = True         # `serve` answers its goldens (False: its kind is not served yet, said in its row)

    @property
    def id(self) -> str:
        return self.recipe


JP72 = {"agx-thor": "agx-thor-jp72", "orin-nano-8gb": "orin-nano-8gb-jp72"}
VLM = "tests/workstation/test_vlm_build.py"

TINY: tuple[Tiny, ...] = (
    Tiny("tiny-llama-cpu", {"orin-nano-8gb": "orin-nano-8gb-jp62-super"}, "trtllm-0.12", "tests/device/test_device.py",
         "kit_built", "kit_validated"),
    # the agent profile: a 32,768-token input and a 40,960-token sequence on the 8 GB board
    Tiny("tiny-agent", {"orin-nano-8gb": "orin-nano-8gb-jp62-super"}, "trtllm-0.12",
         "tests/serve/test_serve_agent_clis.py", "built_agent", "validated_agent"),
    Tiny("tiny-qwen3-moe", JP72, "edgellm", "tests/workstation/test_moe_build.py", "built", "validated",
         Double("agx-thor")),
    Tiny("tiny-gemma4", JP72, "edgellm", "tests/workstation/test_gemma4_build.py", "built", "validated",
         Double("agx-thor")),
    Tiny("tiny-qwen3_5", JP72, "edgellm", "tests/workstation/test_hybrid_build.py", "built", "validated_qwen3_5",
         Double("agx-thor", prompt_tokens=100, tie_aware=True)),
    # the Mamba-2 scan strays further (its state accumulates in fp16: 0.9986 at worst here), and is held to the stray
    # of transformers' own recurrent decode from its chunked scan on the FP16 test model (0.9962)
    Tiny("tiny-nemotron-h", JP72, "edgellm", "tests/workstation/test_hybrid_build.py", "built_nemotron",
         "validated_nemotron", Double("agx-thor", min_cosine=0.996, prompt_tokens=100, tie_aware=True)),
    # with its MTP draft: the device decodes with it (the bundle's serve refuses it: test_mtp_build.py)
    Tiny("tiny-qwen3_5-mtp", {"agx-thor": "agx-thor-jp70"}, "edgellm", "tests/workstation/test_mtp_build.py", "built",
         "validated", Double(None, prompt_tokens=100, tie_aware=True)),
    Tiny("tiny-qwen3_5-moe", JP72, "edgellm", "tests/workstation/test_hybrid_moe_build.py", "built", "validated",
         Double("agx-thor", prompt_tokens=100, tie_aware=True)),
    # NVFP4 only (Edge-LLM 0.11's MoE blocks for these families): built on a GPU machine, skipped without CUDA.
    # On an H200 (2026-12-02) each double picked one of 8 positions otherwise: Nemotron-H at the first, a margin of
    # 0.66 where the calibrated model's own fp16-vs-fp32 spread there is 0.47 (so its free greedy answer goes another
    # way from the start: greedy=False); Gemma 4 at the sixth, a margin of 0.60 (logit cosine 0.9865 at its lowest)
    Tiny("tiny-nemotron-h-moe", {"agx-thor": "agx-thor-jp72"}, "edgellm", "tests/workstation/test_moe_nvfp4_build.py",
         "built_nemotron", "validated_nemotron",
         Double(None, kv="fp8", min_cosine=0.95, prompt_tokens=100, tie_aware=True, device="cuda",
                within_own_spread=True, greedy=False)),
    Tiny("tiny-gemma4-moe", {"agx-thor": "agx-thor-jp72"}, "edgellm", "tests/workstation/test_moe_nvfp4_build.py",
         "built_gemma4", "validated_gemma4", Double(None, min_cosine=0.98, tie_aware=True, device="cuda",
                                                    within_own_spread=True, greedy=False)),
    Tiny("tiny-qwen3-vl-thor", {"agx-thor": "agx-thor-jp72"}, "edgellm", VLM, "built_qwen3_vl", "validated_qwen3_vl",
         Double(None, kv="fp8", min_cosine=0.99, tie_aware=True, greedy=False), images=True),
    Tiny("tiny-qwen2.5-vl-orin-nano-jp72", {"orin-nano-8gb": "orin-nano-8gb-jp72"}, "edgellm", VLM, "built_qwen2_5_vl",
         "validated_orin_by_target", Double(None, tie_aware=True, greedy=False), images=True),
    Tiny("tiny-internvl3-thor", {"agx-thor": "agx-thor-jp72"}, "edgellm", VLM, "built_internvl",
         "validated_internvl_by_target", Double(None, tie_aware=True, greedy=False), images=True),
    # the encoder random, the decoder INT4-AWQ: near ties where the double's FP16 order differs
    Tiny("tiny-qwen3-asr", {"orin-nano-8gb": "orin-nano-8gb-jp72"}, "edgellm", "tests/workstation/test_asr_build.py",
         "built", "validated", Double(None, tie_aware=True, greedy=False), recordings=True),
    # Gemma 4 hearing: its audio tower beside the language model (FP16), asked with recordings as the board hears them
    Tiny("tiny-gemma4-audio", {"orin-nano-8gb": "orin-nano-8gb-jp72"}, "edgellm",
         "tests/workstation/test_gemma4_audio.py", "built", "validated", Double(None, tie_aware=True, greedy=False),
         recordings=True),
    # text to speech: the doit chain, the device's three builds and its gate, /v1/audio/speech
    Tiny("tiny-qwen3-tts", {"agx-thor": "agx-thor-jp72"}, "edgellm", "tests/workstation/test_tts_build.py", "built",
         "validated", speaks=True),
    # an RNN-T (Nemotron-3.5-ASR): its checkpoint check, export, goldens on the speech set, device builds, runtime
    Tiny("tiny-nemotron-asr", {"orin-nano-8gb": "orin-nano-8gb-jp72"}, "edgellm",
         "tests/workstation/test_transducer_build.py", "built", "validated", hears=True),
    # the 1.7B's layout: a code predictor narrower than its talker, fed through small_to_mtp_projection
    Tiny("tiny-qwen3-tts-1.7b", {"agx-thor": "agx-thor-jp72"}, "edgellm", "tests/workstation/test_tts_1_7b_build.py",
         "built", "validated", speaks=True),
    Tiny("tiny-qwen3_5-vl", {"orin-nano-8gb": "orin-nano-8gb-jp72"}, "edgellm",
         "tests/workstation/test_hybrid_vlm_build.py", "built_by_target", "validated_by_target",
         Double(None, tie_aware=True, greedy=False), images=True),
)


def rows_of(module_file: str) -> tuple[Tiny, ...]:
    """The rows a test module (its __file__) runs the suite on."""
    return tuple(t for t in TINY if Path(module_file).resolve() == REPO / t.module)
