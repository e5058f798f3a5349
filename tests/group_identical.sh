#!/bin/sh
# Rank files written in groups (src/output/units.h) give the bytes of one file at a time:
# every fixture at W = 3 and 8, --mem 1M (small shares, batches cut) and the default, with
# BFSHARD_GROUP=1 and without; every output file compared. Then the HF layout cut into
# shards of 64K, whose files are interleaved unit by unit (src/commands/convert_inter.c),
# the same way. The grouped runs spread their files over 2 and 3 writer lanes
# (BFSHARD_WRITERS, src/output/units.h); a group's large pieces are cut unit by unit in turn
# (src/commands/convert_inter.c), the source hashes keeping a block per rank open meanwhile:
# their input_bytes_read and source_bytes_hashed must be those of one file at a time too.
# Fails unless some run grouped, in both layouts, and some DCP run interleaved its units.
# usage: tests/group_identical.sh BFSHARD TMPDIR
. tests/same_output.sh
set -u
B=$1 T=$2 grouped=0 inter=0 n=0
# the input bytes a run read and hashed, from its --json
counts() { grep -o '"\(input_bytes_read\|source_bytes_hashed\)": [0-9]*' "$1" | tr '\n' ' '; }
mkdir -p "$T" || exit 1
for d in fixtures/*/; do
    [ -f "$d/config.json" ] || continue
    for W in 3 8; do
        for M in 1M 256M; do
            rm -rf "$T/a" "$T/b"
            BFSHARD_GROUP=1 "$B" convert "$d" "$T/a" --world-size $W --mem $M --device cpu -q --json >"$T/ja" 2>/dev/null
            ra=$?
            BFSHARD_WRITERS=$((W - 1)) BFSHARD_STAGES=1 "$B" convert "$d" "$T/b" --world-size $W --mem $M --device cpu -q \
                --json >"$T/jb" 2>"$T/stages"
            rb=$?
            same_output "$d W=$W --mem $M, one at a time then grouped" "$T/a" $ra "$T/b" $rb || continue
            if [ "$(counts "$T/ja")" != "$(counts "$T/jb")" ]; then
                echo "$d W=$W --mem $M: one at a time $(counts "$T/ja"), grouped $(counts "$T/jb")"
                exit 1
            fi
            grep -q '"group": [2-9]' "$T/stages" && grouped=$((grouped + 1))
            grep -q '"units_interleaved": [1-9]' "$T/stages" && inter=$((inter + 1))
            n=$((n + 1))
        done
    done
done
hgrouped=0
for d in fixtures/*/; do
    [ -f "$d/config.json" ] || continue
    for M in 1M 256M; do
        rm -rf "$T/a" "$T/b"
        BFSHARD_GROUP=1 "$B" convert "$d" "$T/a" --layout hf --max-shard-size 64K --mem $M --device cpu -q 2>/dev/null
        ra=$?
        BFSHARD_WRITERS=2 BFSHARD_STAGES=1 "$B" convert "$d" "$T/b" --layout hf --max-shard-size 64K --mem $M --device cpu -q 2>"$T/stages"
        rb=$?
        same_output "$d --layout hf --max-shard-size 64K --mem $M, one at a time then interleaved" "$T/a" $ra "$T/b" $rb || continue
        grep -q '"group": [2-9]' "$T/stages" && hgrouped=$((hgrouped + 1))
        n=$((n + 1))
    done
done
echo "group_identical: $n runs identical, $grouped DCP runs grouped ($inter with units interleaved), $hgrouped HF runs interleaved"
[ $grouped -gt 0 ] && [ $inter -gt 0 ] && [ $hgrouped -gt 0 ]
