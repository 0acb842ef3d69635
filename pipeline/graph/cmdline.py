"""doit's `name=value` command-line variables: which ones the graph knows, and reading them."""

from __future__ import annotations

KNOWN_VARS = {"recipe": "comma-separated recipe names (default: every recipe in recipes/)",
              "accept-quality": "1: sign kits that miss their recipe's quality gate (it is said in the output)"}


def cmdline_vars() -> dict:
    # doit keeps `name=value` arguments in a module global; get_var() reads one name, we need them all.
    from doit import doit_cmd
    return dict(doit_cmd._CMDLINE_VARS or {})


def accept_quality() -> bool:
    return cmdline_vars().get("accept-quality", "").strip().lower() in ("1", "true", "yes")
