#!/usr/bin/env python3
"""What a drafter costs an engine that is not drafting (issue 13): plain steps with and without one loaded.

Three engines on the same target, 16 requests decoding side by side, interleaved over rounds:
- ``plain``: no drafter;
- ``paused``: a drafter, adaptive drafting held in a pause (no drafts, target features off);
- ``features on``: the same, with target-feature extraction forced on every step.
``paused`` against ``plain`` is the cost of the feature hooks alone: patches/0004 keeps the hooked layer inputs as
graph outputs once enabled (toggling them must not change the graph's allocation plan), and only stops the copies.

    .venv/bin/python scripts/bench_hooks.py [--model tiny|gemma] [--slots 16] [--rounds 5] [--out docs/bench_hooks_cpu.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import statistics
import time

from pydflash import api
from pydflash.config import EngineConfig
from pydflash.defaults import cache_dir, default_pair
from pydflash.engine.request import Request
from pydflash.factory import write_tiny_pair

MODES = ("plain", "paused", "features on")


def engines(target, drafter, cfg: EngineConfig) -> dict:
    out = {"plain": api.load(target, None, cfg)}
    for mode in MODES[1:]:
        llm = api.load(target, drafter, dataclasses.replace(cfg, adaptive=True))
        policy = llm.engine.drafting
        policy.calibrated, policy.pause, policy.backoff = 2, 10**9, 256  # never drafts, never probes
        if mode == "features on":
            eng = llm.engine
            keep = eng._extract_features_if_needed
            eng._extract_features_if_needed = lambda plan, chunks, _features, n, keep=keep: keep(plan, chunks, True, n)
        out[mode] = llm
    return out


def run(llm, n_slots: int, tokens: int) -> tuple[float, float]:
    """(ms per step, verify ms per step) for n_slots concurrent requests."""
    eng = llm.engine
    reqs = [Request([1, 5 + i, 7, 9], max_tokens=tokens, ignore_eos=True, cache_prompt=False) for i in range(n_slots)]
    v0 = eng.stats.t_verify
    t0 = time.perf_counter()
    res = llm.generate_many(reqs)
    wall = time.perf_counter() - t0
    steps = max(r.stats.n_steps for r in res)
    return 1e3 * wall / steps, 1e3 * (eng.stats.t_verify - v0) / steps


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("tiny", "gemma"), default="tiny")
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ngl", type=int, default=0)
    ap.add_argument("--out", default="docs/bench_hooks_cpu.md")
    args = ap.parse_args(argv)
    if args.model == "tiny":
        pair = write_tiny_pair(cache_dir() / "tiny" / "bench-hooks-llama", arch="llama", seed=0)
    else:
        pair = default_pair()
    cfg = EngineConfig(n_slots=args.slots, n_ctx_slot=args.tokens + 64, n_threads=args.threads,
                       n_gpu_layers=args.ngl)
    llms = engines(pair.target, pair.drafter, cfg)
    for llm in llms.values():
        run(llm, args.slots, 16)  # warm-up: graph allocation at these shapes
    rows = {m: [] for m in MODES}
    for _ in range(args.rounds):
        for m in MODES:
            rows[m].append(run(llms[m], args.slots, args.tokens))
    plain = statistics.median(r[0] for r in rows["plain"])
    lines = [f"# A drafter's cost while not drafting ({args.model} target, {args.slots} requests)", "",
             f"`scripts/bench_hooks.py --model {args.model} --slots {args.slots} --rounds {args.rounds} --tokens "
             f"{args.tokens} --threads {args.threads} --ngl {args.ngl}`: engines interleaved over rounds, medians.", "",
             "| mode | ms/step | verify ms/step | vs plain |", "|---|---|---|---|"]
    for m in MODES:
        step = statistics.median(r[0] for r in rows[m])
        verify = statistics.median(r[1] for r in rows[m])
        lines.append(f"| {m} | {step:.3f} | {verify:.3f} | {plain / step:.3f}x |")
    for llm in llms.values():
        llm.close()
    text = "\n".join(lines) + "\n"
    pathlib.Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
