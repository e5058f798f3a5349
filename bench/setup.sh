#!/bin/sh
# `make bench` prerequisites: GNU time (/usr/bin/time -v, Debian package `time`) and a
# Python venv with the upstream packages (bench/requirements.txt), created when missing.
#   bench/setup.sh VENV_DIR
set -e
VENV=${1:-build/bench-venv}
SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo
if [ ! -x /usr/bin/time ]; then
    echo "bench: installing GNU time (/usr/bin/time -v measures peak RSS)"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq time
fi
if [ -f "$VENV/.bench-ready" ]; then
    exit 0
fi
echo "bench: creating $VENV from PyPI (torch, transformers, bitsandbytes, safetensors, numpy; a few minutes, once)"
if ! python3 -m venv "$VENV" 2>/dev/null; then
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq python3-venv
    python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install -q --disable-pip-version-check -r "$(dirname "$0")/requirements.txt"
"$VENV/bin/python" -c "import torch, transformers, bitsandbytes, safetensors, numpy"
touch "$VENV/.bench-ready"
