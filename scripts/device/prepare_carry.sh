#!/usr/bin/env bash
# Pack what a GPU run needs into .device-bench/ (git-ignored), in <= 60 MB folders, one per device call:
#   g1: trimmed vendor/llama.cpp source + pure-Python packages the device lacks (llama_cpp, gguf, diskcache)
#       + wheels for Python 3.12 of the server's stack (fastapi, starlette, pydantic(-core), uvicorn, sse-starlette,
#       annotated-types, typing-inspection, typing_extensions) + the last, small model part + the tree's commit
#   g2..g6: the Gemma-3-270M GGUF in ~50 MB parts
set -euo pipefail
cd "$(dirname "$0")/../.."
SITE=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
rm -rf .device-bench && mkdir -p .device-bench/g1/whl
tar czf .device-bench/g1/src.tgz --exclude='llama.cpp/models' --exclude='llama.cpp/docs' --exclude='llama.cpp/benches' \
    --exclude='llama.cpp/media' --exclude='*.png' --exclude='llama.cpp/tools/ui/node_modules' -C vendor llama.cpp
tar czf .device-bench/g1/site.tgz -C "$SITE" llama_cpp gguf diskcache
# the versions of the local venv, as Python 3.12 wheels (the device image has no registry; README of the tool)
WHEELS=$(.venv/bin/python - <<'PY'
from importlib.metadata import version
names = ["fastapi", "starlette", "pydantic", "pydantic_core", "uvicorn", "sse-starlette", "annotated-types",
         "typing-inspection", "typing_extensions"]
print(" ".join(f"{n}=={version(n)}" for n in names))
PY
)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .device-bench/g1/whl $WHEELS 2>&1 | grep -v '^WARNING: Location' || true
echo "$(git rev-parse --short HEAD)$(git status --porcelain --untracked-files=no | grep -q . && echo ' (+ uncommitted changes)')" \
    > .device-bench/g1/commit.txt
MODEL=$(.venv/bin/python -c "from pydflash.defaults import gemma_target; print(gemma_target())")
split -b 50000000 -d -a 1 "$MODEL" .device-bench/part
i=2
for p in .device-bench/part*; do
    if [ "$(stat -c %s "$p")" -lt 10000000 ]; then mv "$p" .device-bench/g1/; continue; fi  # the small tail rides in g1
    mkdir -p .device-bench/g$i; mv "$p" .device-bench/g$i/; i=$((i + 1))
done
sha256sum "$MODEL" | cut -d' ' -f1 > .device-bench/g1/model.sha256
du -sh .device-bench/* .device-bench/g1/*
