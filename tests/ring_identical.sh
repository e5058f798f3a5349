#!/bin/sh
# The ring's buffers (convert_ranks.c: bfs__slot_next) give the same bytes whether the writer
# keeps up or lags: every fixture in the HF layout cut into many files and at W=3, with
# --mem 256K (small units, several a file, round a small ring), each run again with the
# writer slowed (BFSHARD_TEST_WRITER_DELAY_US): a file's first units then wait in the ring
# while the writer ends the file before, and a buffer they hold must not be filled again.
# Every output file compared. Fails unless some units waited. (Checked: with the hold taken
# out of bfs__unit_push, 2-3 fixtures of each mode differ.) The third mode, W=5 with
# --sha256, has the writer's hash thread build five headers in its two header buffers
# (writer.h: bfs_wjob.build) ahead of a slow writer, and the sha thread read each one only
# once built: sha256sum -c must pass.
# usage: tests/ring_identical.sh BFSHARD TMPDIR
. tests/same_output.sh
set -u
B=$1 T=$2 waited=0 n=0
mkdir -p "$T" || exit 1
for d in fixtures/*/; do
    [ -f "$d/config.json" ] || continue
    for mode in "--layout hf --max-shard-size 16K --mem 256K" "--world-size 3 --mem 256K" \
                "--world-size 5 --sha256 --mem 256K"; do
        rm -rf "$T/a" "$T/b"
        "$B" convert "$d" "$T/a" $mode --device cpu -q 2>/dev/null
        ra=$?
        BFSHARD_STAGES=1 BFSHARD_TEST_WRITER_DELAY_US=300 "$B" convert "$d" "$T/b" $mode --device cpu -q 2>"$T/stages"
        rb=$?
        same_output "$d $mode, then with the writer slowed" "$T/a" $ra "$T/b" $rb || continue
        if [ -f "$T/b/sha256sums.txt" ] && ! (cd "$T/b" && sha256sum --quiet -c sha256sums.txt); then
            echo "$d $mode: sha256sum -c fails with the writer slowed"; exit 1
        fi
        grep -q '"units_waited": [1-9]' "$T/stages" && waited=$((waited + 1))
        n=$((n + 1))
    done
done
echo "ring_identical: $n runs identical, units waited for their file in $waited"
[ $waited -gt 0 ]
