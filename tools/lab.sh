#!/usr/bin/env bash
# Set up if needed, fill the learner's workspace work/ (a git-ignored copy of notebooks/ and labs/; a copy
# already there is never overwritten), then open JupyterLab on 127.0.0.1 at work/notebooks/00_welcome.ipynb.
# Extra arguments go to `jupyter lab` (e.g. --no-browser --ServerApp.port=8890).
# ORTLAB_LAB_ROOT serves another folder, with its own work/ (the browser test uses this).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bash "$repo/tools/setup.sh"
if [ "${ORTLAB_USE_ACTIVE_ENV:-0}" = 1 ]; then py=python; else py=$repo/${ORTLAB_VENV:-.venv}/bin/python; fi
case "$py" in /*|python) ;; *) py=$repo/$py ;; esac
as_root=(); [ "$(id -u)" = 0 ] && as_root=(--allow-root)  # containers often run as root
cd "${ORTLAB_LAB_ROOT:-$repo}"
export ORTLAB_WORKSPACE=$PWD/work  # the kernels (grading from a cell) find it too
"$py" -m ortlab.labs workspace
# one kernel offered, the lab's own (it loads ortlab.notebook_hints), never ipykernel's bare "Python 3"
one_kernel=('--KernelSpecManager.allowed_kernelspecs={"ortlab"}' --MappingKernelManager.default_kernel_name=ortlab)
exec "$py" -m jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.root_dir=. "${one_kernel[@]}" "${as_root[@]}" "$@" \
    work/notebooks/00_welcome.ipynb
