"""Sampling with speculation: rejection sampling against sample-and-match, side by side.

Gemma-3-270M Q4_K_M target with the shipped DFlash drafter, one slot, a fixed draft block (so both modes draft
the same number of tokens per step), at temperature 0.7 and 1.0 (top-p 0.9 where --top-p says so); plain
sampling (no drafter) and greedy speculation as references. The modes run interleaved over rounds in one
process; per mode: acceptance rate, tau (tokens per step, bonus included), tok/s, and the per-step time split
(draft = drafter forward, verify = target forward, commit = acceptance + rollback + emit, host = the rest).

    .venv/bin/python scripts/bench/sampling.py [--rounds 2] [--tokens 64] [--draft-max 4] [--ngl 0]
        [--top-p 1.0] [--out docs/results/2026-12-01-cpu/sampling_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time

from pydflash import api
from pydflash.config import EngineConfig
from pydflash.defaults import SHIPPED_DRAFTER, gemma_target

PROMPTS = [
    'def is_prime(n):\n    """Return True if n is a prime number."""\n',
    "import json\nimport pathlib\n\n\ndef load_config(path):\n    \"\"\"Read a JSON config file.\"\"\"\n",
    "Write a short story about a lighthouse keeper.\n\n",
]
MODES = [  # (name, needs the drafter, request keywords beyond temperature)
    ("plain", False, {}),
    ("greedy spec (T=0)", True, {"temperature": 0.0}),
    ("match", True, {"sampling_mode": "match"}),
    ("rejection", True, {"sampling_mode": "rejection"}),
]


def run(llm, temp: float, top_p: float, kw: dict, tokens: int, seed: int) -> dict:
    eng = llm.engine
    st = eng.stats
    before = (st.t_draft, st.t_verify, st.t_commit, st.t_host)
    req_kw = dict(max_tokens=tokens, ignore_eos=True, temperature=temp, top_p=top_p, seed=seed) | kw
    gen = drafted = accepted = steps = 0
    wall = prefill = 0.0
    for p in PROMPTS:
        t0 = time.perf_counter()
        r = llm.generate(p, **req_kw)
        wall += time.perf_counter() - t0
        prefill += r.stats.t_prefill
        gen, steps = gen + r.stats.n_generated, steps + r.stats.n_steps
        drafted, accepted = drafted + r.stats.n_drafted, accepted + r.stats.n_accepted
    after = (st.t_draft, st.t_verify, st.t_commit, st.t_host)
    return {
        "tok_s": gen / (wall - prefill),
        "accept": accepted / drafted if drafted else 0.0,
        "tau": gen / steps,
        "per_step_ms": {k: 1000 * (a - b) / steps
                        for k, a, b in zip(("draft", "verify", "commit", "host"), after, before)},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--draft-max", type=int, default=4)
    ap.add_argument("--ngl", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--out", default=None, help="write the raw results here (JSON)")
    args = ap.parse_args()

    cfg = EngineConfig(n_slots=1, n_ctx_slot=512, n_gpu_layers=args.ngl, adaptive=False, draft_max=args.draft_max)
    target = gemma_target()
    llms = {False: api.load(target, config=cfg), True: api.load(target, SHIPPED_DRAFTER, config=cfg)}
    rows: dict[tuple, list[dict]] = {}
    try:
        for rnd in range(args.rounds):
            for temp in (0.7, 1.0):
                for name, spec, kw in MODES:
                    if kw.get("temperature") == 0.0 and temp != 0.7:  # greedy does not depend on T: once
                        continue
                    r = run(llms[spec], temp, args.top_p, kw, args.tokens, seed=100 + rnd)
                    rows.setdefault((temp, name), []).append(r)
    finally:
        for llm in llms.values():
            llm.close()

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, commit {commit}, "
          f"ngl {args.ngl}, draft_max {args.draft_max}, {args.tokens} tokens x {len(PROMPTS)} prompts x "
          f"{args.rounds} rounds, top_p {args.top_p}")
    print("| T | mode | accept | tau | tok/s | draft ms | verify ms | commit ms | host ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    out = []
    for (temp, name), rs in rows.items():
        med = lambda f, rs=rs: statistics.median(f(r) for r in rs)  # noqa: E731
        split = [med(lambda r, k=k: r["per_step_ms"][k]) for k in ("draft", "verify", "commit", "host")]
        print(f"| {temp} | {name} | {med(lambda r: r['accept']):.3f} | {med(lambda r: r['tau']):.2f} | "
              f"{med(lambda r: r['tok_s']):.1f} | " + " | ".join(f"{x:.2f}" for x in split) + " |")
        out.append({"temperature": temp, "mode": name, "rounds": rs})
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "commit": commit, "results": out}, f, indent=1)


if __name__ == "__main__":
    main()
