"""The A/B of trim_ab_32.json: the frozen set's first 8 prompts of each kind, fixed 15-draft blocks, 96 tokens, this
tree with and without Engine._trim_to_max_tokens (replaced by a no-op), alternating, twice each.

    .venv/bin/python docs/results/2026-12-07-cpu-e/trim_ab.py
"""

import json

import pydflash  # noqa: F401  (loads libllama before numpy)
from pydflash.defaults import SHIPPED_DRAFTER, gemma_target
from pydflash.engine.engine import Engine
from pydflash.train import eval_fresh as ef

trim = Engine.__dict__["_trim_to_max_tokens"]
prompts = ef.load()
sel = [p for k in ef.KINDS for p in [q for q in prompts if q["kind"] == k][:8]]
out = {}
for _rep in range(2):
    for mode in ("on", "off"):
        Engine._trim_to_max_tokens = trim if mode == "on" else staticmethod(lambda r, d: None)
        r = ef.run_mode(str(gemma_target()), str(SHIPPED_DRAFTER), "fixed", sel, 96, 0, 2)
        out.setdefault(mode, []).append((r["wall_s"], {k: (v["tau"], v["drafted"]) for k, v in r["kinds"].items()}))
        print(mode, out[mode][-1], flush=True)
json.dump(out, open("trim_ab_32.json", "w"))
