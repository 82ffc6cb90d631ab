"""A DFlash block is non-causal: does the drafter draft its first K tokens better inside its whole trained block
than inside a block of K + 1? The frozen set's first 8 prompts of each kind, greedy, 96 tokens, copied chains on:
``short`` drafts K with a block of K + 1 (a fixed block, --draft-max K), ``full`` drafts 15 in the whole block and
verifies the first K (the verify span cut as Engine._trim_to_max_tokens cuts it). Writes block_ab_K<K>.json.

    .venv/bin/python docs/results/2026-12-07-cpu-e/block_ab.py 4
"""

import json
import sys

import pydflash  # noqa: F401  (loads libllama before numpy)
from pydflash.defaults import SHIPPED_DRAFTER, gemma_target
from pydflash.engine.engine import Engine
from pydflash.train import eval_fresh as ef

K = int(sys.argv[1])
prompts = ef.load()
sel = [p for k in ef.KINDS for p in [q for q in prompts if q["kind"] == k][:8]]
trim = Engine.__dict__["_trim_to_max_tokens"].__func__


def trim_k(running, drafts):
    trim(running, drafts)
    for s in running:
        if drafts.get(s.seq):
            drafts[s.seq] = drafts[s.seq][:K]


out = {}
for mode in ("short", "full"):
    ef.MODES["fixed"] = {"draft_max": K if mode == "short" else 15, "adaptive": False}
    Engine._trim_to_max_tokens = staticmethod(trim if mode == "short" else trim_k)
    r = ef.run_mode(str(gemma_target()), str(SHIPPED_DRAFTER), "fixed", sel, 96, 0, 2)
    out[mode] = {"wall_s": r["wall_s"], "kinds": {k: {"tau": v["tau"], "steps": v["steps"], "drafted": v["drafted"],
                                                      "accept_by_position": v["accept_by_position"][:K]}
                                                  for k, v in r["kinds"].items()}}
    print(K, mode, out[mode], flush=True)
json.dump(out, open(f"block_ab_K{K}.json", "w"), indent=1)
