"""Give the shipped drafter its own reduced lm_head, chosen from what the target generates.

Why: the drafter borrows Gemma-3-270M's head, 262,144 x 640 in Q8_0 (178 MB read per block); on the H200 that head
was ~0.1 ms of every block (a 1-draft block 0.40 ms with it, 0.29 ms with a head of 28,672 rows; 15 drafts 0.69
against 0.59 ms, docs/drafter.md). The target's greedy responses in the committed data runs
(pydflash/train/gguf_data, 20 M tokens) use ~40 k distinct ids; a head of the ROWS ids most frequent there
(responses and prompts) keeps nearly all of them draftable, while verification stays the target's, so output is
unchanged (tests/compat/test_reduced_head.py). Lookup copies are not restricted by the head, so rare ids copied from the
prompt still go in.

    python scripts/reduce_drafter_head.py --drafter out/drafter-q8_0.gguf \
        --out pydflash/models/gemma-3-270m-dflash-q8_0.gguf

The shipped drafter was made so (2026-12-03, version 5's full-head GGUF, 28,672 rows, I32 d2t: 18.1 -> 37.7 MB,
sha256 a4521144...; the first build, I64 d2t, was dac923df...); a retrained drafter goes through it before it is
compared or shipped (remote.sh's export does).

It prints, per data run held out from the counts, the share of that run's response tokens outside the head (the
generalisation of the choice); the shipped head counts every run.
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import sys
from collections import Counter

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from pydflash.compat.gguf_meta import read_metadata  # noqa: E402
from pydflash.compat.reduced_head import D2T_TYPES, HEAD_TYPES, choose_tokens, write_reduced_head  # noqa: E402
from pydflash.defaults import gemma_target  # noqa: E402
from pydflash.train.generate import load_shards  # noqa: E402

DATA = os.path.join(ROOT, "pydflash", "train", "gguf_data")


def run_counts(folders: list[str], n_vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """(response counts, prompt counts) of one data run's shards."""
    data = load_shards(",".join(folders))
    resp = np.zeros(len(data["tokens"]), dtype=bool)
    for s, n, p in zip(data["starts"], data["lens"], data["prompt_len"]):
        resp[s + p:s + n] = True
    return (np.bincount(data["tokens"][resp], minlength=n_vocab),
            np.bincount(data["tokens"][~resp], minlength=n_vocab))


def eog_ids(meta) -> list[int]:
    """End-of-generation and turn-marker ids: a drafter must be able to propose the end of a reply."""
    types = meta.get("tokenizer.ggml.token_type") or []
    tokens = meta.get("tokenizer.ggml.tokens") or []
    ids = {int(meta.get(k)) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")
           if meta.get(k) is not None}
    ids |= {i for i, t in enumerate(tokens) if t in ("<start_of_turn>", "<end_of_turn>") and types[i] != 1}
    return sorted(ids)


def choose(counts: np.ndarray, rows: int, always: list[int]) -> list[int]:
    nonzero = np.flatnonzero(counts)
    return choose_tokens(Counter(dict(zip(nonzero.tolist(), counts[nonzero].tolist()))), rows, always)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=28672)
    ap.add_argument("--drafter", required=True,
                    help="a drafter that shares the target's head, as pydflash.train.export_gguf writes it")
    ap.add_argument("--target", default=None)
    ap.add_argument("--data", default=DATA, help="the data runs (folders of shard folders) whose ids are counted")
    ap.add_argument("--head-type", default="Q8_0", choices=sorted(HEAD_TYPES))
    ap.add_argument("--d2t-type", default="I32", choices=sorted(D2T_TYPES),
                    help="I32 (default): our llama.cpp's greedy picks skip the vocabulary scatter (patches/0011); "
                         "I64: what upstream llama.cpp reads")
    ap.add_argument("--out", required=True)
    ap.add_argument("--report", default=None, help="write the choice's figures as JSON here")
    args = ap.parse_args(argv)
    target = args.target or str(gemma_target())
    meta = read_metadata(target)
    n_vocab = len(meta.get("tokenizer.ggml.tokens"))
    runs = sorted(d for d in glob.glob(os.path.join(args.data, "*")) if os.path.isdir(d))
    folders = {r: sorted({os.path.dirname(p) for p in glob.glob(os.path.join(r, "*", "shard-*.npz"))}) for r in runs}
    per_run = {r: run_counts(f, n_vocab) for r, f in folders.items() if f}
    resp = sum(c[0] for c in per_run.values())
    # prompts weigh as much as responses: they are human text of the registers users send, and they widen the head
    # to words the responses of one corpus happen to lack (leaving each run out in turn: 0.84 % -> 0.75 % missed)
    score = resp + sum(c[1] for c in per_run.values())
    always = eog_ids(meta)
    report = {"rows": args.rows, "always": always, "response_tokens": int(resp.sum()),
              "distinct_ids": int((resp > 0).sum()), "held_out_miss": {}}
    for r, (rc, pc) in per_run.items():  # the choice's generalisation: one run left out of the counts at a time
        ids = np.asarray(choose(score - rc - pc, args.rows, always))
        report["held_out_miss"][os.path.basename(r)] = round(1 - float(rc[ids].sum()) / float(rc.sum()), 5)
    ids = choose(score, args.rows, always)
    report["in_sample_miss"] = round(1 - float(resp[ids].sum()) / float(resp.sum()), 5)
    write_reduced_head(args.drafter, target, ids, args.out, head_type=args.head_type, d2t_type=args.d2t_type)
    report["bytes"] = os.path.getsize(args.out)
    with open(args.out, "rb") as f:
        report["sha256"] = hashlib.file_digest(f, "sha256").hexdigest()
    print(json.dumps(report, indent=1))
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
