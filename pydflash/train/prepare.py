"""Stage 1 (CPU): tokenize the offline corpus into fixed-length prompts.

    python -m pydflash.train.prepare --gguf TARGET.gguf --out prompts.npz

Tokenization uses llama.cpp's own tokenizer (vocab-only load of the target GGUF), so prompt ids are
exactly what pydflash will feed the target.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from . import data


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--per-file", type=int, default=4)
    ap.add_argument("--max-files", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)

    from .llamacpp_ref import LlamaRef

    ref = LlamaRef(a.gguf, vocab_only=True)
    t0 = time.time()
    arrays = data.build(ref.tokenize, bos=2, prompt_len=a.prompt_len, per_file=a.per_file,
                        max_files=a.max_files, seed=a.seed)
    meta = {k: int(v.shape[0]) for k, v in arrays.items()}
    meta.update(prompt_len=a.prompt_len, seconds=round(time.time() - t0, 1))
    print(json.dumps(meta))
    np.savez_compressed(a.out, meta=json.dumps(meta), **arrays)


if __name__ == "__main__":
    main()
