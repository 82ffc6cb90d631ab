#!/usr/bin/env python3
"""Adaptive drafting closed-loop on this machine, with an H200's step costs in place of the measured ones (issue 13).

The engine runs for real here (the Gemma target, a drafter, held-out code prompts, greedy): its drafts, acceptances,
feature steps and injections are what they would be anywhere. Only what the policy learns about step costs is
replaced: each decode step teaches it the seconds the H200 would have taken for that step's shape, from the
model below (scripts/step_costs.py on the H200, docs/drafter_2026-12-01-b/step_costs_v3.json), so that on a CPU, where
drafting never pays, the policy decides as it would on the GPU. The modelled tok/s sums those seconds.

    .venv/bin/python scripts/replay_adaptive.py [--slots 1] [--requests 4] [--tokens 256] [--catch-up-in-d]

``--catch-up-in-d`` teaches the drafter's cost curve every injection, catch-up included (the rule before this
script): a probe after a pause then also pays for the lead-in's feature rows, which a drafting step never repeats.
The injection cost (one llama_process per call, plus a little per row) is not measured by step_costs.py: the default
0.4 ms per call is an assumption, about the gap between the drafter time per synthetic-L=8 step in the H200's
in-process split (1.24 ms, docs/gpu_2026-12-01/bench_gpu_adaptive_c1.md) and a block forward alone (0.85 ms);
vary it with --inject-ms.

``--warm-up F`` makes the first two steps of each shape (verify tokens and features, drafter block tokens) cost F
times the model, as on the H200 through HTTP, where ggml-cuda allocates a graph at a shape's first call and captures a
CUDA graph at its second (docs/gpu_2026-12-01-g/README.md); the modelled tok/s counts them too.

``--synthetic P`` runs no engine: the policy alone, closed loop, on every slot count of ``--slots`` (comma-separated),
each draft accepted with probability P, against whole-step costs of the H200 through HTTP with the shipped pair
(``HttpH200``: the docs/gpu_2026-12-03-b traces) or, with ``--flat``, the issue's step split (a 16-token-a-slot verify
1.25x a plain step at any load, tests/test_adaptive.py's LoadMachine). It prints each load's share of paused steps, its
modelled speedup over plain decoding and the best fixed K's (what drafting can give there):

    .venv/bin/python scripts/replay_adaptive.py --synthetic 0.72 --slots 1,4,8,16 [--flat] [--steps 3000] [--seeds 4]
        [--request-tokens 256]
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
from pydflash.engine.costs import Curve, StepCosts
from pydflash.engine.drafter import ProposeCost
from pydflash.engine.request import Request
from pydflash.engine.stats import Stats

HELDOUT = pathlib.Path(__file__).resolve().parents[1] / "pydflash" / "train" / "heldout_eval.npz"
# H200, Gemma-3-270M Q4_K_M, drafter version 2 (ms): target forward over x verify tokens of one slot, features on
VERIFY_C1 = {1: 1.151, 2: 1.21, 5: 1.413, 16: 2.602}
PER_SLOT = 0.11  # each further slot's attention over its own KV (tests/test_adaptive.py's GPU model)
FEATURES_OFF = 1.141 / 1.151
DRAFT = {5: 0.558, 16: 0.845, 40: 1.376, 128: 2.398}  # drafter block forward over x block tokens


def curve(table: dict) -> Curve:
    """The table as the engine's own cost curve: linear between points, flat below, the last slope above."""
    c = Curve(drop_first=False)
    for x, ms in table.items():
        c.observe(x, 1e-3 * ms)
    return c


class H200:
    def __init__(self, inject_ms: float, inject_row_us: float):
        self.inject_ms, self.inject_row_us = inject_ms, inject_row_us
        self._verify, self._draft = curve(VERIFY_C1), curve(DRAFT)

    def verify(self, n: int, x: int, features: bool) -> float:
        t = 1e-3 * PER_SLOT * (n - 1) + self._verify(x - (n - 1))
        return t * (1.0 if features else FEATURES_OFF)

    def draft(self, x: int) -> float:
        return self._draft(x) if x else 0.0

    def inject(self, rows: int) -> float:
        return 1e-3 * (self.inject_ms + self.inject_row_us * 1e-3 * rows) if rows else 0.0


