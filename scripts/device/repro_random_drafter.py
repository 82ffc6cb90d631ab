#!/usr/bin/env python3
"""Issue 12 item 2: does a random DFlash drafter for Gemma-3-270M make speculative steps fail on the GPU?

Runs the engine (pydflash.api) with random drafters of a few shapes (pydflash.factory.for_target, as
scripts/bench.py makes them) and the shipped drafter, fixed block and adaptive, 1 and 4 requests, and prints for
each case either the output or the full traceback of the first failure (which engine call raised it). Run with
PYDFLASH_VERBOSE=1 for llama.cpp's log (the "init: all entries in the batch must have the same content types"
line comes from there, on stderr).

    PYDFLASH_VERBOSE=1 python3 scripts/device/repro_random_drafter.py --ngl -1 --out $OUT/repro.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
import traceback

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from pydflash import api  # noqa: E402
from pydflash.config import EngineConfig  # noqa: E402
from pydflash.defaults import gemma_target  # noqa: E402
from pydflash.engine.request import Request  # noqa: E402
from pydflash.factory.for_target import write_random_drafter_for  # noqa: E402

SHIPPED = REPO / "pydflash" / "models" / "gemma-3-270m-dflash-q8_0.gguf"
PROMPTS = ["The history of the printing press begins", "def add(a, b):\n", "Emoji: 😀", "Once upon a time"]


def run_case(target, drafter, ngl: int, slots: int, adaptive: bool, draft_max, tokens: int) -> dict:
    cfg = EngineConfig(n_slots=slots, n_ctx_slot=1024, n_gpu_layers=ngl, adaptive=adaptive, draft_max=draft_max)
    t0 = time.perf_counter()
    case = {"drafter": str(drafter), "slots": slots, "adaptive": adaptive, "draft_max": draft_max}
    try:
        llm = api.load(target, drafter, cfg)
    except Exception as exc:  # report, do not stop the other cases
        return {**case, "ok": False, "stage": "load", "error": repr(exc), "traceback": traceback.format_exc()}
    try:
        with llm:
            reqs = [Request(llm.tokenize(p), max_tokens=tokens, ignore_eos=True) for p in PROMPTS[:slots]]
            results = llm.generate_many(reqs)
            st = llm.engine.stats
            return {**case, "ok": True, "texts": [r.text for r in results],
                    "drafted": sum(r.stats.n_drafted for r in results),
                    "accepted": sum(r.stats.n_accepted for r in results),
                    "engine_steps": getattr(st, "n_steps", None), "seconds": round(time.perf_counter() - t0, 2)}
    except Exception as exc:
        return {**case, "ok": False, "stage": "generate", "error": repr(exc), "traceback": traceback.format_exc()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ngl", type=int, default=-1)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--out", default="repro_random_drafter.json")
    args = ap.parse_args()
    target = gemma_target()
    work = pathlib.Path(target).parent
    drafters = {
        "random 1-layer block 16 (bench.py's)": write_random_drafter_for(target, work / "gemma3-random-drafter.gguf"),
        "random 2-layer block 16": write_random_drafter_for(target, work / "gemma3-random-drafter-2l.gguf", n_layer=2),
        "random 1-layer block 8": write_random_drafter_for(target, work / "gemma3-random-drafter-b8.gguf", block_size=8),
        "shipped": SHIPPED,
    }
    cases = []
    for name, d in drafters.items():
        for slots, adaptive, k in ((1, False, None), (4, False, None), (1, True, None), (4, False, 3)):
            print(f"=== {name}: slots {slots}, adaptive {adaptive}, draft_max {k}", file=sys.stderr, flush=True)
            res = {"name": name, **run_case(target, d, args.ngl, slots, adaptive, k, args.tokens)}
            print(json.dumps({k2: v for k2, v in res.items() if k2 != "traceback"}), file=sys.stderr, flush=True)
            if not res["ok"]:
                print(res["traceback"], file=sys.stderr, flush=True)
            cases.append(res)
    # plain decoding through the same engine, for the texts
    cases.append({"name": "plain", **run_case(target, None, args.ngl, 4, False, None, args.tokens)})
    pathlib.Path(args.out).write_text(json.dumps(cases, indent=1) + "\n")
    print(json.dumps([{k: c.get(k) for k in ("name", "slots", "adaptive", "draft_max", "ok", "stage", "error")}
                      for c in cases], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
