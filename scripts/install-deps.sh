#!/bin/sh
# Installs the Debian packages bfshard builds against, when they are missing.
# Quiet when everything is present. With --install, also what `make install` needs
# (scdoc renders the man page).
set -eu
need=""
if [ "${1:-}" = "--install" ]; then
    command -v scdoc >/dev/null 2>&1 || need="$need scdoc"
fi
have_hdr() { [ -f "/usr/include/$1" ]; }
have_hdr zstd.h || need="$need libzstd-dev"
have_hdr xxhash.h || need="$need libxxhash-dev"
have_hdr jansson.h || need="$need libjansson-dev"
have_hdr cmocka.h || need="$need libcmocka-dev"
# SHA-256 of every output file and OCI blob digests: OpenSSL's libcrypto
have_hdr openssl/evp.h || need="$need libssl-dev"
command -v xxh128sum >/dev/null 2>&1 || need="$need xxhash"
# the test suite checks our .zst files against the stock zstd CLI
command -v zstd >/dev/null 2>&1 || need="$need zstd"
command -v cc >/dev/null 2>&1 || need="$need build-essential"
command -v pkg-config >/dev/null 2>&1 || need="$need pkg-config"
# make test's layering check (dev/layers/check.py): python3 and nm (binutils)
command -v python3 >/dev/null 2>&1 || need="$need python3"
command -v nm >/dev/null 2>&1 || need="$need binutils"
[ -z "$need" ] && exit 0
echo "bfshard: installing missing Debian packages:$need" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >&2 || true
$SUDO apt-get install -y -qq $need >&2