class HttpH200:
    """Whole decode-step seconds through HTTP on the H200, shipped pair (docs/gpu_2026-12-03-b traces, medians): a plain
    step (py-plain), and the verify (+ commit + host) and drafter parts of steps where every slot drafts 15 (py-synth8),
    by running slots; shapes between from docs/gpu_2026-12-03-d/step_costs_picks_1.json (a verify of 2 / 5 tokens a
    slot adds 13 / 40 % of what 16 add; a drafting step's drafter work at 1 / 4 / 8 drafts a slot is about 0.66 / 0.76 /
    0.88 of its work at 15). The drafter part is taken at the number of drafting slots."""

    PLAIN = {1: 1.069e-3, 4: 1.314e-3, 8: 1.654e-3, 16: 2.341e-3}
    FEATURES = 1.08  # a step with target features (feat against off steps at 4-16 slots: +7-15 %)
    VERIFY16 = {1: 2.064e-3, 4: 3.924e-3, 8: 6.42e-3, 16: 8.81e-3}
    DRAFT15 = {1: 0.908e-3, 4: 1.579e-3, 8: 2.454e-3, 16: 3.929e-3}
    SPAN = {1: 0.0, 2: 0.13, 5: 0.40, 16: 1.0}
    DRAFT_K = {1: 0.66, 4: 0.76, 8: 0.88, 15: 1.0}

    def step(self, ks: list[int], features: bool) -> tuple[float, float]:
        n, drafting = len(ks), sum(1 for k in ks if k)
        plain = _interp(self.PLAIN, n) * self.FEATURES
        t_verify = plain + (_interp(self.VERIFY16, n) - plain) * _interp(self.SPAN, 1 + sum(ks) / n)
        t_verify /= 1.0 if features else self.FEATURES
        if not drafting:
            return t_verify, 0.0
        return t_verify, _interp(self.DRAFT15, drafting) * _interp(self.DRAFT_K, sum(ks) / drafting)


class FlatH200(HttpH200):
    """The issue's step split: a verify of 16 tokens a slot 1.25x a plain step at any load, the drafter's work 0.37 ms
    + 0.13 ms per drafting slot (tests/test_adaptive.py's LoadMachine)."""

    def step(self, ks: list[int], features: bool) -> tuple[float, float]:
        n, drafting = len(ks), sum(1 for k in ks if k)
        t_verify = _interp(self.PLAIN, n) * self.FEATURES * (1.0 + 0.25 * sum(ks) / (15 * n))
        t_verify /= 1.0 if features else self.FEATURES
        return t_verify, (0.37e-3 + 0.13e-3 * drafting) if drafting else 0.0


def _interp(table: dict, x: float) -> float:
    xs = sorted(table)
    if x <= xs[0]:
        return table[xs[0]]
    for a, b in zip(xs, xs[1:]):
        if x <= b:
            return table[a] + (table[b] - table[a]) * (x - a) / (b - a)
    a, b = xs[-2], xs[-1]
    return table[b] + (table[b] - table[a]) / (b - a) * (x - b)


