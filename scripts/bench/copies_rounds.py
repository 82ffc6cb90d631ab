#!/usr/bin/env python3
"""What copies (pydflash/engine/copies.py) do to a benchmark round, simulated: C clients each send 2 requests of 256
greedy tokens (Gemma-3-270M's own greedy continuations of the drafter's held-out prompts,
``pydflash/train/eval_fresh_v1.jsonl``, generated once on this machine and cached), with a model of an H100's step
costs (docs/results/2026-12-06-h100-d traces: a plain step of 1 / 2 / 4 / 8 / 16 slots 1.17 / 1.29 / 1.40 / 2.0 /
2.5 ms; a verify's first extra token +1 ms, each further one +0.06 ms). Copies are chosen by the engine's own
CopyPolicy and accepted exactly where the greedy text goes on as copied. A round's time is its makespan: the
slowest client's, as ``http_vs_native.py`` measures tok/s. ``--cap A``: copies also limited to a step cost of at most
a plain step x (1 + A x the copying slots' share), a cap on what the requests that do not repeat pay.

    .venv/bin/python scripts/bench/copies_rounds.py [--clients 1,4,8,16] [--seeds 6] [--cap A] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import sys

_REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(_REPO))

from pydflash.engine.adaptive import CANDIDATES  # noqa: E402
from pydflash.engine.copies import CopyPolicy, SlotCopies  # noqa: E402
from pydflash.engine.costs import StepCosts  # noqa: E402
from pydflash.engine.lookup import History  # noqa: E402

PLAIN = {1: 1.17e-3, 2: 1.29e-3, 4: 1.40e-3, 8: 2.0e-3, 16: 2.5e-3}
CACHE = _REPO / ".cache" / "bench" / "copies_rounds_greedy.json"


def plain(n: int) -> float:
    lo = max(k for k in PLAIN if k <= n)
    hi = min((k for k in PLAIN if k >= n), default=lo)
    return PLAIN[lo] if lo == hi else PLAIN[lo] + (PLAIN[hi] - PLAIN[lo]) * (n - lo) / (hi - lo)


def extra_seconds(n: int, x: int) -> float:
    """What x verify tokens of n slots cost over a plain step: the first extra token's jump, then a slope."""
    return 1.0e-3 + 0.06e-3 * (x - n) if x > n else 0.0


def step_seconds(n: int, x: int) -> float:
    return plain(n) + extra_seconds(n, x)


def model_engine(eng, block_seconds, noise=None):
    """Make an engine's policies learn this model's step costs instead of the measured ones (a GPU's curves:
    warm-up samples dropped, probes upper bounds): a step of n slots and x verify tokens costs a plain step (target
    features +8 %) plus the extra tokens, times ``noise()`` if given, plus ``block_seconds(drafting slots)`` where
    the drafter drafts. Returns that cost as a function of (plan, copied tokens)."""
    from pydflash.engine.drafter import NO_COST, ProposeCost

    costs = eng.drafting.costs
    costs.drop_first = costs.draft.drop_first = True
    for curve in costs.verify_any.values():
        curve.drop_first = True
    observe = eng._observe_costs

    def seconds(plan, n_copied: int) -> float:
        n, x = len(plan), sum(1 + k for _, k in plan) + n_copied
        verify = plain(max(n, 1)) * (1.08 if eng.target_ctx.features_on else 1.0) + extra_seconds(n, x)
        drafting = sum(1 for _, k in plan if k)
        return verify * (noise() if noise else 1.0) + (block_seconds(drafting) if drafting else 0.0)

    def modelled(plan, total, n_copied=0):  # the measured seconds replaced by the model's
        drafting = sum(1 for _, k in plan if k)
        eng.drafter.last_cost = ProposeCost(0.0, 0, block_seconds(drafting)) if drafting else NO_COST
        return observe(plan, seconds(plan, n_copied), n_copied)

    eng._observe_costs = modelled
    return seconds


