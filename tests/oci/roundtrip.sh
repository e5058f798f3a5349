#!/bin/sh
# tests/oci/roundtrip.sh BUILD — `make test-oci`: a bfshard artifact through a
# real OCI registry and back, with stock tools only.
#
#   convert three fixtures (one with --sha256, one without: pack hashes it) -> bfshard pack
#   -> the config validated against ModelPack's JSON schema (tests/oci/) -> Debian's
#   docker-registry on 127.0.0.1:<free port>, filesystem storage in a temp dir (a config
#   file) -> skopeo copy --preserve-digests oci:DIR:TAG docker://... -> the registry's
#   manifest digest is pack's -> skopeo copy back into a new OCI layout -> bfshard verify
#   of it -> the files rebuilt from the layers (org.cncf.model.filepath) -> byte-identical
#   to the OUTDIR, `bfshard verify` and `sha256sum -c sha256sums.txt` pass there.
#
# Installs docker-registry, skopeo and python3-jsonschema with apt when missing; skips
# (loudly, exit 0) only when apt cannot install them.
set -eu
B=${1:-build}
BF=$(cd "$B" && pwd)/bfshard
cd "$(dirname "$0")/../.."
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3

need=""
command -v skopeo >/dev/null 2>&1 || need="$need skopeo"
command -v docker-registry >/dev/null 2>&1 || need="$need docker-registry"
"$PY" -c 'import jsonschema' >/dev/null 2>&1 || need="$need python3-jsonschema"
if [ -n "$need" ]; then
    echo "test-oci: installing$need" >&2
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq >&2 || true
    if ! $SUDO apt-get install -y -qq $need >&2; then
        echo "test-oci: SKIP: apt cannot install$need here: the registry round trip did NOT run" >&2
        exit 0
    fi
fi

T=$(mktemp -d "${TMPDIR:-/tmp}/bfs-oci.XXXXXX")
REG_PID=""
cleanup() {
    rc=$?
    if [ -n "$REG_PID" ]; then kill "$REG_PID" 2>/dev/null || true; wait "$REG_PID" 2>/dev/null || true; fi
    rm -rf "$T"
    exit $rc
}
trap cleanup EXIT INT TERM

PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat > "$T/registry.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $T/registry
http:
  addr: 127.0.0.1:$PORT
EOF
docker-registry serve "$T/registry.yml" > "$T/registry.log" 2>&1 &
REG_PID=$!
"$PY" - "$PORT" <<'EOF'
import sys, time, urllib.request
for _ in range(100):
    try:
        urllib.request.urlopen("http://127.0.0.1:%s/v2/" % sys.argv[1], timeout=1)
        sys.exit(0)
    except Exception:
        time.sleep(0.1)
sys.exit("test-oci: the registry did not answer on 127.0.0.1:%s" % sys.argv[1])
EOF
REG=127.0.0.1:$PORT
echo "test-oci: docker-registry $(docker-registry --version 2>&1 | awk '{print $NF}') on $REG, skopeo $(skopeo --version | awk '{print $NF}')"

# one fixture through the registry and back: NAME FIXTURE CONVERT-OPTIONS...
roundtrip() {
    n=$1; fx=$2; shift 2
    out=$T/$n-out; oci=$T/$n-oci; back=$T/$n-back; files=$T/$n-files
    "$BF" convert "$fx" "$out" --device cpu --quiet "$@"
    "$BF" pack "$out" "$oci" --tag t1 --quiet --json > "$T/$n-pack.json"
    digest=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["manifest_digest"])' "$T/$n-pack.json")
    "$BF" verify "$oci" --quiet
    # the config against ModelPack's own JSON schema (vendored: tests/oci/README.md)
    "$PY" - "$oci" tests/oci/modelpack-config-schema.json "$n" <<'EOF'
