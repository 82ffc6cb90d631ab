"""Cost of one plain decode step against the number of slots, with the KV as one pool or one stream per sequence.

Issue 13: a step of N slots costs far more per slot than a 270M model should (on the H200 ~1.4 ms at one slot,
6.3 ms at 16, ~30 ms at 128). Two causes were read from the vendored llama.cpp: one argmax kernel per output row
(patches/0005 takes one for the batch) and the unified KV, where every token attends over every cell in use, with
a mask the host builds per step. This script times each in isolation: N sequences prefilled with P tokens each,
then steps of one token per sequence under the greedy backend sampler, kv_unified on and off.

    .venv/bin/python scripts/bench_slots.py --slots 1,16,64 --prompt 256 [--ngl -1] [--out docs/x.json]

Prints and writes the median step time per (layout, N), and per slot. PYDFLASH_PER_ROW_GREEDY=1 in the
environment restores upstream's per-row argmax for a before/after of patches/0005.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import pydflash  # noqa: F401  (loads libllama before numpy)
from pydflash.defaults import gemma_target
from pydflash.native import Context, ContextParams, Model, ModelParams, TokenBatch

TEXT = "The quick brown fox jumps over the lazy dog while the cat sleeps in the warm afternoon sun. " * 200


def step_ms(model: Model, n: int, prompt: int, ctx_slot: int, unified: bool, reps: int, threads: int) -> float:
    ctx = Context(model, ContextParams(n_ctx=n * ctx_slot, n_batch=512, n_ubatch=512, n_seq_max=n,
                                       n_outputs_max=n, n_outputs_max_per_seq=1, n_threads=threads,
                                       kv_unified=unified))
    toks = model.tokenize(TEXT)[:prompt]
    b = TokenBatch(max(512, n))
    for s in range(n):  # one sequence at a time: the prefill is not what is timed
        for a in range(0, len(toks), 512):
            chunk = toks[a:a + 512]
            b.clear()
            b.add(chunk, a, s, [False] * (len(chunk) - 1) + [True])
            ctx.decode(b)
    times = []
    for r in range(reps + 1):  # the first step allocates the graph for this shape: dropped
        b.clear()
        for s in range(n):
            b.add([toks[r % len(toks)]], len(toks) + r, s, True)
        t = time.perf_counter()
        ctx.decode(b)
        ctx.picks(range(n))
        times.append((time.perf_counter() - t) * 1e3)
    ctx.close()
    return statistics.median(times[1:])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slots", default="1,8,16,64")
    ap.add_argument("--prompt", type=int, default=256, help="tokens in each sequence before the timed steps")
    ap.add_argument("--ctx-slot", type=int, default=1088, help="cells per sequence (n_ctx = slots x this)")
    ap.add_argument("--layouts", default="unified,streams")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--ngl", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.prompt + args.reps + 2 > args.ctx_slot:
        ap.error("--ctx-slot must hold --prompt + --reps + 2 tokens")
    model = Model(gemma_target(), ModelParams(n_gpu_layers=args.ngl))
    rows = []
    for layout in args.layouts.split(","):
        for n in map(int, args.slots.split(",")):
            ms = step_ms(model, n, args.prompt, args.ctx_slot, layout == "unified", args.reps, args.threads)
            rows.append({"layout": layout, "slots": n, "step_ms": round(ms, 3), "ms_per_slot": round(ms / n, 4)})
            print(f"{layout:8s} slots {n:4d}: {ms:9.3f} ms/step  {ms / n:7.4f} ms/slot", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "per_row_greedy": bool(os.environ.get("PYDFLASH_PER_ROW_GREEDY")),
                       "rows": rows}, f, indent=1)
    model.close()


if __name__ == "__main__":
    sys.exit(main())
