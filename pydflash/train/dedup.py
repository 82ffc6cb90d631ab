"""Drop from a prompt corpus every prompt that committed data already answered (pydflash/train/gguf_data).

The corpus is cut from this machine's files (``corpus_sources.py``), so a build on another machine, or after a setup
resolved other package versions, is not the pinned one: its line ranges no longer name the prompts earlier runs used
(docs/drafter.md). What does not change is the committed data: each row keeps its prompt's token ids. A prompt is a
duplicate when it tokenizes (``generate.prompt_tokens``) to the ids of a committed row's prompt.

    python -m pydflash.train.dedup --corpus IN.jsonl.gz --data pydflash/train/gguf_data --out OUT.jsonl.gz
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import sys

import numpy as np

from .generate import load_shards, prompt_tokens


def answered(root: str) -> set[bytes]:
    """Digests of the prompt token ids of every row in the shard folders under root."""
    out = set()
    for d, _, files in sorted(os.walk(root)):
        if not any(f.startswith("shard-") and f.endswith(".npz") for f in files):
            continue
        data = load_shards(d)
        for s, p in zip(data["starts"], data["prompt_len"]):
            out.add(digest(data["tokens"][s:s + p]))
    return out


def digest(tokens) -> bytes:
    return hashlib.blake2b(np.asarray(tokens, dtype=np.int32).tobytes(), digest_size=16).digest()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--data", required=True, help="folder whose shard folders (any depth) hold the committed data")
    ap.add_argument("--out", required=True)
    ap.add_argument("--target", default="", help="the Gemma GGUF whose tokenizer generate.py uses (default: ours)")
    a = ap.parse_args(argv)
    from ..defaults import gemma_target
    from ..native import Model

    seen = answered(a.data)
    model = Model(a.target or gemma_target())
    kept = dropped = 0
    try:
        with gzip.open(a.corpus, "rt", encoding="utf-8") as src, gzip.open(a.out, "wt", encoding="utf-8") as dst:
            for line in src:
                p = json.loads(line)
                if digest(prompt_tokens(model, p)) in seen:
                    dropped += 1
                    continue
                dst.write(line)
                kept += 1
    finally:
        model.close()
    print(json.dumps({"answered_rows": len(seen), "kept": kept, "dropped": dropped}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