import json, sys
from jsonschema import Draft202012Validator
oci, schema = sys.argv[1], json.load(open(sys.argv[2]))
idx = json.load(open(oci + "/index.json"))
man = json.load(open(oci + "/blobs/sha256/" + idx["manifests"][0]["digest"][7:]))
cfg = json.load(open(oci + "/blobs/sha256/" + man["config"]["digest"][7:]))
Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER).validate(cfg)
assert man["artifactType"] == "application/vnd.cncf.model.manifest.v1+json", man["artifactType"]
paths = [l["annotations"]["org.cncf.model.filepath"] for l in man["layers"]]
assert paths == sorted(paths), paths
assert cfg["modelfs"]["diffIds"] == [l["digest"] for l in man["layers"]]
mt = {l["annotations"]["org.cncf.model.filepath"]: l["mediaType"] for l in man["layers"]}
DOC, CODE = "application/vnd.cncf.model.doc.v1.raw", "application/vnd.cncf.model.code.v1.raw"
for p, t in mt.items():  # the license and card as doc layers, the remote code as code layers
    assert (t == DOC) == (p.split(".")[0].upper() in ("LICENSE", "README", "NOTICE", "USE_POLICY")), (p, t)
    assert (t == CODE) == p.endswith(".py"), (p, t)
if sys.argv[3] == "kimi":
    assert [p for p in mt if mt[p] == DOC] == ["LICENSE", "README.md"], mt
    assert [p for p in mt if mt[p] == CODE] == ["configuration_deepseek.py", "modeling_deepseek.py",
                                                "tokenization_kimi.py"], mt
EOF
    skopeo copy --quiet --preserve-digests --dest-tls-verify=false "oci:$oci:t1" "docker://$REG/bfshard/$n:t1"
    remote=$(skopeo inspect --raw --tls-verify=false "docker://$REG/bfshard/$n:t1" | sha256sum | cut -d' ' -f1)
    [ "sha256:$remote" = "$digest" ] || { echo "test-oci: $n: the registry's manifest is sha256:$remote, pack wrote $digest" >&2; exit 1; }
    skopeo copy --quiet --preserve-digests --src-tls-verify=false "docker://$REG/bfshard/$n:t1" "oci:$back:t1"
    "$BF" verify "$back" --quiet
    # the files, rebuilt from the pulled layers
    "$PY" - "$back" "$files" "$digest" <<'EOF'
import json, os, shutil, sys
back, files, digest = sys.argv[1:4]
idx = json.load(open(back + "/index.json"))
m = [d for d in idx["manifests"] if d.get("annotations", {}).get("org.opencontainers.image.ref.name") == "t1"]
assert len(m) == 1 and m[0]["digest"] == digest, (m, digest)
man = json.load(open(back + "/blobs/sha256/" + digest[7:]))
os.makedirs(files)
for l in man["layers"]:
    p = l["annotations"]["org.cncf.model.filepath"]
    assert "/" not in p and not p.startswith(".")
    shutil.copyfile(back + "/blobs/sha256/" + l["digest"][7:], os.path.join(files, p))
EOF
    "$BF" verify "$files" --quiet
    for f in "$out"/*; do
        cmp -s "$f" "$files/$(basename "$f")" || { echo "test-oci: $n: $(basename "$f") differs after the round trip" >&2; exit 1; }
    done
    [ "$(ls "$out" | wc -l)" = "$(ls "$files" | wc -l)" ] || { echo "test-oci: $n: other files after the round trip" >&2; exit 1; }
    if [ -f "$files/sha256sums.txt" ]; then (cd "$files" && sha256sum --quiet -c sha256sums.txt); fi
    echo "test-oci: $n: pushed, pulled and rebuilt byte for byte, manifest $digest unchanged"
}

roundtrip mxfp4 fixtures/mxfp4-tiny --world-size 3 --sha256
roundtrip nf4 fixtures/bnb-nf4 --world-size 2
roundtrip kimi fixtures/kimi-k2-tiny --world-size 2   # license and card: doc layers; remote code: code layers
echo "test-oci: OK"
