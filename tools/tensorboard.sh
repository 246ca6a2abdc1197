#!/usr/bin/env bash
# Set up if needed, then serve TensorBoard on 127.0.0.1 over a folder of runs (default: runs/).
#   bash tools/tensorboard.sh [LOGDIR] [tensorboard options]   (make tensorboard LOGDIR=... TB_PORT=...)
# Each sub-folder of LOGDIR is a run: train(..., log_dir="runs/NAME") writes one. The port is
# ORTLAB_TB_PORT (default 6006); --host is always 127.0.0.1, whatever the options say.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bash "$repo/tools/setup.sh"
if [ "${ORTLAB_USE_ACTIVE_ENV:-0}" = 1 ]; then py=python; else py=$repo/${ORTLAB_VENV:-.venv}/bin/python; fi
case "$py" in /*|python) ;; *) py=$repo/$py ;; esac
logdir=${1:-$repo/runs}
[ $# -gt 0 ] && shift
mkdir -p "$logdir"
exec "$py" -m tensorboard.main --logdir "$logdir" --port "${ORTLAB_TB_PORT:-6006}" "$@" --host 127.0.0.1
