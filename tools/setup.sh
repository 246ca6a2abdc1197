#!/usr/bin/env bash
# Set up the ortlab environment; each step is skipped when it is already done.
#   ORTLAB_VENV=DIR          where the virtual environment lives (default: .venv)
#   ORTLAB_USE_ACTIVE_ENV=1  use the python on PATH (e.g. the conda env of
#                            environment.yml) instead of creating a venv
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
say() { printf '[setup] %s\n' "$*"; }
# pip, without the lines a machine's pip.conf may add for index folders it lacks
pip_install() { "$py" -m pip install --quiet "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; }

if [ "${ORTLAB_USE_ACTIVE_ENV:-0}" = 1 ]; then
    py=$(command -v python)
    env_dir=$(dirname "$(dirname "$py")")
    flavour=existing
else
    env_dir=${ORTLAB_VENV:-.venv}
    flavour=cpu
    if [ ! -x "$env_dir/bin/python" ]; then
        base=${ORTLAB_PYTHON:-$(command -v python3.11 || command -v python3)}
        "$base" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' || {
            say "ortlab needs Python 3.11 (onnxruntime-training 1.19.2 has no wheels for newer);"
            say "set ORTLAB_PYTHON=/path/to/python3.11"; exit 1; }
        say "creating the virtual environment in $env_dir"
        "$base" -m venv "$env_dir"
    fi
    py=$env_dir/bin/python
fi

stamp_dir=$env_dir/.ortlab
mkdir -p "$stamp_dir"
deps_key=$(cat pyproject.toml | sha256sum | cut -c1-16)-$flavour
# what ORTModule's C++ extensions are compiled against; they are rebuilt only when it changes
build_key() {
    "$py" - 2>/dev/null <<'PY' || echo none
from importlib.metadata import distributions
print(sorted(f"{d.metadata['Name']}=={d.version}" for d in distributions()
             if d.metadata["Name"].lower() == "torch" or d.metadata["Name"].lower().startswith("onnxruntime")))
PY
}
if [ "$(cat "$stamp_dir/deps" 2>/dev/null)" != "$deps_key" ]; then
    before=$(build_key)
    if [ "$flavour" = existing ]; then
        say "installing ortlab (no dependencies) into $env_dir"
        pip_install --no-deps -e .
    else
        say "installing dependencies into $env_dir (a few minutes the first time)"
        pip_install --upgrade pip
        pip_install -e ".[cpu]"
    fi
    "$py" - <<'PY'
from importlib.metadata import distributions
names = {d.metadata["Name"].lower() for d in distributions()}
ort = sorted(n for n in names if n.startswith("onnxruntime"))
if len(ort) != 1 or not ort[0].startswith("onnxruntime-training"):
    raise SystemExit(f"[setup] expected exactly one onnxruntime-training wheel, found {ort}: "
                     "uninstall the others (they all provide the module `onnxruntime`)")
PY
    echo "$deps_key" > "$stamp_dir/deps"
    [ "$(build_key)" = "$before" ] || rm -f "$stamp_dir/extensions"
fi

if [ ! -f "$stamp_dir/extensions" ]; then
    say "building ORTModule's C++ extensions (about 3 minutes on 2 cores)"
    "$py" -m onnxruntime.training.ortmodule.torch_cpp_extensions.install > "$stamp_dir/extensions.log" 2>&1 || {
        tail -n 30 "$stamp_dir/extensions.log"; say "extension build failed (log: $stamp_dir/extensions.log)"; exit 1; }
    touch "$stamp_dir/extensions"
fi

# DeepSpeed in a folder of its own, off the environment's path (tools/deepspeed-requirements.txt says why)
ds_key=$(sha256sum tools/deepspeed-requirements.txt | cut -c1-16)
if [ "$(cat "$stamp_dir/deepspeed" 2>/dev/null)" != "$ds_key" ]; then
    say "installing DeepSpeed into $env_dir/deepspeed (used only by the ranks that run it)"
    rm -rf "$env_dir/deepspeed"
    pip_install --no-deps --target "$env_dir/deepspeed" -r tools/deepspeed-requirements.txt
    echo "$ds_key" > "$stamp_dir/deepspeed"
fi

# The kernel loads ortlab.notebook_hints: a cell run before the cells it needs names the cell to run first.
kernel_json=$env_dir/share/jupyter/kernels/ortlab/kernel.json
if ! grep -q "ortlab.notebook_hints" "$kernel_json" 2>/dev/null; then
    say "registering the Jupyter kernel 'ortlab'"
    "$py" -m ipykernel install --sys-prefix --name ortlab --display-name "Python (ortlab)" > /dev/null
    "$py" -c 'import json, sys; p = sys.argv[1]; s = json.load(open(p)); s["argv"].append("--ext=ortlab.notebook_hints"); json.dump(s, open(p, "w"), indent=1)' "$kernel_json"
fi
# JupyterLab's settings for this lab: no "get notified about official Jupyter news?" pop-up and no update
# check (both would reach the network); `make lab` and the browser test start JupyterLab the same way.
lab_settings=$env_dir/share/jupyter/lab/settings
if ! cmp -s tools/jupyterlab-overrides.json "$lab_settings/overrides.json"; then
    say "JupyterLab settings: no news pop-up, no update check ($lab_settings/overrides.json)"
    mkdir -p "$lab_settings"
    cp tools/jupyterlab-overrides.json "$lab_settings/overrides.json"
fi
say "ready in $(( $(date +%s) - start )) s: $py"
