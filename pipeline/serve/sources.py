"""What `serve` serves: a verified engine bundle on the device, or a built recipe's reference model on the workstation.

Both give a `Served` (name, tokenizer, stop ids, limits, goldens) and a loader that opens the Session; the tokenizer
and chat template are checked against the goldens before anything is served (text.check_against_goldens).

A bundle is verified exactly as `device` verifies a kit (signature by a trusted key, every part's sha256), gated
against this board (same SM, TensorRT, JetPack line and backend version as the board that built and validated it),
and unpacked into a fresh directory; nothing else on disk is read. Its `serving/` part carries what the engine
directory lacks: the kit's plan (limits), goldens and tokenizer files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline import contract
from pipeline.errors import PipelineError
from pipeline.families import family
from pipeline.kit.bundle import SERVING_DIR
from pipeline.runtime.session import Limits, Session
from pipeline.serve.protocol import OPENAI_DEFAULTS, SamplingDefaults
from pipeline.serve.text import TextCodec, check_against_goldens, sampling_defaults
from pipeline.serve.toolcalls import FORMATS, ToolCallFormat


@dataclass(frozen=True)
class Served:
    name: str
    created: int
    codec: TextCodec
    stop_ids: tuple[int, ...]
    limits: Limits
    backend: str
    goldens: contract.Goldens
    defaults: SamplingDefaults = OPENAI_DEFAULTS     # for the sampling fields a request omits
    tool_format: ToolCallFormat | None = None        # how its family writes tool calls (where the template has tools)


def limits_of(plan: contract.Plan) -> Limits:
    return Limits(plan.limits.max_batch_size, plan.limits.max_input_len, plan.limits.max_seq_len)


def served_of(name: str, created: int, tokenizer_dir: Path, goldens: contract.Goldens, plan: contract.Plan,
            backend: str, where: str) -> Served:
    codec = TextCodec.load(tokenizer_dir)
    check_against_goldens(codec, goldens, where)
    stops = goldens.stop_ids
    fam = family(plan.model.architecture)
    fmt = FORMATS.get(fam.tool_calls) if fam is not None and fam.tool_calls else None
    return Served(name, created, codec, stops, limits_of(plan), backend, goldens, sampling_defaults(tokenizer_dir),
                  fmt)


def from_bundle(bundle: Path, work: Path, root: str = "/", pubkey: str | None = None,
                say: Callable[[str], None] = print) -> tuple[Served, Callable[[], Session]]:
    """A validated engine bundle (the output of `device`), verified, gated and unpacked into `work`."""
    from pipeline import backends
    from pipeline.device import gate
    from pipeline.device.probe import probe
    from pipeline.files import remove_entry
    from pipeline.kit.signing import trusted_keys
    from pipeline.kit.unpack import unpack
    from pipeline.kit.verify import check_kit
    from pipeline.runtime.engines import SESSIONS

    trusted = trusted_keys([Path(pubkey)] if pubkey else [])
    verified = check_kit(bundle, trusted, hash_parts=False)      # parts hashed while unpacked below
    m = verified.manifest
    if not isinstance(m, contract.BundleManifest):
        raise PipelineError(f"{bundle} is a kit, not an engine bundle: serve the bundle `device` made from it",
                            "run `python -m pipeline device KIT` first; it writes the bundle to --out")
    board = contract.Board.from_dict(probe(root), "probe")
    for w in gate.require(m, board).warnings:
        say(f"warning: {w}")
    dest = (work / verified.name).absolute()
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        remove_entry(dest)
    unpack(bundle, dest, trusted, verified=verified)      # replaces an earlier unpack of this bundle
    say(f"bundle {verified.name} (signed {verified.created} by {verified.signed_by}): verified and unpacked to "
        f"{dest}")
    serving = dest / SERVING_DIR
    if not (serving / contract.PLAN).is_file():
        raise PipelineError(f"{bundle}: the bundle carries no {SERVING_DIR}/ (plan, goldens, tokenizer): it was "
                            "made by an older version of the pipeline", "rebuild it with `python -m pipeline device`")
    plan = contract.Plan.load(serving / contract.PLAN)
    goldens = contract.Goldens.load(serving / contract.GOLDENS)
    backend = backends.get(m.compat.backend)
    session_type = SESSIONS[backend.name]
    why = session_type.refuses(plan)
    if why:
        raise PipelineError(f"{bundle}: {why}", "serve a bundle of the recipe built without [draft]; validation "
                            "still measures the speculative engine through its own runtime")
    served = served_of(m.kit.name, _epoch(verified.created), serving / contract.TOKENIZER_DIR, goldens, plan,
                     backend.name, str(bundle))
    return served, lambda: session_type.open(dest, plan, served.limits)


def _epoch(stamp: str) -> int:
    from datetime import datetime
    try:
        return int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return 0
