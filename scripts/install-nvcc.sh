#!/usr/bin/env bash
# Installs a pinned CUDA 13.0 nvcc from PyPI into .cache/nvcc (a virtual
# environment in the repository root) unless it is already there, and prints
# the directory holding nvcc. Every package is pinned: left to itself pip
# mixes versions of the compiler's parts. Needs python3 with venv and pip
# (on Debian: apt-get install python3-venv); nvcc also needs a host C++
# compiler (g++) to build.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
venv=$root/.cache/nvcc
pins="nvidia-cuda-nvcc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88"
stamp=$venv/installed-pins

if [ "$(cat "$stamp" 2>/dev/null)" != "$pins" ]; then
    rm -rf "$venv"
    python3 -m venv "$venv" >&2
    # shellcheck disable=SC2086 # the pins are separate words
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir $pins >&2
    echo "$pins" >"$stamp"
fi

site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
dir=$site/nvidia/cu13/bin
if [ ! -x "$dir/nvcc" ]; then
    echo "install-nvcc: no nvcc in $dir" >&2
    exit 1
fi
echo "$dir"