def synthetic(machine, n: int, p: float, steps: int, seed: int, request_tokens: int = 0) -> tuple[float, float]:
    """(share of paused steps, committed tokens/s over plain decoding's) past the first 10 % of steps, the policy
    observing costs as the engine does (Engine._observe_costs: samples_costs, a probe's as upper bounds).
    request_tokens: a slot's request ends after this many tokens and a new one takes it (at 1 slot in an idle engine:
    ``alone``); 0: one request a slot throughout."""
    import random

    from pydflash.engine import adaptive

    rng, policy = random.Random(seed), adaptive.DraftPolicy(StepCosts(drop_first=True))
    slots = [adaptive.SlotPolicy() for _ in range(n)]
    left = [request_tokens] * n
    paused = tokens = seconds = 0.0
    for i in range(steps):
        plan = (adaptive.Plan([0] * n, False) if policy.paused_step(n) else policy.plan([(s, 15) for s in slots]))
        t_verify, t_draft = machine.step(plan.drafts, plan.features)
        if policy.samples_costs():
            kept = policy.costs.observe(n, n + sum(plan.drafts), plan.features, t_verify,
                                        sum(k + 1 for k in plan.drafts if k), t_draft, policy.costs_are_upper_bounds())
            policy.observe_step(n, t_verify + t_draft, kept,
                                (n, n + sum(plan.drafts), sum(k + 1 for k in plan.drafts if k)))
        accepted = 0
        for j, (s, k) in enumerate(zip(slots, plan.drafts)):
            m = 0
            while m < k and rng.random() < p:
                m += 1
            policy.observe(s, k, m)
            accepted += m
            left[j] -= 1 + m
            if request_tokens and left[j] <= 0:  # the next request
                slots[j], left[j] = adaptive.SlotPolicy(), request_tokens
                if n == 1:
                    policy.alone(1)
        if i >= steps // 10:
            paused += not any(plan.drafts)
            tokens += n + accepted
            seconds += t_verify + t_draft
    plain = n / machine.step([0] * n, False)[0]
    return paused / (steps - steps // 10), tokens / seconds / plain


def main_synthetic(a) -> int:
    machine = FlatH200() if a.flat else HttpH200()
    report = {"p": a.synthetic, "costs": type(machine).__name__, "steps": a.steps, "seeds": a.seeds,
              "request_tokens": a.request_tokens, "loads": {}}
    tau = 1 + sum(a.synthetic**j for j in range(1, 16))
    for n in (int(x) for x in str(a.slots).split(",")):
        runs = [synthetic(machine, n, a.synthetic, a.steps, seed, a.request_tokens) for seed in range(a.seeds)]
        plain = n / machine.step([0] * n, False)[0]
        best = max((n * (1 + sum(a.synthetic**j for j in range(1, k + 1))) / sum(machine.step([k] * n, True)) / plain,
                    k) for k in (1, 2, 3, 4, 6, 8, 11, 15))
        report["loads"][n] = {"paused": [round(r[0], 3) for r in runs], "speedup": [round(r[1], 3) for r in runs],
                              "best_fixed_k": best[1] if best[0] > 1 else 0,
                              "best_speedup": round(max(1.0, best[0]), 3)}
        print(f"{n:2d} slots (tau {tau:.2f} at 15): paused {report['loads'][n]['paused']}, speedup "
              f"{report['loads'][n]['speedup']}; best fixed K {report['loads'][n]['best_fixed_k']}: "
              f"{report['loads'][n]['best_speedup']}x", flush=True)
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--slots", default="1", help="concurrent requests (each wave fills every slot); with "
                    "--synthetic, slot counts comma-separated")
    ap.add_argument("--requests", type=int, default=4, help="requests per slot, one after another")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--order", default="", help="held-out code prompt indices to run, comma-separated (default: "
                    "0, 1, 2, ... in order, as bench_http sends them)")
    ap.add_argument("--drafter", default=str(SHIPPED_DRAFTER))
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--inject-ms", type=float, default=0.4, help="modelled fixed cost of one injection call")
    ap.add_argument("--inject-row-us", type=float, default=5.0, help="modelled cost per injected feature row")
    ap.add_argument("--catch-up-in-d", action="store_true", help="the old rule: catch-up injection counts in D")
    ap.add_argument("--warm-up", type=float, default=1.0, help="cost factor of the first two steps of each shape")
    ap.add_argument("--out", default=None)
    ap.add_argument("--synthetic", type=float, default=None, help="no engine: the policy alone, each draft accepted "
                    "with this probability, on the H200's costs (the module)")
    ap.add_argument("--flat", action="store_true", help="with --synthetic: the issue's step split (FlatH200)")
    ap.add_argument("--steps", type=int, default=3000, help="with --synthetic: decode steps per run")
    ap.add_argument("--seeds", type=int, default=4, help="with --synthetic: runs per slot count")
    ap.add_argument("--request-tokens", type=int, default=0, help="with --synthetic: tokens per request (0: one "
                    "request a slot throughout)")
    a = ap.parse_args(argv)
    if a.synthetic is not None:
        return main_synthetic(a)
    a.slots = int(a.slots)

    data = np.load(HELDOUT)
    p_len = int(data["prompt_len"])
    rows = data["code_tokens"]
    order = [int(i) for i in a.order.split(",")] if a.order else range(len(rows))
    prompts = [[int(t) for t in rows[i][:p_len]] for i in order]
    gpu = H200(a.inject_ms, a.inject_row_us)
    cfg = EngineConfig(n_slots=a.slots, n_ctx_slot=p_len + a.tokens + 32, n_threads=a.threads, adaptive=True)
    modelled = {"seconds": 0.0, "steps": 0, "drafting_steps": 0}
    t0 = time.perf_counter()
    with api.load(gemma_target(), a.drafter, cfg) as llm:
        eng = llm.engine

        shapes = {}  # step shape -> times seen (--warm-up)

        def warm(shape) -> float:
            shapes[shape] = shapes.get(shape, 0) + 1
            return a.warm_up if shapes[shape] <= 2 else 1.0

        def observe(plan, _total):  # replaces Engine._observe_costs: the H200's seconds for this step's shape
            rows = eng.drafter.last_cost.rows
            drafting = [k for _, k in plan if k]
            x = sum(1 + k for _, k in plan)
            t_v = gpu.verify(len(plan), x, eng.target_ctx.features_on) * warm(("v", eng.target_ctx.features_on, x))
            blocks = sum(1 + k for k in drafting)
            t_block = gpu.draft(blocks) * (warm(("d", blocks)) if blocks else 1.0)
            t_inj = gpu.inject(rows)
            # the old rule: the injection counted as part of the block forward, catch-up or not
            cost = ProposeCost(0.0, rows, t_block + t_inj) if a.catch_up_in_d else ProposeCost(t_inj, rows, t_block)
            if eng.drafting.samples_costs():  # as Engine._observe_costs: one in 8 of a long pause's steps
                eng._teach_costs(plan, t_v, cost)
            modelled["seconds"] += t_v + t_block + t_inj
            modelled["steps"] += 1
            modelled["drafting_steps"] += bool(drafting)

        eng._observe_costs = observe
        eng.drafting.costs = StepCosts(drop_first=True)  # as a GPU engine's: the first sample of each shape dropped
        total = Stats()
        for wave in range(a.requests):
            batch = prompts[wave * a.slots:(wave + 1) * a.slots]
            for res in llm.generate_many([Request(p, max_tokens=a.tokens, ignore_eos=True, cache_prompt=False)
                                          for p in batch]):
                total.merge_tokens(res.stats)
            d = total.as_dict()
            print(f"wave {wave}: tau {d['mean_accept_len']}, drafted {d['n_drafted']}, accepted {d['n_accepted']}, "
                  f"drafting steps {modelled['drafting_steps']} of {modelled['steps']}, pause "
                  f"{eng.drafting.pause}, backoff {eng.drafting.backoff}", flush=True)
        curves = {"draft": eng.drafting.costs.draft, "verify_features": eng.drafting.costs.verify_any[True],
                  "verify_plain": eng.drafting.costs.verify_any[False]}
        learned = {name: {int(p[0]): round(1e3 * p[1], 3) for p in c.points.values()} for name, c in curves.items()}
        print(f"learned (ms by tokens): {learned}", flush=True)
    tokens = total.n_generated
    plain_rate = a.slots / gpu.verify(a.slots, a.slots, False)
    rate = tokens / modelled["seconds"] if modelled["seconds"] else 0.0
    report = {"slots": a.slots, "requests": a.requests, "tokens": a.tokens, "drafter": pathlib.Path(a.drafter).name,
              "catch_up_in_d": a.catch_up_in_d, "inject_ms": a.inject_ms, "inject_row_us": a.inject_row_us,
              "warm_up": a.warm_up,
              "generated": tokens, "steps": modelled["steps"], "drafting_steps": modelled["drafting_steps"],
              "tau": total.as_dict()["mean_accept_len"], "modelled_tok_s": round(rate, 1),
              "modelled_plain_tok_s": round(plain_rate, 1), "modelled_speedup": round(rate / plain_rate, 3),
              "learned_ms": learned, "wall_s": round(time.perf_counter() - t0, 1)}
    print(json.dumps(report))
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
