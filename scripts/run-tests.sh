#!/bin/sh
# Runs every test binary given; fails when any fails. Usage: run-tests.sh BUILD BIN...
set -u
build=$1; shift
fail=0
for t in "$@"; do
    echo "== $t"
    if ! BFSHARD="$build/bfshard" "$t"; then
        echo "FAILED: $t"
        fail=1
    fi
done
[ $fail -eq 0 ] && echo "all tests passed" || echo "some tests FAILED"
exit $fail
