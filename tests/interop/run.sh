#!/usr/bin/env bash
# make interop: prove bfshard's output loads in the real consumers (safetensors,
# torch.distributed.checkpoint + FSDP2, transformers from_pretrained, torch's own
# consolidation), against the upstream dequant computed live.
#
# usage: tests/interop/run.sh [BUILD]        (BUILD defaults to build)
#        INTEROP_ONLY=w1024 tests/interop/run.sh   only check 6: W=1024 of a DeepSeek-V3-named
#                                            checkpoint (also in a full run)
#
# Creates (or reuses) a venv at $BUILD/interop-venv from plain PyPI with the packages
# pinned in tests/interop/requirements.txt (fixtures/requirements.txt + the compressed-tensors
# and nvidia-modelopt of fixtures/requirements-quant.txt). That is the
# only step that needs the network; the checks run offline.
#
# Then tests/interop/loader.py: bfshard.torch.load against dcp.load, and
# tests/interop/torchtitan_load.py: torchtitan's CheckpointManager on --names torchtitan
# outputs; their results are folded into the exit status.
#
# Environment:
#   PYTHON=python3          interpreter the venv is made from (3.10+)
#   INTEROP_VENV=DIR        use/create the venv at DIR instead
#   INTEROP_DEVICE=cpu      --device passed to bfshard convert (cpu, auto, cuda)
#   INTEROP_KEEP=1          keep $BUILD/interop-work (outputs, logs) after a pass
#   INTEROP_ONLY=a,b        check only these fixtures (interop.py --only; "torchtitan": all of
#                           torchtitan_load.py's), e.g.
#                           fp8-fused-tensor,dsv41-tiny,dsv4-float
set -eu

BUILD=${1:-build}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac

BFSHARD="$BUILD/bfshard"
VENV=${INTEROP_VENV:-$BUILD/interop-venv}
PY=${PYTHON:-python3}
WORK="$BUILD/interop-work"

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

T0=$(now)
[ -x "$BFSHARD" ] || { echo "interop: $BFSHARD not found (run make all first)" >&2; exit 2; }

# ---- venv ------------------------------------------------------------------------
# The stamp records what the venv was made from; a venv without a matching stamp
# (missing, half-installed, other pins, other interpreter) is rebuilt from scratch.
PYVER=$("$PY" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])') || {
    echo "interop: no usable python ($PY); set PYTHON=" >&2; exit 2; }
STAMP_WANT="python=$PYVER $(cat "$HERE/requirements.txt" fixtures/requirements.txt "$HERE/requirements-torchtitan.txt" | cksum | cut -d' ' -f1)"
STAMP="$VENV/.bfshard-interop-stamp"
VENV_STATE=reused
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$STAMP_WANT" ]; then
    VENV_STATE=created
    echo "interop: creating $VENV (python $PYVER, pip install from PyPI; torch brings ~3 GB of CUDA wheels)"
    rm -rf "$VENV"
    if ! "$PY" -m venv "$VENV"; then
        echo "interop: '$PY -m venv' failed; on Debian/Ubuntu: apt-get install python3-venv" >&2
        exit 2
    fi
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    # --no-cache-dir: the wheels are only needed once, and ~/.cache would keep 3 GB
    "$VENV/bin/python" -m pip install --quiet --no-cache-dir -r "$HERE/requirements.txt"
    # torchtitan without its declared dependencies (requirements-torchtitan.txt says why)
    "$VENV/bin/python" -m pip install --quiet --no-cache-dir --no-deps -r "$HERE/requirements-torchtitan.txt"
    "$VENV/bin/python" -c 'import torch, transformers, safetensors, bitsandbytes, accelerate, numpy, compressed_tensors
from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor
import torchtitan.components.checkpoint, torchtitan.models.qwen3, torchtitan.models.llama3, torchtitan.models.deepseek_v3, torchtitan.trainer'
    echo "$STAMP_WANT" > "$STAMP"
fi
T1=$(now)
echo "interop: venv $VENV_STATE in $(elapsed "$T0" "$T1") s"

