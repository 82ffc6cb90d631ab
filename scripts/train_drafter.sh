#!/usr/bin/env bash
# Train the DFlash drafter for Gemma-3-270M Q4_K_M end to end on one GPU, then export it.
#
#   scripts/train_drafter.sh TARGET.gguf OUTDIR [extra pipeline args...]
#
# Stages: 1. prompts from local text (CPU, llama.cpp tokenizer; skipped if OUTDIR/prompts.npz exists)
#         2. target responses + features, drafter training, held-out evaluation, safetensors export (GPU)
#         3. GGUF export in llama.cpp's dflash layout (Q8_0 and F16)
# Needs: pip install -e .[train]  (torch), gguf, safetensors; stage 1 needs our libllama (make setup).
set -euo pipefail
TARGET=${1:?target gguf}
OUT=${2:?output dir}
shift 2
PY=${PYTHON:-python3}
mkdir -p "$OUT"
if [ ! -f "$OUT/prompts.npz" ]; then
  $PY -m pydflash.train.prepare --gguf "$TARGET" --out "$OUT/prompts.npz"
fi
$PY -m pydflash.train.pipeline --gguf "$TARGET" --prompts "$OUT/prompts.npz" --out "$OUT" \
  --gen-seconds "${GEN_SECONDS:-100}" --train-seconds "${TRAIN_SECONDS:-450}" "$@"
$PY -m pydflash.train.export_gguf --drafter "$OUT" --target "$TARGET" --out "$OUT/drafter-q8_0.gguf" --type q8_0
$PY -m pydflash.train.export_gguf --drafter "$OUT" --target "$TARGET" --out "$OUT/drafter-f16.gguf" --type f16
# the shipped form: its own lm_head of the ids the committed data runs use most (docs/drafter.md, 2026-12-03)
$PY scripts/reduce_drafter_head.py --drafter "$OUT/drafter-q8_0.gguf" --target "$TARGET" --out "$OUT/drafter-head-q8_0.gguf"
