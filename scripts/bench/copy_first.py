#!/usr/bin/env python3
"""Copies standing in for the drafter's blocks (pydflash/engine/copies.py, ``CopyPolicy.first``): the Gemma-3-270M
target with the shipped drafter, adaptive drafting as the server runs it, with the stand-in and without it
(``CHECK_EVERY = 1``: every step the plan drafts in runs the drafter), against plain decoding through the same engine.
In one process, the conditions interleaved over rounds; greedy, ``ignore_eos``, the frozen fresh prompt set's first
N prompts in turn, each request its own prompt (they recur across rounds, as in the HTTP benchmark). Reports tok/s
per condition and load, the ratios to plain, the drafter's block forwards and the steps with copies.

With ``--modelled`` (for a CPU, where the shipped drafter seldom pays and so seldom drafts) every step's cost is the
H100's as traced (scripts/bench/copies_rounds.py's plain step and verify tokens, target features +8 %, the
drafter's injection and block 0.7 ms + 0.3 ms a drafting slot: 1.0 / 1.3 / 1.8 / 2.9 / 6.0 ms measured at 1 / 2 /
4 / 8 / 16), fed to the policies in place of the measured one and summed for a modelled tok/s: the real pair's
drafts and acceptance, a GPU's prices. Decisions are deterministic then, so one round is enough.

    .venv/bin/python scripts/bench/copy_first.py [--prompts 12] [--tokens 256] [--loads 1,4] [--rounds 2] \\
        [--ngl 0] [--modelled] [--kind code] [--drafter OTHER.gguf] [--out docs/results/<date>-cpu/copy_first.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from copies_rounds import model_engine  # noqa: E402  (scripts/bench is sys.path[0])

from pydflash import api  # noqa: E402
from pydflash.config import EngineConfig  # noqa: E402
from pydflash.defaults import SHIPPED_DRAFTER, gemma_target  # noqa: E402
from pydflash.engine import copies  # noqa: E402
from pydflash.engine.request import Request  # noqa: E402

PROMPTS = pathlib.Path(__file__).resolve().parent / "prompts_fresh_v1.jsonl"
CONDITIONS = ("plain", "pair", "pair, no stand-in")
CHECK_EVERY = copies.CHECK_EVERY  # as shipped


def block_seconds(drafting: int) -> float:
    return 0.7e-3 + 0.3e-3 * drafting


def model_costs(eng) -> list[float]:
    """Replace what the engine's policies learn from with the H100's modelled step costs; returns the list that
    collects every step's modelled seconds (prefill steps priced as decode steps of all the slots)."""
    steps = []
    seconds, account = model_engine(eng, block_seconds), eng._account

    def modelled_account(plan, prefilling, clock, t_commit, n_copied=0):
        steps.append(seconds(plan + [(s, 0) for s in prefilling], n_copied))
        return account(plan, prefilling, clock, t_commit, n_copied)

    eng._account = modelled_account
    return steps


def run_round(llm, prompts: list[str], n_slots: int, tokens: int, check_every: int, modelled) -> dict:
    copies.CHECK_EVERY = check_every  # read at each decision (CopyPolicy.first)
    eng = llm.engine
    first_step = len(modelled) if modelled is not None else 0
    blocks = [0]
    if eng.drafter is not None:
        propose = eng.drafter.propose
        eng.drafter.propose = lambda plan, during=None: (
            blocks.__setitem__(0, blocks[0] + any(k for _, k in plan)), propose(plan, during))[1]
    reqs = [Request(llm.tokenize(p), max_tokens=tokens, ignore_eos=True) for p in prompts]
    t0 = time.perf_counter()
    results = []
    for i in range(0, len(reqs), n_slots):  # n_slots at a time, the next ones once all have finished (a round of
        results += llm.generate_many(reqs[i:i + n_slots])  # the HTTP benchmark waits for its slowest too)
    seconds = time.perf_counter() - t0
    if modelled is not None:
        seconds = sum(modelled[first_step:])
    if eng.drafter is not None:
        eng.drafter.propose = propose
    copies.CHECK_EVERY = CHECK_EVERY
    n = sum(len(r.tokens) for r in results)
    return {"tokens": n, "seconds": round(seconds, 3), "tok_s": round(n / seconds, 2), "blocks": blocks[0],
            "steps": sum(r.stats.n_steps for r in results),
            "copy_steps": sum(r.stats.n_lookup_steps for r in results),
            "outputs": [r.tokens for r in results]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--loads", default="1,4")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ngl", type=int, default=0)
    ap.add_argument("--modelled", action="store_true", help="the H100's step costs, modelled (see the module)")
    ap.add_argument("--kind", default="", help="only the set's prompts of this kind (code, prose, question, ...)")
    ap.add_argument("--drafter", default=str(SHIPPED_DRAFTER),
                    help="the pair's drafter (default: the shipped one; a useless one shows what copies alone do)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    fresh = [json.loads(line) for line in PROMPTS.read_text().splitlines()]
    prompts = [r["prompt"] for r in fresh if not args.kind or r["kind"] == args.kind][:args.prompts]
    loads = [int(x) for x in args.loads.split(",")]
    rows = []
    for n_slots in loads:
        cfg = dict(n_ctx_slot=1024, n_slots=n_slots, n_gpu_layers=args.ngl, adaptive=True)
        with api.load(gemma_target(), None, config=EngineConfig(draft_max=0, **cfg)) as plain, \
                api.load(gemma_target(), args.drafter, config=EngineConfig(**cfg)) as pair:
            modelled = {id(llm): model_costs(llm.engine) if args.modelled else None for llm in (plain, pair)}
            runs = {c: [] for c in CONDITIONS}
            for r in range(args.rounds + 1):  # round 0 warms up (and fills the prompt caches)
                order = CONDITIONS[r % 3:] + CONDITIONS[:r % 3]
                for c in order:
                    llm = plain if c == "plain" else pair
                    out = run_round(llm, prompts, n_slots, args.tokens, 1 if c.endswith("stand-in") else CHECK_EVERY,
                                    modelled[id(llm)])
                    if r:
                        runs[c].append(out)
            base = [o["outputs"] for o in runs["plain"]][0]
            for c in CONDITIONS:
                tok_s = [o["tok_s"] for o in runs[c]]
                same = sum(a == b for o in runs[c] for a, b in zip(o["outputs"], base))
                row = {"slots": n_slots, "condition": c, "tok_s_median": statistics.median(tok_s), "tok_s": tok_s,
                       "blocks": [o["blocks"] for o in runs[c]], "steps": [o["steps"] for o in runs[c]],
                       "copy_steps": [o["copy_steps"] for o in runs[c]],
                       "outputs_equal_to_plain": f"{same}/{len(base) * len(runs[c])}"}
                rows.append(row)
                print(json.dumps(row), flush=True)
            med = {c: statistics.median(o["tok_s"] for o in runs[c]) for c in CONDITIONS}
            print(f"slots {n_slots}: pair / plain {med['pair'] / med['plain']:.3f}, no stand-in / plain "
                  f"{med['pair, no stand-in'] / med['plain']:.3f}", flush=True)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps({"prompts": args.prompts, "tokens": args.tokens,
                                                      "rounds": args.rounds, "modelled": args.modelled,
                                                      "drafter": pathlib.Path(args.drafter).name,
                                                      "kind": args.kind or "all",
                                                      "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
