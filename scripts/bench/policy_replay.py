"""Adaptive drafting against the best fixed plan, replayed on the simulated machines of
tests/engine/test_adaptive.py: the H200 serving Gemma-3-270M (``GPU``, and ``LoadMachine`` as the issue's step split
had it) and a Qwen3-4B-shaped target on an H100 (``Qwen4BMachine``, whose verify is concave in its tokens).

    python scripts/bench/policy_replay.py --out docs/results/2026-12-07-cpu-f/policy_replay_after.json

The second table has requests of 128 tokens coming and going on the slots, each on a text drawn from a mix (each
draft accepted with the text's p), the policy told of each new request as the engine tells it
(``tests.engine.test_adaptive.replay_requests``): the policy's tokens per second over plain decoding's, worst, median
and mean over --mix-seeds seeds (which requests get which texts decides much: at 16 slots single seeds spread
1.00-1.2x). ``--ablate top_slots`` switches off the plans in which the likeliest slots draft alone, to show what they
bring.

For each machine, per-draft acceptance p (drafts accepted position by position) and slot count n, the policy runs
closed-loop for --steps steps from a cold start, seeing each new step shape's first 2 steps at 3x (graph
allocation, CUDA-graph capture) and every step's cost through lognormal noise (sigma --noise), as the engine sees
them. Reported per cell: the policy's tokens per second over the best plan in which every slot drafts one K or none
(the oracle's, computed from the machine's true costs), worst and median over the seeds, and that best plan over
plain decoding. A policy at 1.00 found the best uniform block; under 1.00 on a p whose best plan is plain decoding
it lost to plain.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import statistics
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from pydflash.engine import adaptive  # noqa: E402
from tests.engine.test_adaptive import (  # noqa: E402
    GPU, LoadMachine, Qwen4BMachine, best_uniform, plain_rate, rate_over_best, replay_requests)

MACHINES = {"gemma-h200": GPU, "gemma-h200-load": LoadMachine(), "qwen4b-h100": Qwen4BMachine()}
P_ACCEPT = (0.8, 0.6, 0.3, 0.0)
SLOTS = (1, 2, 4, 8, 16)
SKIP = 150  # steps left out of the rate: calibration and the first pauses
# (machine, texts' p, slots): half the requests on text the drafter suits, or a spread, and mixes it never suits
MIXES = (("gemma-h200", (0.95, 0.3), 4), ("gemma-h200", (0.95, 0.3), 8), ("gemma-h200", (0.95, 0.3), 16),
         ("gemma-h200", (0.9, 0.6, 0.2), 8), ("gemma-h200-load", (0.9, 0.5, 0.2), 8),
         ("qwen4b-h100", (0.95, 0.3), 4), ("qwen4b-h100", (0.9, 0.6, 0.2), 8), ("gemma-h200", (0.0,), 8),
         ("gemma-h200", (0.3,), 16), ("gemma-h200", (0.8,), 8))
ABLATE = {"top_slots": lambda: setattr(adaptive.DraftPolicy, "_top_slots", lambda self, *a: ([], 0.0))}


def replay(machine, n: int, p: float, seed: int, steps: int, sigma: float) -> float:
    """The policy's tokens per second over the best uniform plan's, for one seed."""
    noise = random.Random(1000 + seed)
    return rate_over_best(machine, n, p, seed, lambda: noise.lognormvariate(0.0, sigma), steps, SKIP)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--noise", type=float, default=0.08, help="sigma of the lognormal factor on each seen step")
    ap.add_argument("--out", type=pathlib.Path)
    ap.add_argument("--ablate", default="", help="policy parts to switch off, comma-separated: " + ", ".join(ABLATE))
    ap.add_argument("--mixes-only", action="store_true", help="only the second table")
    ap.add_argument("--mix-seeds", type=int, default=30, help="seeds of each cell of the second table")
    a = ap.parse_args()
    for part in filter(None, a.ablate.split(",")):
        ABLATE[part]()
    cells, worst = [], []
    for name, machine in ({} if a.mixes_only else MACHINES).items():
        for p in P_ACCEPT:
            for n in SLOTS:
                runs = [replay(machine, n, p, s, a.steps, a.noise) for s in range(a.seeds)]
                best = best_uniform(machine, n, p) / plain_rate(machine, n)
                cells.append({"machine": name, "p": p, "slots": n, "policy_over_best": [round(r, 3) for r in runs],
                              "best_over_plain": round(best, 3)})
                worst.append(min(runs))
            row = [c for c in cells if c["machine"] == name and c["p"] == p]
            print(f"{name:16} p {p:.1f}  " + "  ".join(
                f"n{c['slots']}: {min(c['policy_over_best']):.2f}/{statistics.median(c['policy_over_best']):.2f}"
                f" (best {c['best_over_plain']:.2f}x)" for c in row))
    summary = {}
    if worst:
        summary = {"worst": round(min(worst), 3), "geomean_of_worst": round(statistics.geometric_mean(worst), 4)}
        print(f"policy over the best uniform plan: worst cell {summary['worst']:.3f}, geometric mean of each cell's "
              f"worst seed {summary['geomean_of_worst']:.4f}")
    mixes = []
    for name, texts, n in MIXES:
        runs = [replay_requests(MACHINES[name], list(texts), n, s) for s in range(a.mix_seeds)]
        mixes.append({"machine": name, "texts": list(texts), "slots": n,
                      "policy_over_plain": [round(r, 3) for r in runs]})
        print(f"requests coming and going: {name:16} texts {texts} n{n}: {min(runs):.2f} / "
              f"{statistics.median(runs):.2f} / {statistics.mean(runs):.3f} of plain (worst / median / mean)")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"steps": a.steps, "seeds": a.seeds, "mix_seeds": a.mix_seeds, "noise": a.noise,
                                     "skip": SKIP,
                                     "summary": summary, "cells": cells, "ablate": a.ablate,
                                     "mixes": mixes}, indent=1) + "\n")


if __name__ == "__main__":
    main()
