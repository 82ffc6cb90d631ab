#!/usr/bin/env bash
# Build the patched vendor/llama.cpp into .cache/native/<key>, where key hashes the sdist, the patch set and
# the CMake flags. An unchanged key rebuilds nothing. The build tree is keyed by flags only, so editing a patch
# recompiles just the files it touches.
#
#   PYDFLASH_CUDA=1            build with CUDA (-DGGML_CUDA=ON)
#   CUDA_ARCHS=90              CMAKE_CUDA_ARCHITECTURES when CUDA is on
#   PYDFLASH_NATIVE_TARGETS    extra CMake targets (e.g. "llama-quantize llama-speculative-simple llama-server")
# The RPC backend is always on (-DGGML_RPC=ON: pydflash --rpc places target layers on remote ggml-rpc-server
# processes) and ggml-rpc-server itself is built (small), so tests can start servers on loopback.
# Prints the install directory on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."

FLAGS="-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=ON -DGGML_NATIVE=ON -DGGML_RPC=ON"
# -march=native turns on AMX where the CPU advertises it, but some VMs advertise AMX without running it (ggml's
# q8_0 AMX kernel then dies with SIGILL on `tilezero`). Explicit -mno-* wins over -march=native in GCC and Clang.
# CMake takes them from CFLAGS/CXXFLAGS at configure time; they are part of FLAGS' hash below.
CFLAGS_EXTRA=""
if [ "${PYDFLASH_CUDA:-0}" != "1" ] && grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
    CFLAGS_EXTRA="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
if [ "${PYDFLASH_CUDA:-0}" = "1" ]; then
    FLAGS="$FLAGS -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHS:-90}"
fi
FLAGS_ID="$FLAGS $CFLAGS_EXTRA"
TARGETS="llama ggml-rpc-server ${PYDFLASH_NATIVE_TARGETS:-}"

FLAGS_HASH=$(echo "$FLAGS_ID" | sha256sum | cut -c1-12)
KEY=$( (cat vendor/.stamp; echo "$FLAGS_ID"; echo "$TARGETS") | sha256sum | cut -c1-16)
BUILD=.cache/build/$FLAGS_HASH
DEST=.cache/native/$KEY

if [ -f "$DEST/.complete" ]; then
    echo "$PWD/$DEST"
    exit 0
fi

JOBS=${JOBS:-$(nproc)}
mkdir -p .cache/build .cache/native
# Two setups at once (a shared tree) would build into the same tree: the second waits, then finds it done.
exec 9>"$BUILD.lock"
flock 9
if [ -f "$DEST/.complete" ]; then
    echo "$PWD/$DEST"
    exit 0
fi
echo "building llama.cpp ($FLAGS_ID) -> $DEST" >&2
CFLAGS="$CFLAGS_EXTRA" CXXFLAGS="$CFLAGS_EXTRA" cmake -S vendor/llama.cpp -B "$BUILD" $FLAGS >"$BUILD.configure.log" 2>&1 || { cat "$BUILD.configure.log" >&2; exit 1; }
cmake --build "$BUILD" -j "$JOBS" --target $TARGETS >"$BUILD.build.log" 2>&1 || { tail -50 "$BUILD.build.log" >&2; exit 1; }

rm -rf "$DEST"
mkdir -p "$DEST/lib" "$DEST/bin"
find "$BUILD/bin" "$BUILD" -maxdepth 3 -name '*.so*' -exec cp -P {} "$DEST/lib/" \; 2>/dev/null || true
for t in $TARGETS; do
    [ -x "$BUILD/bin/$t" ] && cp "$BUILD/bin/$t" "$DEST/bin/"
done
touch "$DEST/.complete"
# rename(2) swaps the link in one step: a process starting meanwhile sees the old build or the new, never none
ln -sfn "$KEY" .cache/native/current.tmp
mv -T .cache/native/current.tmp .cache/native/current
echo "$PWD/$DEST"
