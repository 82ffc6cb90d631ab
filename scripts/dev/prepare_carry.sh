#!/usr/bin/env bash
# Pack what a GPU run needs into .device-bench/ (git-ignored), one folder per device call. Each call sends the
# working tree too (tracked + untracked-not-ignored files: 61.2 MB with the drafter and the data runs of 2026-12-02,
# 58.2 MB once the data shards were repacked with LZMA) and the tool refuses more than 64 MiB in all, so the model
# parts are sized to what the tree leaves (4 MB at 61.2 MB: 64 part calls, ~5 s each; ~8 MB at 58.2 MB).
#   g0, g0b: the trimmed vendor/llama.cpp source in two halves (a call each: with the tree it would not fit g1's)
#   g1: pure-Python packages the device lacks (llama_cpp, gguf, diskcache)
#       + the commit at packing time (the tree itself travels with every call: name the commit again when you run)
#       + pristine.sha256: the sdist's own copies of the files patches/ touch (the pristine llama-server's check)
#   g1b: wheels for Python 3.12 of the server's stack (fastapi and its opentelemetry-api, starlette,
#       pydantic(-core), uvicorn, sse-starlette, annotated-types, typing-inspection, typing_extensions), staged by
#       a call of their own (`part 1b`) since the 61 MB tree of 2026-12-02 no longer fits beside them and g1
#   g2..gN: the Gemma-3-270M GGUF in parts
#   gc0, gc1: the drafter's prompt corpus for `remote.sh gen` in two halves (the pinned build: see the end)
set -euo pipefail
cd "$(dirname "$0")/../.."
halves() {  # FILE DIR_A DIR_B SHA_FILE: FILE's two halves as DIR_A/NAME.00 and DIR_B/NAME.01, its sha256 in SHA_FILE
    sha256sum "$1" | cut -d' ' -f1 > "$4"
    split -n 2 -d -a 2 "$1" "$2/$(basename "$1")." && mv "$2/$(basename "$1").01" "$3/" && rm "$1"
}
# SLIM=1: the drafter's safetensors (21.8 MB) and the data runs (10.9 MB) leave the working tree, so the tree that
# travels with every call is ~42 MB and the model goes in ~11 parts of ~24 MB (each call ~5 s of device time). Since
# the shipped GGUF carries its own head (37.8 MB, 2026-12-03) the whole tree is ~75 MB, over one call's 64 MiB: every
# session packs with SLIM=1. Only `train`, `trainbg` and a retrained drafter's export read the two; they travel as
# folders of their own (gt0: the safetensors, gt1: the data runs; `remote.sh part t0`, `part t1`). Both are tracked
# and unchanged: `git checkout` puts them back after the device calls.
SAFETENSORS=pydflash/models/gemma-3-270m-dflash.safetensors
DATA_RUNS=pydflash/train/gguf_data
SITE=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
# everything but the prebuilt build packs (gbp*, gbq*: scripts/dev/store_build.sh), which stay valid while the
# source packed below is byte for byte the same
mkdir -p .device-bench && find .device-bench -mindepth 1 -maxdepth 1 ! -name 'gbp*' ! -name 'gbq*' -exec rm -rf {} +
mkdir -p .device-bench/g0 .device-bench/g0b .device-bench/g1 .device-bench/g1b/whl
if [ "${SLIM:-0}" = 1 ] && [ -f $SAFETENSORS ]; then
    git diff --quiet HEAD -- $SAFETENSORS $DATA_RUNS \
        || { echo "prepare_carry: $SAFETENSORS or $DATA_RUNS differs from HEAD: not removed" >&2; exit 1; }
    mkdir -p .device-bench/gt0 .device-bench/gt1
    mv $SAFETENSORS .device-bench/gt0/
    tar cf .device-bench/gt1/gguf_data.tar -C pydflash/train gguf_data && rm -r $DATA_RUNS
    echo "prepare_carry: $SAFETENSORS and $DATA_RUNS left the tree for the device calls; afterwards:" \
        "git checkout -- $SAFETENSORS $DATA_RUNS"
fi
# ggml backends the CUDA build does not enable (ggml_add_backend adds a directory only when its GGML_<NAME> is on),
# the tests (-DLLAMA_BUILD_TESTS=OFF), the examples (-DLLAMA_BUILD_EXAMPLES=OFF), the Python converters and the web
# UI's sources (scripts/ui-assets.cmake reads them only for an npm build, and the build embeds no UI): the tree grows
# with every data run, and the source must still fit one call beside it
SKIP_BACKENDS=$(printf -- "--exclude=llama.cpp/ggml/src/ggml-%s " \
    opencl vulkan hexagon sycl metal et webgpu openvino cann virtgpu zdnn)
