#!/bin/bash
# Where a conversion's time goes on this machine's storage, from the repository root after the
# build (build/bfshard):
#     dev/cuda/io-check.sh            report: $OUT/io-check-report.txt (OUT defaults to a temp dir)
# dev/cuda/gpu-check.sh runs it as its I/O step. What it measures:
#  1. the floors: dd from /dev/zero (16 MiB blocks, conv=fsync) with 1 writer and with nproc
#     writers at once, IO_GIB in all, on tmpfs and on the disk;
#  2. a gpt-oss-20b-shaped MXFP4 checkpoint (dev/cuda/synth_gptoss.py, IO_LAYERS layers, on
#     tmpfs) converted with --device cuda and --device cpu, W=8 and --layout hf, to tmpfs and to
#     the disk: GB/s of output (bfshard's --json), wall, peak RSS, writer busy, and each GB/s
#     as a fraction of the nproc-writer floor of the same place;
#  3. a summary of both.
# Without a GPU the cuda converts print "SKIP (no GPU)" with bfshard's own refusal and the rest
# runs. A place without the free space a step needs is skipped, saying how much it has and
# needs. Every command runs under a timeout; the report is written as it goes; the work
# folders (on tmpfs: memory) are removed at the end, also on failure or interruption.
# Knobs: OUT; IO_LAYERS (default 8: 3.9 GB in, 13.5 GB out; ~2.5 min on a 16-core H200 node);
#        IO_GIB (GiB each floor writes, default 8); IO_TMPFS (default /dev/shm);
#        IO_DISK (a folder on the disk, default build/io-disk: the repository's disk);
#        IO_TIMEOUT (seconds for each dd round and each convert, default 300);
#        IO_REPORT (the report's path; empty: stdout only, as gpu-check.sh runs it).
set -u
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/io-check.XXXXXX")}
mkdir -p "$OUT"
REPORT=${IO_REPORT-$OUT/io-check-report.txt}
[ -n "$REPORT" ] && exec > >(tee "$REPORT") 2>&1
B=${BFSHARD:-build/bfshard}
IO_LAYERS=${IO_LAYERS:-8}
IO_GIB=${IO_GIB:-8}
IO_TIMEOUT=${IO_TIMEOUT:-300}
N=$(nproc)
T=${IO_TMPFS:-/dev/shm}/bfs-io.$$
D=${IO_DISK:-build/io-disk}/bfs-io.$$
trap 'rm -rf "$T" "$D"; rmdir "${D%/*}" 2>/dev/null' EXIT
trap 'exit 130' INT TERM
mkdir -p "$T" "$D" || { echo "FAIL: cannot create $T and $D"; exit 1; }
S=$(date +%s)
FAILS=0
step() { echo; echo "=== io [$(( $(date +%s) - S ))s] $*"; }
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
run() { local t=$1; shift; timeout "$t" "$@"; local rc=$?; [ $rc -eq 124 ] && echo "TIMEOUT after ${t}s: $*"; return $rc; }
free_gb() { df -Pk "$1" | awk 'NR == 2 { printf "%.1f", $4 * 1024 / 1e9 }'; }
# room PLACE GB WHAT: true when PLACE has GB (x1.1) free, else says what is skipped
room() {
    local f; f=$(free_gb "$1")
    awk -v f="$f" -v n="$2" 'BEGIN { exit !(f >= n * 1.1) }' && return 0
    echo "SKIP (space): $3: ~$2 GB needed on $1, which has $f GB free"
    return 1
}

GPU=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then GPU=1; fi
[ -x "$B" ] || { echo "FAIL: $B is not built (make all first)"; exit 1; }

step "places: tmpfs $T, disk $D; $N CPUs; $("$B" --version | head -1)"
for p in "$T" "$D"; do echo "$p: $(stat -f -c %T "$p"), $(free_gb "$p") GB free"; done
[ "$(stat -f -c %T "$T")" = tmpfs ] || echo "note: $T is not tmpfs (IO_TMPFS)"
[ "$(stat -f -c %T "$D")" = tmpfs ] && echo "note: $D is on tmpfs, not a disk (IO_DISK)"

# x G F: " = 0.42x the floor" when both figures are known
x() { [ -n "$1" ] && [ -n "$2" ] && awk -v g="$1" -v f="$2" 'BEGIN { if (f > 0) printf " = %.2fx", g / f }'; }

# floor PLACE DIR WRITERS: IO_GIB from /dev/zero by WRITERS dd at once; sets FLOOR_<PLACE>_<1|n>
floor() {
    local l=$1 d=$2 n=$3 per t0 t1 pids="" p i rc=0 secs gbs
    per=$(( IO_GIB * 64 / n )); [ $per -ge 1 ] || per=1   # 16 MiB blocks a writer
    t0=$(date +%s.%N)
    for i in $(seq 1 "$n"); do
        timeout "$IO_TIMEOUT" dd if=/dev/zero of="$d/dd$i" bs=16M count=$per conv=fsync status=none & pids="$pids $!"
    done
    for p in $pids; do wait "$p" || rc=$?; done   # these pids only: a bare wait would wait for the tee too
    t1=$(date +%s.%N)
    rm -f "$d"/dd*
    if [ $rc != 0 ]; then
        fail "floor $l, $n writer(s): dd exit $rc$([ $rc = 124 ] && echo " (timeout ${IO_TIMEOUT}s)")"
        return
    fi
    secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
    gbs=$(awk -v s="$secs" -v by=$(( n * per * 16 )) 'BEGIN { printf "%.2f", by * 1048576 / 1e9 / s }')
    if [ "$n" = 1 ]; then eval "FLOOR_${l}_1=$gbs"; else eval "FLOOR_${l}_n=$gbs"; fi
    echo "floor $l, $n writer(s): $(( n * per * 16 )) MiB in $secs s = $gbs GB/s"
}

