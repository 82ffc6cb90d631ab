#!/usr/bin/env bash
# Runs ON the device machine, from the repo root. Steps (one per call, the machine kept warm in between):
#   remote.sh start   unpack g1, start the CUDA build detached (survives the call), stash model part
#   remote.sh part N  stash model part from gN
#   remote.sh bench   wait for the build, assemble the model, run scripts/step_costs.py (batched and per-row
#                     greedy, patches/0003) and scripts/bench.py on the GPU, results to $OUT
#   remote.sh eval    the held-out drafter evaluation (scripts/eval_drafter.py), results to $OUT
set -euo pipefail
W=/root/pydflash-dev
mkdir -p $W
case "$1" in
start)
    cp .device-bench/g1/* $W/
    # the trained drafter travels in g1 (the working tree is capped at 64 MiB per call)
    [ -f $W/gemma-3-270m-dflash-q8_0.gguf ] && mkdir -p pydflash/models && cp $W/gemma-3-270m-dflash-q8_0.gguf pydflash/models/
    cd $W && mkdir -p site && tar xzf site.tgz -C site && tar xzf src.tgz
    # our patches are already applied in the carried vendor tree
    setsid nohup bash -c "cd $W/llama.cpp && cmake -S . -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
        > $W/configure.log 2>&1 && cmake --build build -j16 --target llama > $W/build.log 2>&1; echo \$? > $W/build.rc" \
        > /dev/null 2>&1 &
    echo started build; nvidia-smi --query-gpu=name,memory.total --format=csv ;;
part)
    cp .device-bench/g$2/part* $W/ && ls -la $W | tail -3 ;;
bench)
    for _ in $(seq 1 100); do [ -f $W/build.rc ] && break; sleep 5; done
    cat $W/build.rc; tail -3 $W/build.log
    cat $W/part* > $W/gemma.gguf && sha256sum $W/gemma.gguf | cut -c1-64 | diff - $W/model.sha256
    mkdir -p .cache/models pydflash/models && ln -sf $W/gemma.gguf .cache/models/gemma-3-270m-q4_k_m.gguf
    [ -f $W/gemma-3-270m-dflash-q8_0.gguf ] && cp $W/gemma-3-270m-dflash-q8_0.gguf pydflash/models/
    export PYTHONPATH=$W/site:$PWD PYDFLASH_LIB_DIR=$W/llama.cpp/build/bin PYTHONUNBUFFERED=1
    shift
    python3 scripts/step_costs.py --ngl -1 --out $OUT/step_costs_gpu.json
    PYDFLASH_PER_ROW_GREEDY=1 python3 scripts/step_costs.py --ngl -1 --out $OUT/step_costs_gpu_per_row.json
    python3 scripts/bench.py --ngl -1 --threads 8 --slots 1 --rounds 3 --tokens 512 --out $OUT/bench_gpu_c1.md "$@"
    python3 scripts/bench.py --ngl -1 --threads 8 --slots 8 --rounds 2 --tokens 128 --out $OUT/bench_gpu_c8.md "$@" ;;
eval)
    export PYTHONPATH=$W/site:$PWD PYDFLASH_LIB_DIR=$W/llama.cpp/build/bin PYTHONUNBUFFERED=1
    python3 scripts/eval_drafter.py --ngl -1 --threads 8 --n 40 --tokens 256 --out $OUT/drafter_eval_gpu.json ;;
esac