# ---- checks (offline) --------------------------------------------------------------
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export PIP_NO_INDEX=1 TOKENIZERS_PARALLELISM=false PYTHONHASHSEED=0
unset PYTHONPATH
rm -rf "$WORK"
mkdir -p "$WORK"
# "torchtitan" in INTEROP_ONLY names the torchtitan check below, no fixture of interop.py's
IOP_ONLY=$(echo "${INTEROP_ONLY:-}" | tr ',' '\n' | grep -vx torchtitan | paste -sd, -)
RC=0
if [ -z "${INTEROP_ONLY:-}" ] || [ -n "$IOP_ONLY" ]; then
    set +e
    INTEROP_ONLY="$IOP_ONLY" "$VENV/bin/python" -X faulthandler "$HERE/interop.py" \
        --bfshard "$BFSHARD" --fixtures "$ROOT/fixtures" --work "$WORK" \
        --device "${INTEROP_DEVICE:-cpu}"
    RC=$?
    set -e
fi
T2=$(now)
echo "interop: checks took $(elapsed "$T1" "$T2") s, venv $(elapsed "$T0" "$T1") s, total $(elapsed "$T0" "$T2") s"

# ---- bfshard.torch: the package's own loader against dcp.load, same venv -----
# tests/interop/loader.py stages python/bfshard of this checkout with $BUILD/python's library
# (make python-native). With INTEROP_ONLY it runs for the fixtures of that list it knows.
LOADER_ONLY=""
LOADER_RUN=1
if [ -n "${INTEROP_ONLY:-}" ]; then
    for f in $(echo "$INTEROP_ONLY" | tr ',' ' '); do
        case "$f" in mxfp4-tiny|bnb-nf4|fp8-block) LOADER_ONLY="${LOADER_ONLY:+$LOADER_ONLY,}$f" ;; esac
    done
    [ -n "$LOADER_ONLY" ] || LOADER_RUN=0
fi
if [ $LOADER_RUN -eq 1 ]; then
    set +e
    "$VENV/bin/python" -X faulthandler "$HERE/loader.py" \
        --bfshard "$BFSHARD" --fixtures "$ROOT/fixtures" --work "$WORK/loader" ${LOADER_ONLY:+--only "$LOADER_ONLY"}
    LRC=$?
    set -e
    T3=$(now)
    echo "interop: loader checks (bfshard.torch) took $(elapsed "$T2" "$T3") s, exit $LRC"
    [ $RC -ne 0 ] || RC=$LRC
else
    echo "interop: loader checks (bfshard.torch) skipped: INTEROP_ONLY=$INTEROP_ONLY names none of its fixtures"
fi
# ---- torchtitan: its CheckpointManager (initial_load_in_hf) on --names torchtitan outputs ----
# tests/interop/torchtitan_load.py: W = 2, 3, 8 gloo ranks under torchrun. With INTEROP_ONLY it
# runs for the fixtures of that list it knows ("torchtitan" in the list: all of them).
TT_ONLY=""
TT_RUN=1
if [ -n "${INTEROP_ONLY:-}" ]; then
    TT_RUN=0
    for f in $(echo "$INTEROP_ONLY" | tr ',' ' '); do
        case "$f" in
            torchtitan) TT_RUN=2 ;;
            fp8-block|ct-fp8-block|ct-moe-mixed|moe-dsv3-fp8|qwen3-moe-e6)
                [ $TT_RUN -eq 2 ] || TT_RUN=1
                TT_ONLY="${TT_ONLY:+$TT_ONLY,}$f" ;;
        esac
    done
    [ $TT_RUN -ne 2 ] || TT_ONLY=""
fi
if [ $TT_RUN -ne 0 ]; then
    T4=$(now)
    set +e
    "$VENV/bin/python" -X faulthandler "$HERE/torchtitan_load.py" \
        --bfshard "$BFSHARD" --fixtures "$ROOT/fixtures" --work "$WORK/torchtitan" ${TT_ONLY:+--only "$TT_ONLY"}
    TRC=$?
    set -e
    echo "interop: torchtitan checks took $(elapsed "$T4" "$(now)") s, exit $TRC"
    [ $RC -ne 0 ] || RC=$TRC
else
    echo "interop: torchtitan checks skipped: INTEROP_ONLY=$INTEROP_ONLY names none of its fixtures"
fi
if [ $RC -eq 0 ]; then
    [ -n "${INTEROP_KEEP:-}" ] || rm -rf "$WORK"
    echo "interop: PASS"
else
    echo "interop: FAIL (exit $RC); outputs and logs kept in $WORK"
fi
exit $RC
