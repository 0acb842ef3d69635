"""`python -m pipeline serve BUNDLE|RECIPE ...` (or `--board NAME`): typed settings from the command line, the systemd
unit, and uvicorn. Several models make a set (modelset.py).

Safe by default: binds 127.0.0.1. Any other address needs --api-key (or JETSON_PIPELINE_API_KEY) or an explicit
--no-auth, so an engine is never put on a robot's network open by accident.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline import settings
from pipeline.errors import PipelineError
from pipeline.serve.guard import ConnectionLimits

LOOPBACK = ("127.0.0.1", "::1", "localhost")
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "[::1]"})   # Host header names of a loopback server
FILE_LIMIT = 65536      # the unit's LimitNOFILE: systemd's default soft limit of 1024 is a connection cap of ~900


RecipeSource = Callable[[str, "str | None", "int | None"], tuple[Any, Callable[[], Any]]]
BoardSource = Callable[[str, "str | None"], tuple[Any, str]]


def add_parser(sub, recipe_source: RecipeSource, board_source: BoardSource) -> None:
    """recipe_source(name, target, torch_threads) -> (Served, load): how a RECIPE is served (the graph's, handed in
    by the CLI: the server knows nothing of recipes or stages); board_source(name, root) -> (SetSpec, its target): a
    board file's set (pipeline/boards.py), budgeted by the board's own MemAvailable under `root` where one is given."""
    s = sub.add_parser(
        "serve", help="OpenAI-compatible HTTP server: a verified engine bundle (device) or a built recipe "
        "(workstation)", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Serve the model through OpenAI's API (/v1/models, /v1/chat/completions, /v1/completions, "
        "/v1/responses; a speech model's /v1/audio/transcriptions, a text-to-speech model's /v1/audio/speech), "
        "Anthropic's (/v1/messages: Claude Code), streaming, with /health and Prometheus /metrics.\n\n"
        "  BUNDLE  an engine bundle made by `python -m pipeline device` on this board: verified (signature, hashes),\n"
        "          gated (same SM, TensorRT, JetPack and backend version as the board that built it), unpacked\n"
        "          into --work, then served by its backend (TensorRT-LLM 0.12 executor or Edge-LLM runtime)\n"
        "  RECIPE  a recipe built here with `doit build`: its quantized model in the exact numerics the goldens\n"
        "          were computed with (PyTorch, CPU or GPU), to develop an application before a board exists")
    s.add_argument("what", metavar="BUNDLE|RECIPE", nargs="*",
                   help="bundle directories or recipe names (with --board: the board's bundles; none: its recipes)")
    s.add_argument("--board", metavar="NAME", help="serve a board's set of models (boards/NAME.toml or a path)")
    s.add_argument("--memory-budget", type=float, metavar="GB",
                   help="with --board: the memory (GB, 1e9 bytes) the set may hold by plan, where less than the "
                   "board's usable memory is free for it (other services); default: the board's usable memory")
    s.add_argument("--keep-alive", default="5m", metavar="DURATION",
                   help="how long an on-demand model stays loaded after its last request (seconds or e.g. 5m, 1h; "
                   "0: unload once idle; negative: keep; a request's keep_alive overrides it; default 5m)")
    s.add_argument("--load-wait", type=float, default=60.0, metavar="S",
                   help="seconds a request waits for its on-demand model to load before a 503 with Retry-After "
                   "(default 60)")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    s.add_argument("--api-key", default=settings.get("JETSON_PIPELINE_API_KEY"),
                   help="require `Authorization: Bearer KEY` on /v1/* (default $JETSON_PIPELINE_API_KEY)")
    s.add_argument("--no-auth", action="store_true", help="serve a non-loopback --host without an API key")
    s.add_argument("--max-queue", type=int, default=16,
                   help="requests that may wait beyond the engine's max_batch_size before a 429 (default 16)")
    s.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request (default 600)")
    s.add_argument("--header-timeout", type=float, default=ConnectionLimits.header_timeout,
                   help="seconds a client has to send a whole request header (default %(default)g)")
    s.add_argument("--body-timeout", type=float, default=ConnectionLimits.body_timeout,
                   help="seconds a client has to send a request body after its header (default %(default)g)")
    s.add_argument("--max-connections", type=int, default=ConnectionLimits.max_connections,
                   help="open connections at most; always below the process's file limit (default %(default)d; "
                   "when full, the oldest connection that has not sent a whole header makes room)")
    s.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="also answer requests whose Host header names NAME (repeatable); a loopback server answers "
                   "localhost, 127.0.0.1 and [::1] only, so a web page cannot reach it through DNS rebinding")
    s.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="answer browser requests from ORIGIN with CORS, e.g. http://kiosk.local:3000 (repeatable; "
                   "default: any request with an Origin header is refused)")
    s.add_argument("--allow-image-urls", action="append", default=[], metavar="HOST",
                   help="a vision-language model may fetch image_url parts from http(s)://HOST/... (repeatable; "
                   "default: only data: URLs are taken, since a server that fetches any URL is a way into its "
                   "network); redirects are not followed")
    s.add_argument("--no-truncate", action="store_true",
                   help="refuse a prompt longer than max_input_len (400) instead of dropping its oldest turns "
                   "and cutting the middle of what is still too long")
    s.add_argument("--strict-limits", action="store_true",
                   help="refuse max_tokens past the room left under max_seq_len (400) instead of clamping it")
    s.add_argument("--public-metrics", action="store_true",
                   help="serve /metrics without the API key (for a Prometheus that has none)")
    s.add_argument("--torch-threads", type=int, default=None, metavar="N",
                   help="RECIPE: torch threads of the reference backend, which runs in a process of its own on the "
                   "last N cores (default: every core but one, which the server keeps)")
    s.add_argument("--target", help="RECIPE: which of its targets' limits to serve with (default: its first)")
    s.add_argument("--work", help="BUNDLE: where to unpack it (default: ./<bundle name>.serve)")
    s.add_argument("--pubkey", help="BUNDLE: trust this public key too")
    s.add_argument("--root", default=settings.get("JETSON_PIPELINE_PROBE_ROOT", "/"),
                   help="BUNDLE: probe this directory instead of / (a recorded board)")
    s.add_argument("--systemd", metavar="UNIT_FILE",
                   help="write a systemd unit that runs this same command (restart on failure) and exit")
    s.set_defaults(func=run, recipe_source=recipe_source, board_source=board_source)


def _check(args) -> None:
    if args.host not in LOOPBACK and not args.api_key and not args.no_auth:
        raise PipelineError(f"--host {args.host} puts the server on the network without an API key",
                            "pass --api-key KEY (clients send Authorization: Bearer KEY), or --no-auth on purpose")
    if args.api_key and args.no_auth:
        raise PipelineError("--api-key and --no-auth contradict each other", "pass one of them")
    if not 1 <= args.port <= 65535:
        raise PipelineError(f"--port {args.port}: not a TCP port", "pass 1..65535")
    if args.max_queue < 0 or args.request_timeout <= 0 or args.load_wait <= 0:
        raise PipelineError("--max-queue must be >= 0, --request-timeout and --load-wait > 0", "fix the value")
    if args.memory_budget is not None and (not args.board or not args.memory_budget > 0):
        raise PipelineError(f"--memory-budget {args.memory_budget:g}: applies to --board, in GB > 0", "fix the value")
    if not args.what and not args.board:
        raise PipelineError("nothing to serve", "name a bundle or a recipe (or several), or --board NAME")
    if args.torch_threads is not None and args.torch_threads < 1:
        raise PipelineError(f"--torch-threads {args.torch_threads}: must be at least 1", "fix the value")
    if not (args.header_timeout > 0 and args.body_timeout > 0 and args.max_connections >= 1):
        raise PipelineError("--header-timeout and --body-timeout must be > 0, --max-connections >= 1", "fix the value")
    for origin in args.cors_origin:
        if not (origin.startswith(("http://", "https://")) and "/" not in origin.split("://", 1)[1]):
            raise PipelineError(f"--cors-origin {origin!r}: not an origin", "write it as a browser sends it: "
                                "scheme://host[:port], e.g. http://kiosk.local:3000")


def allowed_hosts(args) -> frozenset[str] | None:
    """The Host header names answered: for a loopback server its loopback names (plus --allowed-host); for another
    address any, unless --allowed-host narrows it."""
    extra = {h.lower() for h in args.allowed_host}
    if args.host in LOOPBACK:
        return LOOPBACK_HOSTS | extra
    return frozenset(extra) if extra else None


# options the unit repeats as given (flag -> argparse dest); --api-key never: it goes in an environment file
UNIT_OPTIONS = {"--host": "host", "--port": "port", "--torch-threads": "torch_threads", "--max-queue": "max_queue",
                "--request-timeout": "request_timeout",
                "--header-timeout": "header_timeout", "--body-timeout": "body_timeout",
                "--max-connections": "max_connections", "--target": "target", "--work": "work", "--pubkey": "pubkey",
                "--root": "root", "--board": "board", "--keep-alive": "keep_alive", "--load-wait": "load_wait",
                "--memory-budget": "memory_budget"}
UNIT_FLAGS = {"--no-auth": "no_auth", "--public-metrics": "public_metrics", "--no-truncate": "no_truncate",
              "--strict-limits": "strict_limits"}


def unit_file(args) -> str:
    """A systemd service running this command, written from the parsed options (never by editing the command line
    given: an abbreviated --api would survive that): the API key goes in an environment file, never in the unit."""
    cmd = [sys.executable, "-m", "pipeline", "serve",
           *(str(Path(w).absolute()) if Path(w).exists() else w for w in args.what)]
    for flag, dest in UNIT_OPTIONS.items():
        value = getattr(args, dest, None)
        if value is not None:
            cmd += [flag, str(value)]
    for flag, dest in UNIT_FLAGS.items():
        if getattr(args, dest, False):
            cmd.append(flag)
    for name in args.allowed_host:
        cmd += ["--allowed-host", name]
    for origin in args.cors_origin:
        cmd += ["--cors-origin", origin]
    said = " ".join(args.what) or f"board {args.board}"
    lines = ["[Unit]", f"Description=OpenAI-compatible LLM server ({said}, jetson-trtllm-pipeline)",
             "After=network-online.target", "Wants=network-online.target", "", "[Service]", "Type=simple",
             f"WorkingDirectory={Path.cwd()}", f"ExecStart={shlex.join(cmd)}", "Restart=on-failure", "RestartSec=5",
             f"LimitNOFILE={FILE_LIMIT}", "PrivateTmp=yes", "NoNewPrivileges=yes",
             # published Jetson speeds are MAXN with jetson_clocks (FACTS.md); `probe` says which mode this board runs
             "# For the speeds `probe` and the report quote: sudo nvpmodel -m 0 && sudo jetson_clocks (MAXN)",
             "# ExecStartPre=/usr/bin/jetson_clocks"]
    if args.api_key:
        lines += ["# the key: JETSON_PIPELINE_API_KEY=... in this file, owned by root, mode 600; never in the unit",
                  f"EnvironmentFile={ENV_FILE}"]
    lines += ["", "[Install]", "WantedBy=multi-user.target", ""]
    return "\n".join(lines)


ENV_FILE = "/etc/jetson-pipeline/serve.env"
TEXT_BODY_BYTES = 2 * 2**20         # a chat of max_input_len tokens is far below this
IMAGE_BODY_BYTES = 32 * 2**20       # a chat with images: one image of pipeline.images.MAX_IMAGE_BYTES, base64'd
AUDIO_BODY_BYTES = 36 * 2**20       # ... with a recording of pipeline.audio.AudioLimits' 25 MiB, base64'd


def run(args) -> int:
    import logging

    from pipeline.files import write_atomic
    from pipeline.serve.app import Server, Settings, create_app
    from pipeline.serve.guard import connection_cap, guarded_protocol, raise_file_limit
    from pipeline.serve.metrics import Metrics
    from pipeline.serve.modelset import ModelSet

    _check(args)
    if args.systemd:
        write_atomic(Path(args.systemd), unit_file(args))
        print(f"wrote {args.systemd}: sudo cp {args.systemd} /etc/systemd/system/ && sudo systemctl daemon-reload "
              f"&& sudo systemctl enable --now {Path(args.systemd).name}")
        if args.api_key:
            print(f"the API key is not in the unit: sudo install -m 600 -D /dev/null {ENV_FILE} && echo "
                  f"JETSON_PIPELINE_API_KEY=... | sudo tee {ENV_FILE} >/dev/null")
        return 0
    cap = connection_cap(args.max_connections, raise_file_limit())
    keep_alive = _keep_alive(args.keep_alive)
    # serving bundles is serving on the board itself: its own MemAvailable before any engine loads bounds the set
    on_board = any((p / "MANIFEST.json").is_file() for w in args.what for p in installed_sources(Path(w)))
    spec, target = args.board_source(args.board, args.root if on_board else None) if args.board else \
        (None, args.target)
    if spec is not None and args.memory_budget is not None:
        spec = dataclasses.replace(spec, budget=int(args.memory_budget * 1e9), budget_said="--memory-budget")
    sources = _sources(args, spec, target)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    metrics = Metrics()
    servers = []
    for served, load, resident in sources:
        settings = Settings(api_key=args.api_key, max_queue=args.max_queue,
                            max_body_bytes=AUDIO_BODY_BYTES if served.audio else
                            IMAGE_BODY_BYTES if served.images else TEXT_BODY_BYTES,
                            request_timeout=args.request_timeout, allowed_hosts=allowed_hosts(args),
                            cors_origins=frozenset(args.cors_origin), public_metrics=args.public_metrics,
                            truncate=not args.no_truncate, strict_limits=args.strict_limits)
        servers.append((Server(served, settings, load, metrics), resident))
    models = ModelSet(servers, metrics, spec.budget if spec else None, spec.budget_said if spec else "",
                      args.load_wait, keep_alive)
    over = models.overcommitted()
    if over is not None:
        raise PipelineError(f"--board {args.board}: {over}", "python -m pipeline plan --board NAME says what fits; "
                            "make a model on-demand, or give one a smaller KV budget or format")
    protocol = guarded_protocol(ConnectionLimits(header_timeout=args.header_timeout, body_timeout=args.body_timeout,
                                                 max_connections=cap))
    import uvicorn
    for server, resident in servers:
        served = server.served
        print(f"serving {served.name} ({served.backend}; max_batch_size {served.limits.max_batch_size}, max_input_len "
              f"{served.limits.max_input_len}, max_seq_len {served.limits.max_seq_len}"
              f"{'' if len(servers) == 1 else '; resident' if resident else '; on demand'}) on http://{args.host}:"
              f"{args.port}/v1 (at most {cap} connections)", flush=True)
    # no X-Forwarded-* rewriting (uvicorn trusts them from 127.0.0.1 by default; nothing here reads the client's
    # address or scheme, and one layer less runs before every request), no access log (warning level hides it, but
    # uvicorn formats its arguments for every response all the same)
    uvicorn.run(create_app(models), host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=5,
                http=protocol, proxy_headers=False, access_log=False)
    return 0


def _keep_alive(value: str) -> float:
    from pipeline.serve.errors import ApiError
    from pipeline.serve.modelset import keep_alive_of
    try:
        seconds = keep_alive_of(value)
    except ApiError as exc:
        raise PipelineError(f"--keep-alive {value!r}: {exc.message}", "e.g. --keep-alive 5m") from None
    assert seconds is not None
    return seconds


def installed_sources(path: Path) -> list[Path]:
    """What to serve for `path`: an install's --work directory serves the bundle, or the set of bundles, its install
    recorded (the signed sources, verified again by from_bundle: a staged rollout's restart serves whatever its
    install, rollback or commit left in place); anything else as it is."""
    from pipeline.device.install_history import BUNDLE, SET, current
    if (path / "MANIFEST.json").exists() or not ((path / BUNDLE).is_dir() or (path / SET).is_dir()):
        return [path]
    held = current(path)
    sources = [m.get("source") for m in held.members] if held else []
    if not sources or not all(isinstance(s, str) and s for s in sources):
        raise PipelineError(f"{path}: an install directory whose record names no bundle it came from",
                            "install the bundle (or the set) again with this version of the pipeline, or serve the "
                            "bundles")
    return [Path(str(s)) for s in sources]


def _sources(args, spec, target: str | None) -> list[tuple[Any, Callable[[], Any], bool]]:
    """(Served, load, resident) per model: the WHATs given (bundles or recipes), or a board's recipes. With a board,
    each WHAT must be one of its models (a bundle is named RECIPE@TARGET) and takes its residency."""
    from pipeline.serve.sources import from_bundle

    residency = dict(spec.models) if spec is not None else {}
    out, names = [], set()
    given = [(w, p) for w in args.what for p in installed_sources(Path(w))] if args.what else \
        [(name, Path(name)) for name, _ in spec.models]
    for what, path in given:
        if (path / "MANIFEST.json").is_file():
            work = Path(args.work) if args.work else Path(f"{path.name}.serve")
            # an install's directory: what it (or a rollback of it) put in place is served, older or not
            served, load = from_bundle(path, work, args.root, args.pubkey, allow_downgrade=path != Path(what))
        else:
            served, load = args.recipe_source(what, target, args.torch_threads)
        if served.images is not None:
            served = dataclasses.replace(served, images=dataclasses.replace(
                served.images, allow_hosts=frozenset(h.lower() for h in args.allow_image_urls)))
        elif args.allow_image_urls and len(args.what) <= 1:
            print(f"note: --allow-image-urls has no effect: {served.name} takes no images", file=sys.stderr)
        recipe = served.name.split("@", 1)[0]
        if spec is not None and recipe not in residency:
            raise PipelineError(f"{what}: {served.name} is not a model of board {args.board} "
                                f"({', '.join(residency)})", "serve the board's own bundles, or edit its board file")
        if served.name in names:
            raise PipelineError(f"{what}: {served.name} is given twice", "name each model once")
        names.add(served.name)
        out.append((served, load, residency.get(recipe, True)))
    return out
