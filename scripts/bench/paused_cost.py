"""What a paused step costs against a plain one: the speculative engine with drafting paused (a useless drafter's
steady state, and most steps of a drafter that does not pay on the traffic) against the engine without a drafter,
in one process, interleaved. Users turn speculation on and forget it, so a paused step must cost what a plain one
does.

    python scripts/bench/paused_cost.py [--ngl -1] [--slots 1,16] [--steps 1500] [--repeats 3] [--out F.json]
        [--capacity 16 --cache]    (as a server runs it: 16 engine slots whatever the load, the prompt cache on)
        [--request-tokens 256]     (requests of 256 tokens, each replaced when it ends, the prompts of the frozen
                                    fresh set in turn: a request boundary every 256 steps, as the HTTP benchmark's)
        [--step-trace DIR]         (each variant's engine writes its step trace to DIR/<variant>.<slots>.<pid>;
                                    scripts/bench/trace_summary.py reads it: which kind of step took the time)

Variants, each its own engine over the same target file, all loaded at once and run in turn (round r of each
before round r + 1 of any):
- ``plain``: no drafter (``pydflash-server --no-spec``);
- ``paused``: the shipped drafter, adaptive drafting held in a pause (no drafts, no feature copies): what the
  server's steady state is between probes;
- ``paused-notaps``: the same, the target graph never keeping the drafter's layer inputs as outputs (the feature
  layers never switched on): what the taps themselves cost a paused forward;
- ``adaptive``: the shipped drafter under the real policy (probes, lead-ins and all), its defaults;
- ``plain-nodevice``, ``plain-nocache``: ``plain`` with the prompt cache's device tier off (``--cache-device 0``:
  the contexts get no spare sequence ids) and with every tier off (``--no-cache-reuse --cache-ram 0 --cache-device
  0``). Through HTTP on the H200 (2026-12-05, docs/results/2026-12-05-h200-c) pydflash plain ran at 0.59-0.85x of
  itself with the cache off on traffic that never reuses a prefix, and at 0.66x at 16 clients on recurring
  prompts, also when every request asked for no cache (``cache_prompt: false``); on this CPU the two run alike.
  These variants tell whether the engine alone (no HTTP) reproduces it, and which part of the cache it follows.

On the H200 (2026-12-05, docs/benchmarks.md) a paused step cost 1.012x a plain one at 1 slot and the kept taps
~0.6 % of it; taking the taps out of the graph for a pause and putting them back (a patched llama.cpp call tried
that day) cost 13.6 ms per change at 1 slot and 56 ms at 16 (two scheduler reserves and new CUDA graphs), more than
a pause of ~4,000 steps saves: the taps stay. Through HTTP the same day the shipped pair's non-drafting steps cost
~5 % more than plain ones (0.92x of plain at 1 client), so what differs in the server (16 slots with one busy, the
prompt cache on) is what ``--capacity 16 --cache`` puts in here.

Per variant and slot count: wall ms per step, the target's native ms per step (its forwards, their wait included),
and the host's (Python) share; the ratio of each to ``plain`` is the median of the paired rounds.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import pydflash  # noqa: F401  (loads libllama before numpy)
from pydflash import api
from pydflash.cache.config import CacheConfig
from pydflash.config import EngineConfig
from pydflash.engine.request import Request
from pydflash.engine.trace import StepTrace

VARIANTS = ("plain", "paused", "paused-notaps", "adaptive", "plain-nodevice", "plain-nocache")
# the prompt cache of each variant: the default (slots and the device tier) unless named here
CACHES = {"plain-nodevice": CacheConfig(device_cells=0), "plain-nocache": CacheConfig(reuse=False, device_cells=0)}
PROMPT = ("The lighthouse keeper had kept a log for thirty years, and every entry began the same way: the date, "
          "the weather, and the number of ships that passed. On the morning the fog came in,")


def load(variant: str, target: str, drafter: str, slots: int, n_ctx: int, ngl: int, threads: int, trace: str = ""):
    """slots: the engine's (a server's -np); fewer requests may run in it (``fill``). trace: the path of this
    engine's own step trace (pydflash/engine/trace.py), '' for none."""
    from pydflash.native import context as native_context

    spec = not variant.startswith("plain")
    cfg = EngineConfig(n_slots=slots, n_ctx_slot=n_ctx, n_gpu_layers=ngl, n_threads=threads, adaptive=spec,
                       check_invariants=False, **({} if spec else {"draft_max": 0}))
    real = native_context.llama_set_embeddings_layer_inp
    if variant == "paused-notaps":  # the taps are set in the context's constructor: leave them out
        native_context.llama_set_embeddings_layer_inp = lambda *a: None
    try:
        llm = api.load(target, drafter if spec else None, config=cfg, cache=CACHES.get(variant))
    finally:
        native_context.llama_set_embeddings_layer_inp = real
    eng = llm.engine
    if eng.trace is not None:  # PYDFLASH_STEP_TRACE would have every engine here append to one file
        eng.trace.close()
    eng.trace = StepTrace(trace) if trace else None
    if variant.startswith("paused"):
        eng.drafting.paused_step = lambda n: True  # a pause that never ends: no drafts, no features
        eng.drafting.samples_costs = lambda: False
        eng.target_ctx.set_features(False)
    return llm


