#!/usr/bin/env python3
"""The real engine through a benchmark's load ramp, its step costs replaced by a model of a Qwen3-4B-shaped target on
an H100: plain decoding, a fixed 15-draft block and adaptive drafting side by side, in modelled tokens per second.

What it adds to policy_replay.py, whose policy runs alone on simulated slots: the engine's own request flow. Closed-loop
clients send requests of 128 tokens as ``http_vs_native.py`` does (per level an untimed round, then timed rounds of 2
requests a client, at least 8 a round), one engine through 1, 4, 8 and 16 clients, so that bursts of arrivals, prompt
chunks in drafting steps, the drafter's intake of each prompt's features, pauses and probes all happen as served. The
tiny qwen3 pair runs the requests (synthetic acceptance, ``--synth``, as the 4B runs had); every step's cost comes
from the model and is what the policies learn and what the rates count:

- target forward: the verify table of ``tests/engine/test_adaptive.py``'s Qwen4BMachine over the step's tokens, prompt
  chunks included, plus 0.05 ms a slot; target features +3 %;
- host work of a drafting step: 0.3 ms plus 0.11 ms a drafting slot (the 4B step traces of 2026-12-07,
  ``docs/results/2026-12-07-h100-e``: host and commit 0.54 ms at one drafting slot, 1.0 at 4, 2.55 at 16, against
  0.2-0.4 ms for a plain step);
- drafter: 1.4 ms, 0.35 ms a drafting slot and 0.025 ms a block token, plus 0.03 ms a feature row injected (a prompt
  of 96 rows ~3 ms: the first drafting step's extra in those traces);
- the first WARMUP (2) runs of each step shape (its tokens, its block tokens) cost ``--warm`` x (the backend's graph
  allocation, a run without a CUDA graph, its capture: 22.7 against 15.6 ms at 4 slots in those traces, ~1.45x);
- lognormal noise of sigma 0.08 on every step.

Not calibrated against a measured ramp: with these costs a fixed block at 4 clients models at ~0.95-1.0x of plain
where the H100 measured 1.21x, so read the rows against each other, not as predictions. A seed's run is
reproducible: the model, the synthetic acceptance and the policies draw from seeded generators (before adaptive.py
keyed a kept decision by a serial, the ids it used made two runs of one tree differ with what ran before them).

    .venv/bin/python scripts/bench/ramp_replay.py [--warm 1.5] [--seeds 1] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import statistics
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import pydflash  # noqa: E402,F401  (loads libllama before numpy)
from pydflash.config import EngineConfig  # noqa: E402
from pydflash.engine.costs import WARMUP  # noqa: E402
from pydflash.engine.drafter import NO_COST, ProposeCost  # noqa: E402
from pydflash.engine.engine import Engine  # noqa: E402
from pydflash.engine.request import Request  # noqa: E402
from pydflash.factory import write_tiny_pair  # noqa: E402
from pydflash.pair import load_pair  # noqa: E402
from tests.engine.test_adaptive import Qwen4BMachine, interp  # noqa: E402

# Qwen4BMachine's verify, extended for the prompt chunks a step may carry (H100 prefill of a 4B Q4_K_M: ~12k tok/s)
VERIFY = {**Qwen4BMachine.VERIFY, 512: 52e-3, 2048: 190e-3}
PER_SLOT, FEATURES = 0.05e-3, 1.03
HOST0, HOST_SLOT = 0.3e-3, 0.11e-3
DRAFT0, DRAFT_SLOT, DRAFT_TOKEN, ROW = 1.4e-3, 0.35e-3, 0.025e-3, 0.03e-3
MODES = ("plain", "fixed", "adaptive")


class ModelledCosts:
    """Replaces an engine's measured step costs by the model's (see the module): ``seconds`` and ``steps`` add up
    every step's modelled cost; the policies learn the same figures through ``Engine._observe_costs``."""

    def __init__(self, eng: Engine, seed: int, warm: float, sigma: float = 0.08):
        self.eng, self.rng, self.warm, self.sigma = eng, random.Random(seed), warm, sigma
        self.shapes: dict[tuple[int, int], int] = {}
        self.seconds, self.steps, self.drafting, self.warm_s, self.draft_s = 0.0, 0, 0, 0.0, 0.0
        self._chunk_tokens, self._step_s = 0, 0.0
        if eng.drafter is not None:  # a GPU's curves: warm-up runs dropped, probes as upper bounds
            costs = eng.drafting.costs
            costs.drop_first = costs.draft.drop_first = True
            for curve in costs.verify_any.values():
                curve.drop_first = True
        self._account, self._observe, self._chunks = eng._account, eng._observe_costs, eng._prefill_chunks
        eng._account, eng._observe_costs, eng._prefill_chunks = self.account, self.observe, self.prefill_chunks

    def prefill_chunks(self, plan, prefilling):
        out = self._chunks(plan, prefilling)
        self._chunk_tokens = sum(len(chunk) for _, chunk in out)
        return out

    def account(self, plan, prefilling, clock, t_commit, n_copied=0, events=()):
        eng = self.eng
        ks = [k for _, k in plan]
        drafting = sum(1 for k in ks if k)
        blocks = sum(k + 1 for k in ks if k)
        x = sum(1 + k for k in ks) + n_copied + self._chunk_tokens
        features = eng.drafter is not None and eng.target_ctx.features_on
        v = PER_SLOT * (len(plan) + len(prefilling)) + interp(VERIFY, x) / (1.0 if features else FEATURES)
        if drafting:
            v += HOST0 + HOST_SLOT * drafting
        cost = eng.drafter.last_cost if eng.drafter is not None else NO_COST
        inject = ROW * cost.rows
        block = DRAFT0 + DRAFT_SLOT * drafting + DRAFT_TOKEN * blocks if drafting else 0.0
        shape = (x, blocks)
        runs = self.shapes[shape] = self.shapes.get(shape, 0) + 1
        warming = runs <= WARMUP  # the runs the cost curves drop as the backend's warm-up
        f = (self.warm if warming else 1.0) * self.rng.lognormvariate(0.0, self.sigma)
        v, inject, block = v * f, inject * f, block * f
        self._step_s = v + inject + block
        self.seconds += self._step_s
        self.steps += 1
        if drafting:
            self.drafting += 1
            self.draft_s += self._step_s
            self.warm_s += self._step_s if warming else 0.0
        if eng.drafter is not None:
            eng.drafter.last_cost = ProposeCost(inject, cost.rows, block) if drafting or cost.rows else NO_COST
        self._chunk_tokens = 0
        return self._account(plan, prefilling, clock, t_commit, n_copied, events)

    def observe(self, plan, total, n_copied=0):
        return self._observe(plan, self._step_s, n_copied)


