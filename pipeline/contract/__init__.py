"""The contract between the workstation and the device: file names, and the JSON records they exchange.

Every file a kit, a device work directory or an engine bundle holds is named here once, and every JSON record
that crosses from one half to the other (or from one run to the next) is a typed dataclass with a format tag and
version, built typed by its writer and read strictly by its reader (pipeline/contract/base.py: the machinery and the
evolution rule: a reader reads its own version and each older one it has an upgrade for; anything newer is refused,
naming which side to update):

    jetson-plan/2              plan.json         planner -> package, device driver, gate, builders      (plan.py)
    jetson-kit-manifest/1      MANIFEST.json     pack -> verify, unpack, transfer, device driver, gate  (kit.py)
    jetson-bundle-manifest/1   MANIFEST.json     device -> verify, unpack                               (kit.py)
    jetson-stages/1            stages.json       package -> the user                                    (kit.py)
    jetson-accuracy/1          accuracy.json     accuracy stage -> quality gate, compare, the user      (stage.py)
    jetson-stage/1             stage.json        each workstation stage -> its next run, later stages,
                                                 the shared stage cache                                 (stage.py)
    jetson-goldens/4           goldens.json      goldens stage -> device runners, report                (kit.py)
    jetson-board/2             board.json        probe -> gate, device driver, report, bundles          (device.py)
    jetson-validation/1        validation.json   a backend's runner -> report                           (device.py)
    jetson-build/1             build.json        device driver -> its next run                          (device.py)
    jetson-report/2            report.json       report -> the user, builders                           (device.py)

Standard library only: this package runs on the device's Python 3.10 without torch.
"""

from pipeline.contract.base import MAX_RECORD_BYTES, ContractError, Part, Record
from pipeline.contract.device import (
    Board,
    BuildRecord,
    Check,
    DeviceFacts,
    Gap,
    KvAllocation,
    LoadResult,
    Measured,
    PhaseMemory,
    Predicted,
    PromptOutcome,
    PromptResult,
    Report,
    SetModel,
    SetReport,
    SpeechRate,
    SpokenResult,
    Validation,
)
from pipeline.contract.kit import (
    IMAGE_FILE_RE,
    MANIFESTS,
    RECORDING_FILE_RE,
    AudioExport,
    BundleManifest,
    BundleMeta,
    Compat,
    Entry,
    ExportRecord,
    ExternalWeights,
    GoldenPrompt,
    Goldens,
    KitManifest,
    KitMeta,
    KitRef,
    Manifest,
    NearTie,
    OnnxGraph,
    PayloadFile,
    ReaderCheck,
    RoundTrip,
    SpeculativeExport,
    SpeechCheck,
    SpeechItem,
    SpokenGolden,
    SpokenTie,
    StageRef,
    Stages,
    SynthesisCheck,
    SynthesisExport,
    TransducerExport,
    VisualExport,
    manifest_from_dict,
)
from pipeline.contract.plan import (
    MAX_BATCH_SIZE,
    MAX_CONTEXT,
    MAX_NUM_TOKENS_CAP,
    SPEECH_TO_TEXT,
    TEXT_TO_SPEECH,
    AudioPlan,
    AudioProfile,
    BuildLimits,
    BuildOnBoard,
    DraftMemory,
    MemoryPlan,
    ModelInfo,
    Plan,
    Prediction,
    QuantSettings,
    Speculative,
    SpeechModelPlan,
    Stack,
    VisualLimits,
    VisualPlan,
)
from pipeline.contract.stage import (
    AccuracyFigures,
    AccuracyReport,
    ExpertCalibration,
    ExportResult,
    FetchResult,
    GoldensSummary,
    KitSummary,
    PlanResult,
    QuantizeSummary,
    StageFile,
    StageManifest,
)

__all__ = [
    "AudioExport",
    "AudioPlan",
    "SpeechModelPlan",
    "SPEECH_TO_TEXT",
    "TEXT_TO_SPEECH",
    "AudioProfile",
    "AccuracyFigures",
    "ExpertCalibration",
    "ExportResult",
    "FetchResult",
    "AccuracyReport",
    "Board",
    "BuildLimits",
    "BuildOnBoard",
    "BuildRecord",
    "BundleManifest",
    "BundleMeta",
    "Check",
    "Compat",
    "ContractError",
    "DeviceFacts",
    "DraftMemory",
    "Entry",
    "ExportRecord",
    "RoundTrip",
    "SpokenGolden",
    "SpokenTie",
    "SpokenResult",
    "SynthesisCheck",
    "SynthesisExport",
    "TransducerExport",
    "ExternalWeights",
    "Gap",
    "GoldenPrompt",
    "NearTie",
    "Goldens",
    "GoldensSummary",
    "KitManifest",
    "KitMeta",
    "KitRef",
    "KitSummary",
    "PlanResult",
    "QuantizeSummary",
    "KvAllocation",
    "LoadResult",
    "IMAGE_FILE_RE",
    "RECORDING_FILE_RE",
    "SpeechCheck",
    "SpeechItem",
    "SpeechRate",
    "MANIFESTS",
    "MAX_BATCH_SIZE",
    "MAX_CONTEXT",
    "MAX_NUM_TOKENS_CAP",
    "MAX_RECORD_BYTES",
    "Manifest",
    "Measured",
    "MemoryPlan",
    "ModelInfo",
    "OnnxGraph",
    "Part",
    "PayloadFile",
    "PhaseMemory",
    "Plan",
    "Predicted",
    "Prediction",
    "PromptOutcome",
    "PromptResult",
    "QuantSettings",
    "ReaderCheck",
    "Record",
    "Report",
    "SetModel",
    "SetReport",
    "Speculative",
    "SpeculativeExport",
    "Stack",
    "StageFile",
    "StageManifest",
    "StageRef",
    "Stages",
    "Validation",
    "VisualExport",
    "VisualLimits",
    "VisualPlan",
    "manifest_from_dict",
]

# ---------------------------------------------------------------------------------------------------- file names
# A kit (or an engine bundle) directory, as it travels:
MANIFEST = "MANIFEST.json"
SUMS = "SHA256SUMS"
SIG = "SHA256SUMS.minisig"
# A workstation stage directory's record of its outputs (pipeline/graph/framework.py):
STAGE_MANIFEST = "stage.json"
# Inside a kit's payload:
PLAN = "plan.json"
GOLDENS = "goldens.json"
RECIPE = "recipe.toml"
STAGES = "stages.json"
ACCURACY_JSON = "accuracy.json"
ACCURACY_MD = "accuracy.md"
TOKENIZER_DIR = "tokenizer"
SERVING_DIR = "serving"     # in a bundle, beside the engine files: what `serve` needs that the engine directory lacks
# The device's work directory (`--work`) and results (`--out`):
KIT_DIR = "kit"
ENGINE_DIR = "engine"
ENGINE_STAGING = "engine.partial"
BOARD = "board.json"
BUILD_RECORD = "build.json"
BUILD_LOG = "build.log"
VALIDATION = "validation.json"
REPORT_JSON = "report.json"
REPORT_MD = "report.md"
REPORT_SVG = "report.svg"
