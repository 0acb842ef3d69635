"""`python -m pipeline serve BUNDLE|RECIPE`: typed settings from the command line, the systemd unit, and uvicorn.

Safe by default: binds 127.0.0.1. Any other address needs --api-key (or JETSON_PIPELINE_API_KEY) or an explicit
--no-auth, so an engine is never put on a robot's network open by accident.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from pipeline import settings
from pipeline.errors import PipelineError

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def add_parser(sub) -> None:
    s = sub.add_parser(
        "serve", help="OpenAI-compatible HTTP server: a verified engine bundle (device) or a built recipe "
        "(workstation)", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Serve the model through OpenAI's API (/v1/models, /v1/chat/completions, /v1/completions; "
        "streaming), with /health and Prometheus /metrics.\n\n"
        "  BUNDLE  an engine bundle made by `python -m pipeline device` on this board: verified (signature, hashes),\n"
        "          gated (same SM, TensorRT, JetPack and backend version as the board that built it), unpacked\n"
        "          into --work, then served by its backend (TensorRT-LLM 0.12 executor or Edge-LLM runtime)\n"
        "  RECIPE  a recipe built here with `doit build`: its quantized model in the exact numerics the goldens\n"
        "          were computed with (PyTorch, CPU or GPU), to develop an application before a board exists")
    s.add_argument("what", metavar="BUNDLE|RECIPE", help="a bundle directory, or a recipe name")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    s.add_argument("--api-key", default=settings.get("JETSON_PIPELINE_API_KEY"),
                   help="require `Authorization: Bearer KEY` on /v1/* (default $JETSON_PIPELINE_API_KEY)")
    s.add_argument("--no-auth", action="store_true", help="serve a non-loopback --host without an API key")
    s.add_argument("--max-queue", type=int, default=16,
                   help="requests that may wait beyond the engine's max_batch_size before a 429 (default 16)")
    s.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request (default 600)")
    s.add_argument("--target", help="RECIPE: which of its targets' limits to serve with (default: its first)")
    s.add_argument("--work", help="BUNDLE: where to unpack it (default: ./<bundle name>.serve)")
    s.add_argument("--pubkey", help="BUNDLE: trust this public key too")
    s.add_argument("--root", default=settings.get("JETSON_PIPELINE_PROBE_ROOT", "/"),
                   help="BUNDLE: probe this directory instead of / (a recorded board)")
    s.add_argument("--systemd", metavar="UNIT_FILE",
                   help="write a systemd unit that runs this same command (restart on failure) and exit")
    s.set_defaults(func=run)


def _check(args) -> None:
    if args.host not in LOOPBACK and not args.api_key and not args.no_auth:
        raise PipelineError(f"--host {args.host} puts the server on the network without an API key",
                            "pass --api-key KEY (clients send Authorization: Bearer KEY), or --no-auth on purpose")
    if args.api_key and args.no_auth:
        raise PipelineError("--api-key and --no-auth contradict each other", "pass one of them")
    if not 1 <= args.port <= 65535:
        raise PipelineError(f"--port {args.port}: not a TCP port", "pass 1..65535")
    if args.max_queue < 0 or args.request_timeout <= 0:
        raise PipelineError("--max-queue must be >= 0 and --request-timeout > 0", "fix the value")


def unit_file(args, argv: list[str]) -> str:
    """A systemd service running this command; the API key goes in an environment file, never in the unit."""
    cmd = _without(_without([sys.executable, "-m", "pipeline", "serve", *argv], "--systemd"), "--api-key")
    lines = ["[Unit]", f"Description=OpenAI-compatible LLM server ({args.what}, jetson-trtllm-pipeline)",
             "After=network-online.target", "Wants=network-online.target", "", "[Service]", "Type=simple",
             f"WorkingDirectory={Path.cwd()}", f"ExecStart={shlex.join(cmd)}", "Restart=on-failure", "RestartSec=5",
             # published Jetson speeds are MAXN with jetson_clocks (FACTS.md); `probe` says which mode this board runs
             "# For the speeds `probe` and the report quote: sudo nvpmodel -m 0 && sudo jetson_clocks (MAXN)",
             "# ExecStartPre=/usr/bin/jetson_clocks"]
    if args.api_key:
        lines += ["# the key: JETSON_PIPELINE_API_KEY=... in this file (mode 600), never in the unit",
                  "EnvironmentFile=/etc/jetson-pipeline/serve.env"]
    lines += ["", "[Install]", "WantedBy=multi-user.target", ""]
    return "\n".join(lines)


def _without(cmd: list[str], flag: str) -> list[str]:
    out, skip = [], False
    for a in cmd:
        if skip:
            skip = False
            continue
        if a == flag:
            skip = True
            continue
        if a.startswith(flag + "="):
            continue
        out.append(a)
    return out


def run(args) -> int:
    import logging

    from pipeline.files import write_atomic
    from pipeline.serve.app import Server, Settings, create_app
    from pipeline.serve.sources import from_bundle, from_recipe

    _check(args)
    if args.systemd:
        argv = sys.argv[sys.argv.index("serve") + 1:] if "serve" in sys.argv else [args.what]
        write_atomic(Path(args.systemd), unit_file(args, argv))
        print(f"wrote {args.systemd}: sudo cp {args.systemd} /etc/systemd/system/ && sudo systemctl daemon-reload "
              f"&& sudo systemctl enable --now {Path(args.systemd).name}")
        return 0
    what = Path(args.what)
    if (what / "MANIFEST.json").is_file():
        work = Path(args.work) if args.work else Path(f"{what.name}.serve")
        served, load = from_bundle(what, work, args.root, args.pubkey)
    else:
        served, load = from_recipe(args.what, args.target)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    server = Server(served, Settings(api_key=args.api_key, max_queue=args.max_queue,
                                     request_timeout=args.request_timeout), load)
    import uvicorn
    print(f"serving {served.name} ({served.backend}; max_batch_size {served.limits.max_batch_size}, max_input_len "
          f"{served.limits.max_input_len}, max_seq_len {served.limits.max_seq_len}) on http://{args.host}:"
          f"{args.port}/v1", flush=True)
    uvicorn.run(create_app(server), host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=5)
    return 0
