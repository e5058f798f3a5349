#!/usr/bin/env python3
"""A part manifest's share of tensors[] (docs/MANIFEST.md "Parts and merge"), for
tests/test_manifest_v2.c:

  check WHOLE_MANIFEST W PART...   each part's tensors[] is its ranks' share of the whole run's,
                                   element for element, byte for byte, and the shares cover it
  oldstyle PART WHOLE_MANIFEST     rewrite PART as a bfshard before shares wrote it: every
                                   tensor (the whole run's bytes), no part.tensors_total; resealed
  drop PART                        remove PART's last tensor; resealed

Edits are made on the bytes, so the rest of the file stays as bfshard wrote it."""
import json
import re
import subprocess
import sys

SEAL = b'"manifest_xxh3_128": "'


def array_span(b):
    """(start, end) of the tensors array's bytes in the manifest b: "[...]" """
    k = b.index(b'\n "tensors": ') + len(b'\n "tensors": ')
    if b.startswith(b"[]", k):
        return k, k + 2
    return k, b.index(b"\n ]", k) + 3


def elements(b):
    a, e = array_span(b)
    body = b[a + 1:e - 1].strip()
    return [x.strip().rstrip(b",") for x in body.split(b"\n")] if body else []


def reseal(path, b):
    i = b.rindex(SEAL) + len(SEAL)
    b = b[:i] + b"0" * 32 + b[i + 32:]
    h = subprocess.run(["xxh128sum"], input=b, capture_output=True, check=True).stdout.split()[0]
    open(path, "wb").write(b[:i] + h + b[i + 32:])


def ranks(spec):
    out = []
    for r in spec.split(","):
        lo, _, hi = r.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def main():
    cmd = sys.argv[1]
    if cmd == "check":
        whole = elements(open(sys.argv[2], "rb").read())
        W, T, seen = int(sys.argv[3]), len(whole), []
        for p in sys.argv[4:]:
            b = open(p, "rb").read()
            part = json.loads(b)["part"]
            assert part["tensors_total"] == T, (p, part, T)
            want = [i for r in ranks(part["ranks"]) for i in range(T * r // W, T * (r + 1) // W)]
            got = elements(b)
            assert got == [whole[i] for i in want], f"{p}: not its ranks' share of tensors[]"
            seen += want
        assert sorted(seen) == list(range(T)), "the shares do not cover tensors[] once"
    elif cmd == "oldstyle":
        p, b, w = sys.argv[2], open(sys.argv[2], "rb").read(), open(sys.argv[3], "rb").read()
        a, e = array_span(b)
        wa, we = array_span(w)
        b = b[:a] + w[wa:we] + b[e:]
        b, n = re.subn(rb',\n  "tensors_total": \d+', b"", b)
        assert n == 1
        reseal(p, b)
    elif cmd == "drop":
        p, b = sys.argv[2], open(sys.argv[2], "rb").read()
        a, e = array_span(b)
        els = elements(b)
        assert els, "nothing to drop"
        arr = b"[\n  " + b",\n  ".join(els[:-1]) + b"\n ]" if len(els) > 1 else b"[]"
        reseal(p, b[:a] + arr + b[e:])
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
