"""doit's `name=value` command-line variables: which ones the graph knows, and reading them."""

from __future__ import annotations

KNOWN_VARS = {"recipe": "comma-separated recipe names (default: every recipe in recipes/)",
              "board": "a board's set (boards/NAME.toml or a path): its recipes, once the set's plan fits the board",
              "accept-quality": "1: sign kits that miss their recipe's quality gate (it is said in the output)",
              "cache": "a shared stage cache, oci://HOST[:PORT]/REPO or oci-layout:DIR (default: "
                       "$JETSON_PIPELINE_CACHE): stages are pulled from it instead of computed, and pushed to it",
              "cache-plain-http": "1: talk HTTP to the cache's registry (a local one without TLS)"}


def cmdline_vars() -> dict:
    # doit keeps `name=value` arguments in a module global; get_var() reads one name, we need them all.
    from doit import doit_cmd
    return dict(doit_cmd._CMDLINE_VARS or {})


def accept_quality() -> bool:
    return cmdline_vars().get("accept-quality", "").strip().lower() in ("1", "true", "yes")


_STAGE_CACHE: dict = {}


def stage_cache():
    """The shared stage cache of this run (pipeline/oci/stagecache.py): cache=REF, else $JETSON_PIPELINE_CACHE;
    None without either. A malformed reference is an error here, before any stage runs."""
    from pipeline import settings
    ref = cmdline_vars().get("cache") or settings.get("JETSON_PIPELINE_CACHE")
    if not ref:
        return None
    flag = cmdline_vars().get("cache-plain-http") or settings.get("JETSON_PIPELINE_CACHE_PLAIN_HTTP") or ""
    plain_http = flag.strip().lower() in ("1", "true", "yes")
    if (ref, plain_http) not in _STAGE_CACHE:
        from pipeline.graph.stages import CACHED
        from pipeline.oci.stagecache import StageCache
        _STAGE_CACHE[(ref, plain_http)] = StageCache(ref, plain_http, CACHED)
    return _STAGE_CACHE[(ref, plain_http)]