def greedy_texts(tokens: int) -> list[dict]:
    """(prompt tokens, greedy continuation) per held-out prompt, generated once through the engine on the CPU."""
    if CACHE.exists():
        return json.loads(CACHE.read_text())
    from pydflash.config import EngineConfig
    from pydflash.defaults import gemma_target
    from pydflash.engine.engine import Engine
    from pydflash.engine.request import Request
    from pydflash.pair import load_pair

    prompts = [json.loads(line)["text"] for line in (_REPO / "pydflash/train/eval_fresh_v1.jsonl").open()]
    pair = load_pair(gemma_target())
    engine = Engine(pair, EngineConfig(n_slots=8, n_ctx_slot=1024))
    reqs = [Request(p, max_tokens=tokens, temperature=0, ignore_eos=True) for p in prompts]
    results = engine.run(reqs)
    out = [{"prompt": pair.target.tokenize(p, add_special=True, parse_special=True), "gen": results[r.id].tokens}
           for p, r in zip(prompts, reqs)]
    engine.close()
    pair.close()
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    CACHE.write_text(json.dumps(out))
    return out


def cap_copies(costs: StepCosts, n: int, ks: list[int], cap: float) -> list[int]:
    ks = list(ks)
    while any(ks) and costs.verify(n, n + sum(ks), False) > costs.plain(n) * (1 + cap * sum(map(bool, ks)) / n):
        j = max(range(len(ks)), key=ks.__getitem__)
        ks[j] = max((c for c in CANDIDATES if c < ks[j]), default=0)
    return ks


def round_seconds(texts: list[dict], clients: int, copies: bool, seed: int, cap: float | None) -> float:
    rng = random.Random(seed)
    queue = [[texts[(seed * 7 + c * 13 + r) % len(texts)] for r in range(2)] for c in range(clients)]
    costs = StepCosts(drop_first=False)
    for n in range(1, clients + 1):  # what calibration and the first steps would have measured
        for x in (n, n + 4, n + 16, n + 32):
            for _ in range(3):
                costs.observe(n, x, False, step_seconds(n, x), 0, 0.0)
                costs.observe(n, x, True, 1.08 * step_seconds(n, x), 0, 0.0)
    policy, slots, seconds = CopyPolicy(costs), {}, 0.0

    def admit(c: int) -> None:
        if queue[c]:
            rec = queue[c].pop(0)
            slots[c] = {"history": History(rec["prompt"]), "gen": rec["gen"], "at": 0, "mine": SlotCopies(),
                        "chain": []}

    for c in range(clients):
        admit(c)
    while slots:
        running = list(slots.items())
        n, ks = len(running), [0] * len(running)
        if copies:
            found = [(i, chain) for i, (_, s) in enumerate(running)
                     for chain in (policy.candidate(s["mine"], s["history"], 15),) if chain]
            if found:
                chosen = policy.choose(n, [(running[i][1]["mine"], len(chain)) for i, chain in found], False)
                if cap is not None:
                    chosen = cap_copies(costs, n, chosen, cap)
                for (i, chain), k in zip(found, chosen):
                    ks[i], running[i][1]["chain"] = k, chain[:k]
        dt = step_seconds(n, n + sum(ks)) * rng.uniform(0.97, 1.05)
        costs.observe(n, n + sum(ks), False, dt, 0, 0.0)
        seconds += dt
        for (c, s), k in zip(running, ks):
            gen, at, m = s["gen"], s["at"], 0
            if k:
                while m < k and at + m < len(gen) and s["chain"][m] == gen[at + m]:
                    m += 1
                policy.observe(s["mine"], k, m)
            step = min(m + 1, len(gen) - at)
            s["history"].extend(gen[at:at + step])
            s["at"] += step
            if s["at"] >= len(gen):
                del slots[c]
                admit(c)
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", default="1,4,8,16")
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--cap", type=float, default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    texts = greedy_texts(args.tokens)
    rows = []
    for c in [int(x) for x in args.clients.split(",")]:
        ratios = sorted(round_seconds(texts, c, False, s, None) / round_seconds(texts, c, True, s, args.cap)
                        for s in range(args.seeds))
        rows.append({"clients": c, "cap": args.cap, "copies_over_plain_median": round(ratios[len(ratios) // 2], 3),
                     "min": round(ratios[0], 3), "max": round(ratios[-1], 3)})
        print(json.dumps(rows[-1]), flush=True)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps({"rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
