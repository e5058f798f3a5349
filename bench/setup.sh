#!/bin/sh
# `make bench` prerequisites: GNU time (/usr/bin/time -v, Debian package `time`) and a
# Python venv with the upstream packages (bench/requirements.txt, and the load case's peer loaders,
# bench/requirements-peers.txt), created when missing, updated when either list changes.
#   bench/setup.sh VENV_DIR
set -e
VENV=${1:-build/bench-venv}
SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo
if [ ! -x /usr/bin/time ]; then
    echo "bench: installing GNU time (/usr/bin/time -v measures peak RSS)"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq time
fi
# the stamp holds the requirements it was made from: a changed list installs again
REQS="$(cat "$(dirname "$0")/requirements.txt" "$(dirname "$0")/requirements-peers.txt")"
if [ -f "$VENV/.bench-ready" ] && [ "$(cat "$VENV/.bench-ready")" = "$REQS" ]; then
    exit 0
fi
echo "bench: installing bench/requirements.txt and requirements-peers.txt into $VENV from PyPI (a few minutes the first time)"
if ! python3 -m venv "$VENV" 2>/dev/null; then
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq python3-venv
    python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install -q --disable-pip-version-check -r "$(dirname "$0")/requirements.txt"
"$VENV/bin/python" -c "import torch, transformers, bitsandbytes, safetensors, numpy"
# the load case's peers, one by one: one that does not install is reported by the case as not run
grep -v '^#' "$(dirname "$0")/requirements-peers.txt" | while read -r req; do
    [ -n "$req" ] || continue
    "$VENV/bin/pip" install -q --disable-pip-version-check "$req" \
        || echo "bench: $req did not install: the load case reports it as not run"
done
printf '%s' "$REQS" > "$VENV/.bench-ready"
