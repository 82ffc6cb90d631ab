#!/usr/bin/env python3
"""Whether copies (pydflash/engine/copies.py) start at every load: the real engine on the tiny qwen3 pair, whose
greedy text loops on some prompts, with the step costs its policies learn replaced by a model of an H100's
(docs/results/2026-12-06-h100-d step traces: a plain step of 1 / 2 / 4 / 8 / 16 slots 1.17 / 1.29 / 1.40 / 2.0 / 2.5
ms, target features +8 %, a verify's first extra token +1 ms and each further one +0.06 ms, +-10 % noise; the random
tiny drafter's block 0.4 ms + 0.13 ms a drafting slot). Per load and seed: copy steps, copied tokens accepted, and
the steps the looping requests took for their tokens.

    .venv/bin/python scripts/bench/copies_replay.py [--loads 1,4,8,16] [--seeds 3] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from copies_rounds import model_engine  # noqa: E402  the same H100 model (scripts/bench is sys.path[0])
from pydflash import api  # noqa: E402
from pydflash.config import EngineConfig  # noqa: E402
from pydflash.engine.request import Request  # noqa: E402
from pydflash.factory import write_tiny_pair  # noqa: E402

LOOP = "the cat sat on the mat. the cat sat on the mat. the cat"
PROMPTS = [LOOP, "hello world", LOOP + " sat on", "once upon a time", "the cat sat on a hat. the cat sat on a hat. the"]


def run(target, drafter, n_slots: int, seed: int, tokens: int) -> dict:
    rng = random.Random(seed)
    with api.load(target, drafter, config=EngineConfig(n_ctx_slot=1024, n_slots=n_slots, adaptive=True)) as llm:
        model_engine(llm.engine, lambda drafting: 0.4e-3 + 0.13e-3 * drafting, lambda: rng.uniform(0.95, 1.15))
        texts = [PROMPTS[(seed + i) % len(PROMPTS)] for i in range(2 * n_slots)]
        reqs = [Request(llm.tokenize(t), max_tokens=tokens, ignore_eos=True) for t in texts]
        results = llm.generate_many(reqs)
    loops = [r.stats for t, r in zip(texts, results) if t.startswith("the cat")]
    return {"slots": n_slots, "seed": seed, "copy_steps": sum(s.n_lookup_steps for s in loops),
            "copied_accepted": sum(s.n_lookup_accepted for s in loops), "looping_steps": sum(s.n_steps for s in loops),
            "looping_tokens": sum(s.n_generated for s in loops)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--loads", default="1,4,8,16")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    pair = write_tiny_pair(pathlib.Path(tempfile.mkdtemp()), arch="qwen3", seed=0)
    rows = []
    for n in [int(x) for x in args.loads.split(",")]:
        for seed in range(args.seeds):
            rows.append(run(pair.target, pair.drafter, n, seed, args.tokens))
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps({"rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