class Requests:
    """The requests of one engine: one long prompt, or (``--request-tokens``) the fresh set's prompts in turn, the
    same sequence for every variant."""

    def __init__(self, max_tokens: int, cache: bool, prompts: list[str] | None = None):
        self.max_tokens, self.cache, self.prompts, self.i = max_tokens, cache, prompts or [PROMPT], 0

    def next(self) -> Request:
        prompt = self.prompts[self.i % len(self.prompts)]
        self.i += 1
        return Request(prompt, max_tokens=self.max_tokens, ignore_eos=True, cache_prompt=self.cache)


def fresh_prompts() -> list[str]:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # scripts/ is not a package
    from http_vs_native import fresh_prompts as frozen  # the sha-checked frozen set

    return frozen()


def fill(llm, active: int, reqs: Requests) -> None:
    for _ in range(active):
        llm.engine.submit(reqs.next())
    while any(s is not None and not s.prefilled for s in llm.engine.slots) or llm.engine.queue:
        llm.engine.step()


def measure(llm, steps: int, reqs: Requests) -> dict:
    """Per-step figures over the next ``steps`` steps; a request that finishes (``adaptive`` commits several tokens
    a step) is replaced at once, its prompt's prefill counted in the round."""
    eng = llm.engine
    clocks = [eng.target_ctx] + ([eng.drafter.ctx] if eng.drafter is not None else [])
    n0 = [c.t_native for c in clocks]
    g0 = sum(len(s.generated) for s in eng.slots if s is not None)
    t0 = time.perf_counter()
    replaced = 0
    for _ in range(steps):
        for ev in eng.step():
            if ev.finished:
                replaced += 1
                g0 -= len(ev.result.tokens)
                eng.submit(reqs.next())
    wall = time.perf_counter() - t0
    nat = [c.t_native - a for c, a in zip(clocks, n0)]
    gen = sum(len(s.generated) for s in eng.slots if s is not None) - g0
    active = max(1, sum(s is not None for s in eng.slots))
    return {"replaced": replaced, "step_ms": 1e3 * wall / steps, "target_ms": 1e3 * nat[0] / steps,
            "drafter_ms": 1e3 * sum(nat[1:]) / steps, "host_ms": 1e3 * (wall - sum(nat)) / steps,
            "tokens_per_step": gen / steps / active}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ngl", type=int, default=-1)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--slots", default="1,16", help="concurrent requests, one level each")
    ap.add_argument("--capacity", type=int, default=0,
                    help="the engine's slots (a server's -np; default: as many as requests), e.g. 16 as served")
    ap.add_argument("--cache", action="store_true", help="requests keep the prompt cache on (a server's default)")
    ap.add_argument("--request-tokens", type=int, default=0,
                    help="requests of this many tokens over the fresh prompt set, replaced as they end (0: one long "
                         "request per slot)")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--target", default="")
    ap.add_argument("--drafter", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--step-trace", default="", help="a folder: each engine's step trace (one JSON line a step)")
    a = ap.parse_args(argv)
    from pydflash.defaults import SHIPPED_DRAFTER, gemma_target
    target, drafter = a.target or str(gemma_target()), a.drafter or str(SHIPPED_DRAFTER)
    variants = [v for v in a.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"paused_cost: unknown variant(s) {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    out = {"target": target, "drafter": drafter, "ngl": a.ngl, "steps": a.steps, "repeats": a.repeats,
           "capacity": a.capacity, "cache": a.cache, "request_tokens": a.request_tokens, "levels": {}}
    prompts = fresh_prompts() if a.request_tokens else None  # read and checked once, shared by every engine
    if a.step_trace:
        pathlib.Path(a.step_trace).mkdir(parents=True, exist_ok=True)
    for slots in [int(x) for x in a.slots.split(",")]:
        # one token a step (adaptive, drafting, more: its requests are replaced as they finish)
        n_ctx = 256 + a.warmup + a.repeats * a.steps
        llms = {v: load(v, target, drafter, max(slots, a.capacity), n_ctx, a.ngl, a.threads,
                        f"{a.step_trace}/{v}.{slots}" if a.step_trace else "") for v in variants}
        reqs = {v: Requests(a.request_tokens or n_ctx - 200, a.cache, prompts) for v in variants}
        for v, llm in llms.items():
            fill(llm, slots, reqs[v])
            measure(llm, a.warmup, reqs[v])  # warm-up, its requests replaced as they end too
        rounds = {v: [] for v in variants}
        for r in range(a.repeats):
            order = variants[r % len(variants):] + variants[:r % len(variants)]
            for v in order:
                rounds[v].append(measure(llms[v], a.steps, reqs[v]))
        for llm in llms.values():
            llm.close()
        level = {}
        for v in variants:
            med = {k: statistics.median(x[k] for x in rounds[v]) for k in rounds[v][0]}
            row = {"median": {k: round(x, 4) for k, x in med.items()}, "rounds": rounds[v]}
            if "plain" in rounds and v != "plain":
                row["step_vs_plain"] = round(statistics.median(
                    x["step_ms"] / p["step_ms"] for x, p in zip(rounds[v], rounds["plain"])), 4)
            level[v] = row
        out["levels"][str(slots)] = level
        if a.out:  # after each level: a run cut short keeps what it measured
            pathlib.Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
        print(f"slots {slots}: " + "; ".join(
            f"{v} {level[v]['median']['step_ms']:.3f} ms/step (target {level[v]['median']['target_ms']:.3f}, "
            f"host {level[v]['median']['host_ms']:.3f})" + (f" {level[v]['step_vs_plain']:.3f}x plain"
                                                             if "step_vs_plain" in level[v] else "")
            for v in variants), flush=True)
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
