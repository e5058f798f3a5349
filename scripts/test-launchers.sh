#!/bin/sh
# `make test-launchers`: a conversion in parts under real launchers on this machine.
#   mpirun (Open MPI from Debian, installed when missing), 4 processes on localhost, each
#   `bfshard convert --ranks auto` into one shared OUTDIR, then `bfshard merge`: every file
#   byte-identical to a single run; each process read only its share of the input (its rows
#   plus the headers; the shares add up to the whole run's) and the sources were hashed once.
#   torchrun --nnodes 2 --nproc-per-node 2 on localhost (two static-rendezvous "nodes"), each
#   process converting its own rank into its node's OUTDIR, gathered and merged: only when
#   build/interop-venv (make interop) has torch; skipped otherwise, and said so.
# Usage: scripts/test-launchers.sh [BFSHARD]
set -eu
cd "$(dirname "$0")/.."
B=$(realpath "${1:-build/bfshard}")
FX=fixtures/mxfp4-tiny
T=$(mktemp -d "${TMPDIR:-/tmp}/bfshard-launchers.XXXXXX")
trap 'rm -rf "$T"' EXIT

if ! command -v mpirun >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    echo "test-launchers: installing openmpi-bin" >&2
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq >&2 || true
    $SUDO apt-get install -y -qq openmpi-bin >&2
fi

# the bytes check: every process read at most its share, the shares add up to the whole run
check_reads() { # WHOLE_JSON PART_JSON...
    python3 - "$FX" "$@" <<'EOF'
import json, os, struct, sys
fx, whole, parts = sys.argv[1], sys.argv[2], sys.argv[3:]
H = size = 0
for n in os.listdir(fx):
    if n.endswith(".safetensors"):
        with open(os.path.join(fx, n), "rb") as f:
            H += 8 + struct.unpack("<Q", f.read(8))[0]
        size += os.path.getsize(os.path.join(fx, n))
w = json.load(open(whole))
ps = [json.load(open(p)) for p in parts]
rows = [p["input_bytes_read"] - H for p in ps]
for p, r in zip(ps, rows):
    print(f"  ranks {p['ranks']:>5}: read {r} bytes of rows + {H} of headers "
          f"(whole run {w['input_bytes_read'] - H}), hashed {p['source_bytes_hashed']} of {size} source bytes")
    assert 0 <= r < w["input_bytes_read"] - H, "a part read more than its share"
assert sum(rows) == w["input_bytes_read"] - H, f"shares add up to {sum(rows)}, whole run {w['input_bytes_read'] - H}"
assert sum(p["source_bytes_hashed"] for p in ps) == size == w["source_bytes_hashed"], "sources not hashed exactly once"
EOF
}

"$B" convert "$FX" "$T/whole" --world-size 8 --quiet --json > "$T/whole.json"

# ---- mpirun -------------------------------------------------------------------------------------
echo "test-launchers: mpirun -np 4, --ranks auto, one shared OUTDIR, merge"
ROOT=""; [ "$(id -u)" -eq 0 ] && ROOT="--allow-run-as-root"
mpirun $ROOT --oversubscribe -np 4 --host localhost:4 \
    sh -c "'$B' convert '$FX' '$T/mpi' --world-size 8 --ranks auto --json > '$T/mpi.'\$OMPI_COMM_WORLD_RANK.json"
"$B" merge "$T/mpi"
diff -r "$T/whole" "$T/mpi"
check_reads "$T/whole.json" "$T"/mpi.?.json
echo "test-launchers: mpirun: OK (byte-identical to one run)"

# ---- torchrun -----------------------------------------------------------------------------------
TR=${TORCHRUN:-build/interop-venv/bin/torchrun}  # TORCHRUN: another venv's
if [ -x "$TR" ]; then
    echo "test-launchers: torchrun --nnodes 2 --nproc-per-node 2, each process its own rank"
    pids=""
    for node in 0 1; do
        "$TR" --nnodes 2 --nproc-per-node 2 --node-rank $node --master-addr 127.0.0.1 --master-port 29517 \
            --no-python sh -c "'$B' convert '$FX' '$T/node$node' --world-size \$WORLD_SIZE --ranks auto --json \
                > '$T/tr.'\$RANK.json" &
        pids="$pids $!"
    done
    for p in $pids; do wait "$p"; done   # each node's exit status, not just the last
    mkdir "$T/gathered"
    # what a shared filesystem would hold: each node's rank files and part manifest, and
    # the copied files (config.json, tokenizer...) both nodes wrote, which must be the same
    cp "$T"/node0/* "$T/gathered/"
    for f in "$T"/node1/*; do
        g="$T/gathered/$(basename "$f")"
        if [ -e "$g" ]; then cmp "$f" "$g"; else cp "$f" "$g"; fi
    done
    "$B" convert "$FX" "$T/whole4" --world-size 4 --quiet --json > "$T/whole4.json"
    "$B" verify "$T/node0"
    "$B" merge "$T/gathered"
    diff -r "$T/whole4" "$T/gathered"
    FXW=$FX check_reads "$T/whole4.json" "$T"/tr.?.json
    echo "test-launchers: torchrun: OK"
else
    echo "test-launchers: torchrun SKIPPED: $TR not found (make interop creates it)"
fi
echo "test-launchers: all passed"
