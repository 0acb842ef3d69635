#!/usr/bin/env bash
# Creates .venv with the workstation environment (CPU torch, ModelOpt, doit, ...). Safe to re-run: it does nothing
# when pyproject.toml has not changed since the last successful run.
#
#   TORCH_INDEX_URL=<index>  where to take torch from (e.g. PyTorch's CPU or cu126 index); default: pip's own
#                            configuration (this project's CI machines provide the CPU wheel locally)
#   PYTHON=python3.11        interpreter for the venv (>= 3.10)
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=".venv/.bootstrap-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -e "$stamp" ]; then
  echo "bootstrap: installing the workstation environment into .venv (first run: a few minutes)" >&2
  .venv/bin/python -m pip install -q --upgrade pip
  # torch alone and first, pinned: nothing installed after it can then resolve a multi-GB CUDA build by accident.
  .venv/bin/python -m pip install -q "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
  .venv/bin/python -m pip install -q -e ".[workstation,dev]"
  rm -f .venv/.bootstrap-*
  touch "$stamp"
fi
