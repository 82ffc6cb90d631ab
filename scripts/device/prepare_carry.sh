#!/usr/bin/env bash
# Pack what a GPU run needs into .device-bench/ (git-ignored), in <= 60 MB folders, one per device call:
#   g1: trimmed vendor/llama.cpp source + pure-Python packages the device lacks (llama_cpp, gguf, diskcache)
#   g2..g6: the Gemma-3-270M GGUF in ~50 MB parts
set -euo pipefail
cd "$(dirname "$0")/../.."
SITE=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
rm -rf .device-bench && mkdir -p .device-bench/g1
tar czf .device-bench/g1/src.tgz --exclude='llama.cpp/models' --exclude='llama.cpp/docs' --exclude='llama.cpp/benches' \
    --exclude='llama.cpp/media' --exclude='*.png' --exclude='llama.cpp/tools/ui/node_modules' -C vendor llama.cpp
tar czf .device-bench/g1/site.tgz -C "$SITE" llama_cpp gguf diskcache
MODEL=$(.venv/bin/python -c "from pydflash.defaults import gemma_target; print(gemma_target())")
split -b 50000000 -d -a 1 "$MODEL" .device-bench/part
i=2
for p in .device-bench/part*; do mkdir -p .device-bench/g$i; mv "$p" .device-bench/g$i/; i=$((i + 1)); done
sha256sum "$MODEL" | cut -d' ' -f1 > .device-bench/g1/model.sha256
du -sh .device-bench/*
