"""Acceptance of a drafter through pydflash on the held-out prompts (never trained on), split into code and prose.

    .venv/bin/python scripts/eval_drafter.py [--n 40] [--tokens 256] [--ngl 0] [--out docs/drafter_eval_cpu.json]

The prompts are the first `prompt_len` tokens of each row of pydflash/train/heldout_eval.npz; generation is greedy
with the trained block (15 drafts per step), one request at a time. tau counts the bonus token.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import pydflash  # noqa: F401  (loads libllama before numpy)
import numpy as np

from pydflash import api
from pydflash.config import EngineConfig
from pydflash.defaults import SHIPPED_DRAFTER, gemma_target
from pydflash.engine.stats import Stats

HELDOUT = pathlib.Path(__file__).resolve().parents[1] / "pydflash" / "train" / "heldout_eval.npz"


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=40, help="prompts per split")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--ngl", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--drafter", default=str(SHIPPED_DRAFTER))
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    data = np.load(HELDOUT)
    p_len = int(data["prompt_len"])
    cfg = EngineConfig(n_ctx_slot=p_len + args.tokens + 32, n_gpu_layers=args.ngl, n_threads=args.threads)
    report = {"drafter": pathlib.Path(args.drafter).name, "tokens": args.tokens, "ngl": args.ngl}
    with api.load(gemma_target(), args.drafter, cfg) as llm:
        for split in ("code", "prose"):
            total = Stats()
            t0 = time.perf_counter()
            for row in data[f"{split}_tokens"][: args.n]:
                res = llm.generate([int(t) for t in row[:p_len]], max_tokens=args.tokens)
                total.merge_tokens(res.stats)
            d = total.as_dict()
            report[split] = {"prompts": args.n, "tau": d["mean_accept_len"], "accept_rate": d["accept_rate"],
                             "n_generated": d["n_generated"], "accept_by_position": d["accept_by_position"],
                             "wall_s": round(time.perf_counter() - t0, 1)}
            print(split, report[split], flush=True)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
