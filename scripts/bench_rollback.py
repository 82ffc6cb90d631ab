"""Cost of one rollback (llama_memory_seq_rm of a sequence's tail) against the slots sharing the KV (patches/0009).

A speculative step rolls back every slot's rejected drafts, in the target and in the drafter. Upstream's seq_rm
scans every cell of the cache for each call; patches/0009 walks the sequence's own cells from p0 on. This script
fills N sequences of the Gemma-3 target (1024 cells each, one pool or one stream per sequence), then times
seq_rm of 5 positions of one sequence, the tokens decoded back untimed between calls (median of --reps).

    .venv/bin/python scripts/bench_rollback.py --slots 1,16,64 [--lib-dirs A,B] [--out docs/rollback_cpu.json]

--lib-dirs runs the same measurement once per native build (PYDFLASH_LIB_DIR), each in its own process, side by
side in one run: e.g. a build without the patch and one with it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import pydflash  # noqa: F401  (loads libllama before numpy)
from pydflash.defaults import gemma_target
from pydflash.native import Context, ContextParams, Model, TokenBatch


def rollback_us(model: Model, slots: int, unified: bool, reps: int) -> float:
    """Median microseconds of one seq_rm dropping a sequence's last 5 positions."""
    ctx = Context(model, ContextParams(n_ctx=1024 * slots, n_batch=512, n_ubatch=512, n_seq_max=slots,
                                      kv_unified=unified))
    b = TokenBatch(512)
    fill = [2] + [100 + i % 50 for i in range(199)]
    for s in range(slots):
        b.clear()
        b.add(fill, 0, s, False)
        ctx.decode(b)
    times = []
    for r in range(reps):
        s = r % slots
        # the first memory call after a decode costs ~30-40 us on this CPU whatever it does (seq_pos_max too): a
        # step pays that once, patched or not; an untimed one leaves the timed call with its own work
        ctx.seq_pos_max(s)
        t = time.perf_counter()
        ctx.seq_rm(s, 195)
        times.append(time.perf_counter() - t)
        b.clear()
        b.add(fill[195:], 195, s, False)
        ctx.decode(b)
    ctx.close()
    return statistics.median(times) * 1e6


def measure(slots: list[int], reps: int) -> list[dict]:
    model = Model(gemma_target())
    rows = []
    for n in slots:
        for unified in (True, False):
            us = rollback_us(model, n, unified, reps)
            rows.append({"slots": n, "layout": "unified" if unified else "streams", "seq_rm_us": round(us, 2)})
            print(f"  {n:3d} slots, {rows[-1]['layout']:8s}: {us:7.2f} us a rollback", file=sys.stderr)
    model.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slots", default="1,16,64")
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--lib-dirs", default="", help="native builds to compare, comma-separated (default: this one)")
    ap.add_argument("--json-rows", action="store_true", help=argparse.SUPPRESS)  # a child's output
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    slots = [int(x) for x in a.slots.split(",")]
    if a.json_rows or not a.lib_dirs:
        rows = measure(slots, a.reps)
        if a.json_rows:
            print(json.dumps(rows))
            return
        runs = [{"lib_dir": os.environ.get("PYDFLASH_LIB_DIR", "default"), "rows": rows}]
    else:
        runs = []
        for lib in a.lib_dirs.split(","):
            print(f"bench_rollback: {lib}", file=sys.stderr)
            out = subprocess.run([sys.executable, __file__, "--slots", a.slots, "--reps", str(a.reps), "--json-rows"],
                                 env={**os.environ, "PYDFLASH_LIB_DIR": lib}, capture_output=True, text=True,
                                 check=True)
            sys.stderr.write("\n".join(ln for ln in out.stderr.splitlines() if "us a rollback" in ln) + "\n")
            runs.append({"lib_dir": lib, "rows": json.loads(out.stdout.strip().splitlines()[-1])})
    report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "target": str(gemma_target()),
              "reps": a.reps, "cells_per_slot": 1024, "runs": runs}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)
        print(f"bench_rollback: wrote {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