# byte for byte the same from the same source (names sorted, times, owners and gzip's header fixed): its sha256 is
# part of the prebuilt packs' key (remote.sh build_key), which a new pack of the same source must not change
tar cf - --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
    --exclude='llama.cpp/models' --exclude='llama.cpp/docs' --exclude='llama.cpp/benches' \
    --exclude='llama.cpp/media' --exclude='*.png' --exclude='llama.cpp/tools/ui/node_modules' \
    --exclude='llama.cpp/tests' --exclude='llama.cpp/gguf-py' --exclude='llama.cpp/conversion' $SKIP_BACKENDS \
    --exclude='llama.cpp/examples' \
    --exclude='llama.cpp/tools/ui/src' --exclude='llama.cpp/tools/ui/static' --exclude='llama.cpp/tools/ui/tests' \
    -C vendor llama.cpp | gzip -n > .device-bench/g0/src.tgz
# in two halves, one call each (g0, g0b): the tree grows by ~1.5 MB with every data run and the whole source would
# stop fitting one call beside it; `start` joins them and checks the sha
halves .device-bench/g0/src.tgz .device-bench/g0 .device-bench/g0b .device-bench/g1/src.sha256
# `remote.sh start` reverts patches/ in a copy of that source for a pristine llama-server (the native baseline of
# scripts/bench/http_vs_native.py --defaults) and checks the files they touch against the sdist's own
SDIST_VERSION=$(sed -n 's/^SDIST_VERSION=//p' scripts/fetch_vendor.sh)
PATCHED=$(grep -h '^+++ b/' patches/*.patch | cut -c7- | cut -f1 | sort -u)
tmp=$(mktemp -d)
tar xzf .cache/sdist/llama_cpp_python-$SDIST_VERSION.tar.gz -C "$tmp" \
    $(printf "llama_cpp_python-$SDIST_VERSION/vendor/llama.cpp/%s " $PATCHED)
(cd "$tmp/llama_cpp_python-$SDIST_VERSION/vendor/llama.cpp" && sha256sum $PATCHED) > .device-bench/g1/pristine.sha256
rm -rf "$tmp"
tar czf .device-bench/g1/site.tgz -C "$SITE" llama_cpp gguf diskcache
# the versions of the local venv, as Python 3.12 wheels (the device image has no registry; README of the tool)
WHEELS=$(.venv/bin/python - <<'PY'
from importlib.metadata import version
names = ["fastapi", "opentelemetry-api", "starlette", "pydantic", "pydantic_core", "uvicorn", "sse-starlette", "annotated-types",
         "typing-inspection", "typing_extensions"]
print(" ".join(f"{n}=={version(n)}" for n in names))
PY
)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .device-bench/g1b/whl $WHEELS 2>&1 | grep -v '^WARNING: Location' || true
echo "$(git rev-parse --short HEAD)$(git status --porcelain --untracked-files=no | grep -q . && echo ' (+ uncommitted changes)')" \
    > .device-bench/g1/commit.txt
MODEL=$(.venv/bin/python -c "from pydflash.defaults import gemma_target; print(gemma_target())")
# (a tracked file removed from the working tree, as SLIM=1 does, does not travel: stat skips it)
TREE=$( { git ls-files -co --exclude-standard -z | xargs -0 stat -c %s 2>/dev/null || true; } | awk '{s += $1} END {print s}')
PART=$(( (64 * 1048576 - TREE - 1000000) / 1000000 * 1000000 ))  # 1 MB of slack for files that appear meanwhile
echo "tree ${TREE} bytes: model parts of ${PART} bytes"
split -b $PART -d -a 2 "$MODEL" .device-bench/part
i=2
for p in .device-bench/part*; do mkdir -p .device-bench/g$i; mv "$p" .device-bench/g$i/; i=$((i + 1)); done
sha256sum "$MODEL" | cut -d' ' -f1 > .device-bench/g1/model.sha256
# every call carries the tree plus one folder (g1 also head.tgz, ~3 MB): refuse here what the tool would refuse
# there, before a batch of calls runs without its first (the tool does not run a call over the limit)
for g in .device-bench/g*; do
    extra=$(du -sb "$g" | cut -f1); [ "$g" = .device-bench/g1 ] && extra=$((extra + 3000000))
    if [ $((TREE + extra)) -gt $((64 * 1048576)) ]; then
        echo "prepare_carry: the tree (${TREE} bytes) and $g ($extra bytes) exceed one call's 64 MiB" >&2; exit 1
    fi
done
du -sh .device-bench/* .device-bench/g1/*
# NO_CORPUS=1: a session that generates no data skips the corpus (most of this script's ~4.5 min)
[ "${NO_CORPUS:-0}" = 1 ] && exit 0
# The gen prompts: the drafter's corpus, whose line ranges earlier runs already used (docs/drafter.md). It samples code
# from vendor/llama.cpp too, so a new patch changes it: the pinned corpus (sha256 4a6809dd..., the 2026-12-01 runs) was
# built with patches up to 0005, and is rebuilt here with any later ones reverted while it reads the source.
LATER=$(ls -r patches/*.patch | awk -F/ '$2 >= "0006"')
for p in $LATER; do patch -R -d vendor/llama.cpp -p1 --quiet < "$p"; done
# CORPUS_SEED=1 carries a second corpus instead (seed 1, built without any prompt of the first: sha256 1b3d2a6f...),
# for the runs after the first's line ranges are used up (docs/drafter.md lists them); its lines count from 0 again.
.venv/bin/python -m pydflash.train.corpus --n 60000 --seed 0 --out .device-bench/corpus/prompts.jsonl.gz || rc=$?
if [ "${CORPUS_SEED:-0}" != 0 ] && [ "${rc:-0}" = 0 ]; then
    mv .device-bench/corpus/prompts.jsonl.gz .device-bench/corpus/seed0.jsonl.gz
    .venv/bin/python -m pydflash.train.corpus --n 60000 --seed 1 --exclude .device-bench/corpus/seed0.jsonl.gz \
        --out .device-bench/corpus/prompts.jsonl.gz || rc=$?
fi
# CORPUS_SEED=2 or more: that seed, without the prompts of this tree's seed-0 and seed-1 builds, and without any
# prompt that committed data already answered (pydflash/train/dedup.py: the corpus follows this machine's files, so
# neither earlier build can be trusted to be the pinned one); no pin: its sha256 goes with the data it makes
if [ "${CORPUS_SEED:-0}" -ge 2 ] && [ "${rc:-0}" = 0 ]; then
    mv .device-bench/corpus/prompts.jsonl.gz .device-bench/corpus/seed1.jsonl.gz
    # --copy-once: 30 % of the repetition prompts are a passage, a cue and its opening (docs/drafter.md)
    .venv/bin/python -m pydflash.train.corpus --n 66000 --seed $CORPUS_SEED --copy-once \
        --out .device-bench/corpus/all.jsonl.gz \
        --exclude .device-bench/corpus/seed0.jsonl.gz --exclude .device-bench/corpus/seed1.jsonl.gz || rc=$?
    [ "${rc:-0}" = 0 ] && { .venv/bin/python -m pydflash.train.dedup --corpus .device-bench/corpus/all.jsonl.gz \
        --data pydflash/train/gguf_data --out .device-bench/corpus/prompts.jsonl.gz || rc=$?; }
    rm -f .device-bench/corpus/seed0.jsonl.gz .device-bench/corpus/seed1.jsonl.gz .device-bench/corpus/all.jsonl.gz
fi
for p in $(echo "$LATER" | sort); do patch -d vendor/llama.cpp -p1 --quiet < "$p"; done
[ "${rc:-0}" = 0 ]
if [ "${CORPUS_SEED:-0}" -ge 2 ]; then
    sha256sum .device-bench/corpus/prompts.jsonl.gz
elif [ "${CORPUS_SEED:-0}" = 1 ]; then
    # the seed-1 corpus's own sha pins it (the seed-0 build is only its exclusion list). The seed-0 build of this
    # tree no longer matches 4a6809dd... (2026-12-02: 217f74e2...) while seed 1 still matches: recorded in
    # docs/drafter.md, not a reason to refuse the seed-1 corpus
    rm .device-bench/corpus/seed0.jsonl.gz
    sha256sum .device-bench/corpus/prompts.jsonl.gz | grep -q '^1b3d2a6f43ee2338' \
        || { echo "prepare_carry: the seed-1 corpus is not the pinned one (1b3d2a6f...)" >&2; exit 1; }
else
    sha256sum .device-bench/corpus/prompts.jsonl.gz | grep -q '^4a6809ddc5bedcc5' \
        || { echo "prepare_carry: the corpus is not the pinned one (sha256 4a6809dd...)" >&2; exit 1; }
fi
# The tree (~60 MB) and the whole corpus (8.1 MB) no longer fit one call (the 2026-12-01 session's gen call was refused):
# it travels in two halves, staged like the model parts (part c0, part c1), and `gen` joins them
mkdir -p .device-bench/gc0 .device-bench/gc1
halves .device-bench/corpus/prompts.jsonl.gz .device-bench/gc0 .device-bench/gc1 .device-bench/g1/corpus.sha256
rm -r .device-bench/corpus
