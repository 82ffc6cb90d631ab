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
from pydflash.engine.engine import Engine
from pydflash.engine.stats import Stats

HELDOUT = pathlib.Path(__file__).resolve().parents[1] / "pydflash" / "train" / "heldout_eval.npz"


def keep_last(window):
    """Engine._prefilled that, once a prompt is through, leaves the drafter only its last `window` positions (a
    restarted context): the rows before them are dropped and the drafter context restarts where the kept ones
    begin, as after a feature gap."""
    prefilled = Engine._prefilled

    def wrapped(self, slot, n, picks, rows, pos0):
        prefilled(self, slot, n, picks, rows, pos0)
        if not slot.prefilled or slot.n_past - window <= slot.drafter_base:
            return
        if slot.drafter_len > slot.drafter_base:  # part of the prompt is in the drafter KV: its rows are gone
            raise SystemExit("eval_restart_window: the prompt was injected in chunks; use prompts under n_batch")
        feats = np.concatenate([p.array() for p in slot.pending])
        pos = np.concatenate([p.positions for p in slot.pending])
        keep = pos >= slot.n_past - window
        self._restart_drafter(slot, int(pos[keep][0]))
        slot.add_features(feats[keep], pos[keep])

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
    original = Engine._prefilled
    with api.load(gemma_target(), SHIPPED_DRAFTER, cfg) as llm:
        for window in (None, 64, 32, 16):
            Engine._prefilled = original if window is None else keep_last(window)
            for split in ("code", "prose"):
                total = Stats()
                for row in data[f"{split}_tokens"][: args.n]:
                    total.merge_tokens(llm.generate([int(t) for t in row[:p_len]], max_tokens=args.tokens,
                                                      cache_prompt=False).stats)  # each window prefills anew
                key = f"{split}, {'full context' if window is None else f'last {window} positions'}"
                report[key] = round(total.mean_accept_len, 3)
                print(key, report[key], flush=True)
    Engine._prefilled = original
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