def run_round(eng: Engine, costs: ModelledCosts, prompts: list, clients: int, per_client: int, tokens: int) -> dict:
    """C clients, each sending per_client requests one after another; the round's modelled figures."""
    queues = {c: [prompts.pop() for _ in range(per_client)] for c in range(clients)}
    owner = {}

    def send(c: int) -> None:
        if queues[c]:
            owner[eng.submit(Request(queues[c].pop(), max_tokens=tokens, ignore_eos=True, temperature=0))] = c

    for c in range(clients):
        send(c)
    before = (costs.seconds, costs.steps, costs.drafting, costs.draft_s, costs.warm_s)
    done = 0
    while eng.has_work:
        for ev in eng.step():
            done += len(ev.tokens)
            if ev.finished:
                send(owner.pop(ev.request_id))
    seconds, steps, drafting, draft_s, warm_s = (a - b for a, b in zip(
        (costs.seconds, costs.steps, costs.drafting, costs.draft_s, costs.warm_s), before))
    return {"tok_s": done / seconds, "steps": steps, "drafting_share": drafting / max(steps, 1),
            "warm_up_share_of_drafting": warm_s / draft_s if draft_s else 0.0}


def run_mode(mode: str, pair_files, levels: list[int], seed: int, a: argparse.Namespace) -> dict:
    pair = load_pair(pair_files.target, None if mode == "plain" else pair_files.drafter)
    cfg = EngineConfig(n_slots=max(levels), n_ctx_slot=512, adaptive=mode == "adaptive", draft_max=15,
                       synth_len=None if mode == "plain" else a.synth)
    eng = Engine(pair, cfg)
    costs = ModelledCosts(eng, seed, a.warm, a.sigma)
    rng = random.Random(seed)
    out = {}
    try:
        for c in levels:
            per = max(2, -(-8 // c))
            prompts = [[2] + [rng.randrange(100, 500) for _ in range(a.prompt_tokens - 1)]
                       for _ in range(c * per * (a.rounds + 1))]
            run_round(eng, costs, prompts, c, per, a.tokens)  # untimed, as http_vs_native.py's warm-up round
            out[c] = [run_round(eng, costs, prompts, c, per, a.tokens) for _ in range(a.rounds)]
    finally:
        eng.close()
        pair.close()
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="1,4,8,16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--warm", type=float, default=1.5, help="cost factor of a step shape's first 2 runs")
    ap.add_argument("--sigma", type=float, default=0.08, help="lognormal noise on each step's cost")
    ap.add_argument("--synth", type=float, default=5.0, help="synthetic acceptance length L (the bonus counted)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=96)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", type=pathlib.Path)
    a = ap.parse_args(argv)
    levels = [int(x) for x in a.levels.split(",")]
    pair_files = write_tiny_pair(pathlib.Path(tempfile.mkdtemp()), arch="qwen3", seed=0)
    runs = {m: [run_mode(m, pair_files, levels, s, a) for s in range(a.seeds)] for m in a.modes.split(",")}
    table = {}
    for m, by_seed in runs.items():
        for c in levels:
            rounds = [r for seed in by_seed for r in seed[c]]
            table.setdefault(m, {})[c] = {k: round(statistics.median(r[k] for r in rounds), 1 if k == "tok_s" else 2)
                                          for k in ("tok_s", "drafting_share", "warm_up_share_of_drafting")}
    plain = table.get("plain")
    print(f"modelled tok/s (median of {a.rounds * a.seeds} rounds), warm-up x{a.warm}, synthetic L = {a.synth}")
    for m, row in table.items():
        cells = []
        for c in levels:
            cell = row[c]
            ratio = f" ({cell['tok_s'] / plain[c]['tok_s']:.2f}x plain)" if plain and m != "plain" else ""
            extra = (f", drafting {cell['drafting_share']:.0%} of steps, warm-ups "
                     f"{cell['warm_up_share_of_drafting']:.0%} of their time") if m != "plain" else ""
            cells.append(f"c{c} {cell['tok_s']}{ratio}{extra}")
        print(f"{m:9s} " + " | ".join(cells))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "table": table,
                                     "rounds": runs}, indent=1) + "\n")
    return {"table": table, "rounds": runs}


if __name__ == "__main__":
    main()
