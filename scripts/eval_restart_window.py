"""Acceptance of the shipped drafter when its context holds only the last W prompt positions.

That is the drafter's state after a restart: adaptive drafting turns target features off while a slot is paused and
collects them again for adaptive.FEATURE_LEAD steps before each probe, so a probe drafts with a context of that many
positions. This measures what a short context costs: greedy tau (counting the bonus) over the held-out prompts,
with the full context and with W = 64, 32, 16, fixed 15-token blocks.

    .venv/bin/python scripts/eval_restart_window.py [--n 8] [--tokens 48] [--out docs/drafter_restart_window_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib

import pydflash  # noqa: F401  (loads libllama before numpy)
import numpy as np

from pydflash import api
from pydflash.config import EngineConfig
from pydflash.defaults import SHIPPED_DRAFTER, gemma_target
from pydflash.engine import verifier
from pydflash.engine.slot import FeatureRows
from pydflash.engine.stats import Stats

HELDOUT = pathlib.Path(__file__).resolve().parents[1] / "pydflash" / "train" / "heldout_eval.npz"


def keep_last(window):
    """Verifier.prefill that leaves the drafter only the last `window` prompt positions (a restarted context)."""
    prefill = verifier.Verifier.prefill

    def wrapped(self, slot, tokens):
        prefill(self, slot, tokens)
        rows = np.concatenate([p.rows for p in slot.pending])
        pos = np.concatenate([p.positions for p in slot.pending])
        keep = pos >= slot.n_past - window
        slot.restart_features(int(pos[keep][0]))
        slot.add_features(rows[keep], pos[keep])

    return wrapped


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8, help="prompts per split")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    data = np.load(HELDOUT)
    p_len = int(data["prompt_len"])
    cfg = EngineConfig(n_ctx_slot=p_len + args.tokens + 32, n_threads=args.threads, check_invariants=True)
    report = {"prompts_per_split": args.n, "tokens": args.tokens}
    original = verifier.Verifier.prefill
    with api.load(gemma_target(), SHIPPED_DRAFTER, cfg) as llm:
        for window in (None, 64, 32, 16):
            verifier.Verifier.prefill = original if window is None else keep_last(window)
            for split in ("code", "prose"):
                total = Stats()
                for row in data[f"{split}_tokens"][: args.n]:
                    total.merge_tokens(llm.generate([int(t) for t in row[:p_len]], max_tokens=args.tokens).stats)
                key = f"{split}, {'full context' if window is None else f'last {window} positions'}"
                report[key] = round(total.mean_accept_len, 3)
                print(key, report[key], flush=True)
    verifier.Verifier.prefill = original
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
