"""Adaptive drafting at 1 slot over a stream of requests, each a new text, replayed on the simulated GPU of
tests/engine/test_adaptive.py (the H200's step costs through HTTP) plus a probe's extra cost: what the policy's
resets at each arrival (``DraftPolicy.alone``) earn where only some texts suit the drafter.

    python scripts/bench/reset_replay.py --out docs/results/2026-12-06-cpu/reset_replay.json

Each text's drafts are accepted with its own rate p, position by position; a request is 256 steps. Printed: for each
mix of texts, tokens per second over plain decoding's, per seed, and the resets made.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from tests.engine.test_adaptive import GPU, arrivals  # noqa: E402

# a probe at 1 slot on an H100 took 7.0 ms against a plain step's 1.33 (docs/benchmarks.md, 2026-12-05): no CUDA
# graph for its shape and the drafter's catch-up over the prompt, ~4 ms more than the simulated 16-token step
PROBE_EXTRA_S = 4.0e-3
MIXES = {"never suits (p 0.2)": [0.2], "marginal (p 0.3)": [0.3], "1 in 2 suits (p 0.9, else 0.3)": [0.9, 0.3],
         "1 in 4": [0.9] + [0.3] * 3, "1 in 8": [0.9] + [0.3] * 7, "1 in 16": [0.9] + [0.3] * 15,
         "1 in 32": [0.9] + [0.3] * 31,
         "mixed (0.8, 0.6, 0.3, 0.2, 0.3, 0.1, 0.3, 0.3)": [0.8, 0.6, 0.3, 0.2, 0.3, 0.1, 0.3, 0.3]}


def replay(texts: list[float], requests: int, steps: int, seed: int) -> tuple[float, int]:
    """(tokens per second over plain decoding's, resets) for ``requests`` arrivals of the texts in turn: the test
    suite's arrivals (its drafter's first drafts accepted 3 times in 8, a pause of 300 steps to start from), timed
    step by step on the simulated GPU."""
    totals = {"tokens": 0.0, "seconds": 0.0, "drafting": False}

    def timed(plan, accepted: int) -> None:
        k = plan.drafts[0]
        t_verify, t_draft = GPU.step([k], plan.features)
        totals["seconds"] += t_verify + t_draft + (PROBE_EXTRA_S if k and not totals["drafting"] else 0.0)
        totals["drafting"] = k > 0
        totals["tokens"] += 1 + accepted

    resets, _, _ = arrivals(texts, requests, steps, seed, on_step=timed)
    plain_s = requests * steps * GPU.step([0], False)[0]
    return totals["tokens"] / totals["seconds"] / (requests * steps / plain_s), resets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--out", type=pathlib.Path)
    a = ap.parse_args()
    out = {"requests": a.requests, "steps": a.steps, "probe_extra_s": PROBE_EXTRA_S, "mixes": {}}
    for name, texts in MIXES.items():
        runs = [replay(texts, a.requests, a.steps, s) for s in range(a.seeds)]
        out["mixes"][name] = {"texts": texts, "speed_over_plain": [round(x, 3) for x, _ in runs],
                              "resets": [n for _, n in runs]}
        print(f"{name}: " + " ".join(f"{x:.3f}" for x, _ in runs) + f"  (resets {[n for _, n in runs]})")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