step "1 floors: dd from /dev/zero, 16 MiB blocks, conv=fsync, $IO_GIB GiB by 1 and by $N writers"
room "$T" "$IO_GIB" "the tmpfs floors" && { floor tmpfs "$T" 1; floor tmpfs "$T" "$N"; }
room "$D" "$IO_GIB" "the disk floors" && { floor disk "$D" 1; floor disk "$D" "$N"; }

# conv LABEL DEVICE PLACE DIR ARGS...: one convert of the synthetic checkpoint; sets GBS_<LABEL>
conv() {
    local l=$1 dev=$2 place=$3 o=$4 rc msg gbs fl tm=(); shift 4
    rm -rf "$o" "$T/t_$l.txt"
    if [ "$dev" = cuda ] && [ -n "${CUDA_REFUSED:-}" ]; then
        echo "$l: SKIP (no GPU): as above"; return
    fi
    [ -x /usr/bin/time ] && tm=(/usr/bin/time -f "%e s wall, %M KB peak RSS, %P CPU" -o "$T/t_$l.txt")
    run "$IO_TIMEOUT" ${tm[@]+"${tm[@]}"} "$B" convert "$SYN" "$o" "$@" --device "$dev" --json --force \
        > "$T/j_$l.json" 2> "$T/e_$l.txt"
    rc=$?
    if [ $rc != 0 ]; then
        msg=$(grep -m1 'error:' "$T/e_$l.txt" || tail -1 "$T/e_$l.txt")
        if [ "$dev" = cuda ] && [ $GPU = 0 ]; then
            echo "$l: SKIP (no GPU): bfshard refused --device cuda, exit $rc: ${msg#bfshard: error: }"
            CUDA_REFUSED=1
        else
            fail "$l: exit $rc: $msg"
        fi
        rm -rf "$o"; return
    fi
    gbs=$(grep -oE '"gb_per_s": [0-9.]+' "$T/j_$l.json" | awk '{ printf "%.2f", $2 }')
    eval "GBS_$l=$gbs; fl=\${FLOOR_${place}_n:-}"
    echo "$l: $gbs GB/s$(x "$gbs" "$fl")${fl:+ the $N-writer $place floor}"
    echo "    $([ -f "$T/t_$l.txt" ] && tail -1 "$T/t_$l.txt"); $(grep -oE '"(bytes_written|backend|write_seconds|writer_busy)": ("[^"]*"|[0-9.]+)' "$T/j_$l.json" | tr '\n' ' ')"
    rm -rf "$o"
}

step "2 gpt-oss-20b-shaped MXFP4, $IO_LAYERS layer(s), on tmpfs; converted with --device cuda and cpu to tmpfs and to the disk"
# the input ~0.49 GB a layer and the output ~1.7 GB a layer (+ 0.1 and 0.3 for the embeddings)
need_in=$(awk -v l="$IO_LAYERS" 'BEGIN { printf "%.1f", 0.49 * l + 0.1 }')
need_out=$(awk -v l="$IO_LAYERS" 'BEGIN { printf "%.1f", 1.7 * l + 0.3 }')
if room "$T" "$(awk -v a="$need_in" -v b="$need_out" 'BEGIN { print a + b }')" "the synthetic input and a tmpfs output"; then
    SYN=$T/syn
    run "$IO_TIMEOUT" python3 dev/cuda/synth_gptoss.py "$SYN" --layers "$IO_LAYERS" > "$T/syn.txt" 2>&1 \
        || { cat "$T/syn.txt"; fail "the synthetic checkpoint"; SYN=; }
fi
if [ -n "${SYN:-}" ]; then
    echo "input: $(du -sh "$SYN" | cut -f1); output ~$need_out GB a convert"
    for dev in cuda cpu; do
        conv "${dev}_tmpfs_W8" $dev tmpfs "$T/o" --world-size 8
        conv "${dev}_tmpfs_hf" $dev tmpfs "$T/o" --layout hf
    done
    if room "$D" "$need_out" "the disk converts"; then
        for dev in cuda cpu; do
            conv "${dev}_disk_W8" $dev disk "$D/o" --world-size 8
            conv "${dev}_disk_hf" $dev disk "$D/o" --layout hf
        done
    fi
fi

step "3 summary: GB/s (x the $N-writer floor of the same place)"
# also in $OUT/io-summary.txt, for gpu-check.sh's closing summary
{
echo "floors:  tmpfs 1 writer ${FLOOR_tmpfs_1:-n/a}, $N writers ${FLOOR_tmpfs_n:-n/a}; disk 1 writer ${FLOOR_disk_1:-n/a}, $N writers ${FLOOR_disk_n:-n/a}"
for place in tmpfs disk; do
    for lay in W8 hf; do
        line="$place $lay:"
        for dev in cuda cpu; do
            eval "g=\${GBS_${dev}_${place}_${lay}:-}"; eval "f=\${FLOOR_${place}_n:-}"
            line="$line $dev ${g:-n/a}$(x "$g" "$f"),"
        done
        echo "${line%,}"
    done
done
} | tee "$OUT/io-summary.txt"
step "io done: $FAILS failure(s)"
exit $(( FAILS > 0 ))
