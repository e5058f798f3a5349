# Sourced by the tests that run bfshard twice and want the same result (group_identical.sh,
# ring_identical.sh): same_output WHAT DIR_A EXIT_A DIR_B EXIT_B exits 1 with a message when
# the exits differ or both succeeded with different files; returns 0 when both succeeded
# alike, 1 when both failed alike (nothing to compare).
same_output() {
    if [ "$3" -ne "$5" ]; then echo "$1: exit $3, then $5"; exit 1; fi
    [ "$3" -eq 0 ] || return 1
    diff -r "$2" "$4" >/dev/null || { echo "$1: the outputs differ"; diff -r "$2" "$4" | head -5; exit 1; }
    return 0
}
