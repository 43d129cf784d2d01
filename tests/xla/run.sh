#!/usr/bin/env bash
# The XLA tests, on torch_xla's CPU runtime (PJRT_DEVICE=CPU), in their own environment: one command builds it
# (when absent) and runs them.
#
#   bash tests/xla/run.sh                 # build .venv-xla (first time: ~5 minutes, ~7 GB), then pytest tests/xla
#   bash tests/xla/run.sh -k resume -x    # arguments go to pytest
#
# torch_xla 2.9 needs torch 2.9.0 exactly, so this cannot share the test venv (.venv, torch pinned in
# constraints.txt). PyPI's torch 2.9.0 for Linux is the CUDA build; it installs and runs on the CPU.
# XLA_VENV=/some/path picks another place for the environment.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
VENV="${XLA_VENV:-$ROOT/.venv-xla}"
PYTHON="${PYTHON:-python3.11}"
if [[ ! -f "$VENV/.trainwright-xla-ready" ]]; then
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install -q "torch==2.9.0" "torch_xla==2.9.0" numpy "safetensors>=0.4" "xxhash==4.1.0" pyyaml packaging \
        pytest pytest-timeout
    "$VENV/bin/pip" install -q --no-deps -e "$ROOT"   # the project itself, without letting pip touch torch
    touch "$VENV/.trainwright-xla-ready"
fi
cd "$ROOT"
export PJRT_DEVICE="${PJRT_DEVICE:-CPU}"
exec "$VENV/bin/python" -m pytest tests/xla -m xla "$@"
