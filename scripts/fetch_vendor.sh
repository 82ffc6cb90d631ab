#!/usr/bin/env bash
# Fill vendor/llama.cpp from the pinned llama-cpp-python sdist and apply patches/*.patch in order.
# Idempotent: a stamp records the sdist hash and the patch-set hash; an unchanged pair does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

SDIST_VERSION=0.3.36
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
SDIST_DIR=.cache/sdist
SDIST="$SDIST_DIR/llama_cpp_python-$SDIST_VERSION.tar.gz"
PY=${PYTHON:-python3}

mkdir -p "$SDIST_DIR"
if [ ! -f "$SDIST" ] || ! echo "$SDIST_SHA256  $SDIST" | sha256sum -c --status; then
    rm -f "$SDIST"
    echo "fetching llama-cpp-python==$SDIST_VERSION sdist" >&2
    # --no-build-isolation skips building the sdist's metadata backend from scratch; we only want the archive.
    "$PY" -m pip download --quiet --no-deps --no-binary :all: --no-build-isolation \
        "llama-cpp-python==$SDIST_VERSION" -d "$SDIST_DIR" 2>/dev/null \
      || "$PY" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$SDIST_VERSION" -d "$SDIST_DIR"
fi
echo "$SDIST_SHA256  $SDIST" | sha256sum -c --status || { echo "sdist sha256 mismatch: $SDIST" >&2; exit 1; }

PATCH_HASH=$(cat patches/*.patch 2>/dev/null | sha256sum | cut -c1-16)
STAMP="$SDIST_SHA256-$PATCH_HASH"
if [ -f vendor/.stamp ] && [ "$(cat vendor/.stamp)" = "$STAMP" ] && [ -d vendor/llama.cpp/src ]; then
    exit 0
fi

echo "extracting vendor/llama.cpp and applying patches" >&2
rm -rf vendor/llama.cpp vendor/.stamp
mkdir -p vendor
tmp=$(mktemp -d)
tar xzf "$SDIST" -C "$tmp" "llama_cpp_python-$SDIST_VERSION/vendor/llama.cpp"
mv "$tmp/llama_cpp_python-$SDIST_VERSION/vendor/llama.cpp" vendor/llama.cpp
rm -rf "$tmp"
for p in patches/*.patch; do
    [ -f "$p" ] || continue
    echo "  applying $p" >&2
    patch -d vendor/llama.cpp -p1 --forward --quiet < "$p"
done
echo "$STAMP" > vendor/.stamp
