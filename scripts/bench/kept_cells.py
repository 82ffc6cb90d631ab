"""What the prompt cache's kept cells cost a plain step: the engine in one process, 16 slots, C closed-loop clients
(each request replaced a few steps after it ends, as an HTTP client would), first traffic whose prompts recur, then
traffic that never repeats a prefix, with the cache off, with this tree's cache, with idle slots keeping their whole
sequences (``bound_residents=False``: the tree of the morning of 2026-12-05, and llama-server's way) and as it was
before 2026-12-05 (the device tier unbounded too, whole sequences kept: ``keep_answers``).

Every step's attention spans the KV cells in use, kept ones included, so a device tier holding up to a quarter of
the KV for entries that are almost never hit slows every step: on the H200 pydflash-server ran at 0.59-0.85x of
itself with the cache off on traffic that repeats nothing (docs/results/2026-12-05-h200-c). On a CPU the same
mechanism shows with a tiny target, whose steps are mostly attention.

    python scripts/bench/kept_cells.py [--clients 8] [--target GGUF] [--rounds 3] [--out docs/results/.../x.json]

At 16 clients every slot runs and only the device tier's entries are kept beside them; at 8, eight idle slots keep
the sequences of the requests they served (on an H100, 2026-12-05: 14 % of a step at 8 of 16 slots).

Default target: the tiny qwen3 factory pair (no sliding window, so a kept prompt can be cut from its answer, as
with Gemma-3-270M and short requests). Per variant and phase: ms per step (median over rounds, interleaved) and the
ratio to the cache-off engine in the same round; the device tier's counters.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import statistics
import sys
import tempfile
import time

import pydflash  # noqa: F401  (loads libllama before numpy)
from pydflash import api
from pydflash.cache.config import CacheConfig
from pydflash.config import EngineConfig
from pydflash.engine.request import Request

VARIANTS = {
    "off": CacheConfig(reuse=False, device_cells=0),
    "on": CacheConfig(),
    "residents-unbounded": CacheConfig(bound_residents=False),
    "before": CacheConfig(kept_share=1e9, device_probation=1 << 30, keep_answers=True, bound_residents=False),
}
SLOTS = 16
GAP = 3  # steps between a request's end and its replacement (the client's turnaround)


def phase(eng, make, total: int, clients: int, after_step=None) -> dict:
    """Closed loop: ``clients`` requests at once, each replaced GAP steps after it ends, until ``total`` were sent.
    ``after_step()``, if given, runs after every step (outside the timed steps' count, inside the wall time)."""
    sent, live, pending = 0, set(), []
    for _ in range(clients):
        live.add(eng.submit(make(sent)))
        sent += 1
    steps = tokens = 0
    t0 = time.perf_counter()
    while live or pending:
        events = eng.step()
        steps += 1
        if after_step is not None:
            after_step()
        while pending and pending[0] <= steps:
            pending.pop(0)
            live.add(eng.submit(make(sent)))
            sent += 1
        for ev in events:
            tokens += len(ev.tokens)
            if ev.finished:
                live.discard(ev.request_id)
                if sent + len(pending) < total:
                    pending.append(steps + GAP)
    wall = time.perf_counter() - t0
    return {"ms_per_step": 1e3 * wall / steps, "tok_s": tokens / wall, "steps": steps}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="", help="a GGUF (default: the tiny qwen3 factory target)")
    ap.add_argument("--clients", type=int, default=8, help="requests running at once (of 16 slots)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of " + ", ".join(VARIANTS))
    ap.add_argument("--tokens", type=int, default=256, help="max_tokens of each request")
    ap.add_argument("--pool", type=int, default=24, help="recurring prompts, sent in turn (the HTTP benchmark's fresh "
                    "set has 78: none comes back before anything kept of it is gone)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    target = a.target
    if not target:
        from pydflash.factory.pair import write_tiny_pair

        target = str(write_tiny_pair(pathlib.Path(tempfile.gettempdir()) / "pydflash-kept-cells", "qwen3").target)
    cfg = EngineConfig(n_slots=SLOTS, n_ctx_slot=4096, n_gpu_layers=0, n_threads=a.threads, draft_max=0,
                       check_invariants=False)
    chosen = ["off"] + [v for v in a.variants.split(",") if v != "off"]  # the reference runs every round
    unknown = [v for v in chosen if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {unknown}: choose from {', '.join(VARIANTS)}")
    engines = {v: api.load(target, None, config=cfg, cache=VARIANTS[v]).engine for v in chosen}
    n_vocab = engines["off"].target_ctx.n_vocab
    rows = {v: {"recur": [], "noreuse": []} for v in chosen}
    for r in range(a.rounds):
        order = chosen[r % len(chosen):] + chosen[:r % len(chosen)]
        for v in order:
            rng = random.Random(1000 * r)  # every variant gets the same requests in a round
            vocab = range(10, min(n_vocab, 2000))
            pool = [[rng.choice(vocab) for _ in range(rng.randint(40, 90))] for _ in range(a.pool)]
            eng = engines[v]

            def recur(i, pool=pool):
                return Request(prompt=pool[i % len(pool)], max_tokens=a.tokens, ignore_eos=True)

            def fresh(i, rng=rng, vocab=vocab):
                return Request(prompt=[rng.choice(vocab) for _ in range(rng.randint(30, 80))], max_tokens=a.tokens,
                               ignore_eos=True)

            rows[v]["recur"].append(phase(eng, recur, 6 * SLOTS, a.clients))
            rows[v]["noreuse"].append(phase(eng, fresh, 4 * SLOTS, a.clients))
    out = {"target": target, "slots": SLOTS, "clients": a.clients, "tokens": a.tokens, "rounds": a.rounds,
           "pool": a.pool,
           "variants": {v: str(VARIANTS[v]) for v in chosen}, "results": {}}
    for v in chosen:
        res = {}
        for ph, runs in rows[v].items():
            ratio = statistics.median(o["ms_per_step"] / x["ms_per_step"] for x, o in zip(runs, rows["off"][ph]))
            res[ph] = {"ms_per_step": round(statistics.median(x["ms_per_step"] for x in runs), 3),
                       "speed_vs_off": round(ratio, 3), "rounds": runs}
        pc = engines[v].prompt_cache
        res["device"] = pc.device.metrics() if pc.device is not None else None
        res["residents"] = {"cut": pc.residents_cut, "dropped": pc.residents_dropped}
        out["results"][v] = res
        paired = {ph: [round(o["ms_per_step"] / x["ms_per_step"], 2) for x, o in zip(rows[v][ph], rows["off"][ph])]
                  for ph in ("recur", "noreuse")}
        print(f"{v}: " + "; ".join(f"{ph} {res[ph]['ms_per_step']:.2f} ms/step ({res[ph]['speed_vs_off']:.2f}x off, "
                                   f"rounds {paired[ph]})" for ph in ("recur", "noreuse"))
              + f"; device {res['device']}; residents {res['residents']}", flush=True)
    for eng in engines.values():
        eng.close()
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
