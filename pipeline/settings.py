"""Every environment variable the pipeline reads, in one place; `python -m pipeline --help` lists them.

The pipeline sets a few for the programs it starts (JETSON_PIPELINE_RUN on the device's children, so the next run
can find what a killed one left; TLLM_LOG_LEVEL for TensorRT-LLM's runtime; TOKENIZERS_PARALLELISM for the tiny
tokenizer's training), and passes PYTHONPATH on to the TensorRT-LLM runner, but reads only these. Standard library
only (the device imports it too).
"""

from __future__ import annotations

import os
from pathlib import Path

ENV: dict[str, str] = {
    "PIPELINE_ROOT": "the project directory (default: the current directory)",
    "PIPELINE_RECIPES": "the recipes directory (default: PIPELINE_ROOT/recipes)",
    "PIPELINE_BOARDS": "the board files directory (default: PIPELINE_ROOT/boards)",
    "PIPELINE_ARTIFACTS": "where stage outputs, kits and logs go (default: PIPELINE_ROOT/artifacts)",
    "JETSON_PIPELINE_HOME": "keys: the signing key, trusted keys, the device secret (default: "
                            "~/.config/jetson-pipeline)",
    "JETSON_PIPELINE_SIGNING_KEY": "the signing key file (default: JETSON_PIPELINE_HOME/signing.key)",
    "JETSON_PIPELINE_PROBE_ROOT": "`probe`/`device`/`install`/`serve --root` default: read a recorded board's files "
                                  "instead of /",
    "JETSON_PIPELINE_SSH_OPTS": "extra ssh/scp options for ssh:// builders (e.g. \"-i ~/.ssh/jetson\")",
    "JETSON_PIPELINE_REMOTE_PYTHON": "the python with the pipeline's device extra on an ssh:// builder "
                                     "(default: python3)",
    "JETSON_PIPELINE_REMOTE_DIR": "the work directory on an ssh:// builder, under its home (default: "
                                  "jetson-builds)",
    "PIPELINE_GPU_BUDGET_BYTES": "bytes each GPU may hold during calibration, comma-separated (default: what is "
                                 "free; tests use it to force a layout)",
    "JETSON_PIPELINE_API_KEY": "`serve --api-key` and `bench --api-key` default: the key clients send "
                               "(Authorization: Bearer KEY)",
    "JETSON_PIPELINE_REGISTRY_USERNAME": "`push`/`pull` registry user (CI secrets; default: the Docker/ORAS config)",
    "JETSON_PIPELINE_REGISTRY_PASSWORD": "`push`/`pull` registry password or token, with the username",
    "JETSON_PIPELINE_REGISTRY_TIMEOUT": "seconds a whole push, pull or stage-cache step may take (default 14400); "
                                        "a request that stalls for a minute fails sooner",
    "JETSON_PIPELINE_CACHE": "the shared stage cache (doit's cache=REF): oci://HOST[:PORT]/REPO or oci-layout:DIR",
    "JETSON_PIPELINE_CACHE_PLAIN_HTTP": "1: the stage cache's registry speaks HTTP, not HTTPS (doit's "
                                        "cache-plain-http=1)",
    "JETSON_PIPELINE_BUILTIN_CACHE": "where the builtin tiny models are kept once trained (default: "
                                     "$XDG_CACHE_HOME or ~/.cache, /jetson-pipeline/builtins); off: train each anew",
    "XDG_CACHE_HOME": "the user's cache directory (default ~/.cache): the builtin models' cache goes under it",
    "HF_HUB_OFFLINE": "1: read models from the Hugging Face cache only, never the network",
}


def get(name: str, default: str | None = None) -> str | None:
    """The variable's value (an empty one is unset); only the variables listed in ENV may be read."""
    if name not in ENV:
        raise KeyError(f"{name} is not a pipeline setting (pipeline/settings.py ENV)")
    return os.environ.get(name) or default


def help_text() -> str:
    return "environment:\n" + "\n".join(f"  {k:<30}{v}" for k, v in ENV.items())


def project_root() -> Path:
    """The project directory: $PIPELINE_ROOT, else the current directory (where dodo.py runs)."""
    return Path(get("PIPELINE_ROOT") or os.getcwd()).resolve()


def recipes_dir() -> Path:
    return Path(get("PIPELINE_RECIPES") or project_root() / "recipes")


def boards_dir() -> Path:
    return Path(get("PIPELINE_BOARDS") or project_root() / "boards")


def artifacts_dir() -> Path:
    return Path(get("PIPELINE_ARTIFACTS") or project_root() / "artifacts")


def config_dir() -> Path:
    return Path(get("JETSON_PIPELINE_HOME") or Path.home() / ".config" / "jetson-pipeline")


def hub_offline() -> bool:
    return (get("HF_HUB_OFFLINE") or "").strip().lower() in ("1", "true", "yes", "on")
