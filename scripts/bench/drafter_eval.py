"""Acceptance of a drafter through pydflash on held-out prompts (never trained on).

    .venv/bin/python scripts/bench/drafter_eval.py [--n 40] [--tokens 256] [--ngl 0] \\
        [--out docs/results/2026-11-29-cpu/drafter_eval_cpu.json]
    .venv/bin/python scripts/bench/drafter_eval.py --suite [--n 4] [--only repetition] ...   # the drafter suite

Without --suite: the first `prompt_len` tokens of each row of pydflash/train/heldout_eval.npz, split into code and
prose. With --suite: pydflash/train/eval_suite.py, bucketed by kind (code, prose, chat) and prompt length (under
16, 16-128, over 128 tokens) plus the repetition suite, each bucket against its issue-14 target (--n prompts per
kind and written length). Generation is greedy with the trained block (15 drafts per step), one request at a
time. tau counts the bonus token.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import pydflash  # noqa: F401  (loads libllama before numpy)
import numpy as np

from pydflash import api
from pydflash.config import EngineConfig
from pydflash.defaults import SHIPPED_DRAFTER, gemma_target
from pydflash.engine.stats import Stats

HELDOUT = pathlib.Path(__file__).resolve().parents[2] / "pydflash" / "train" / "heldout_eval.npz"


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=40, help="prompts per split")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--ngl", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--drafter", default=str(SHIPPED_DRAFTER))
    ap.add_argument("--out", default=None)
    ap.add_argument("--suite", action="store_true", help="the bucketed drafter suite and repetition suite")
    ap.add_argument("--no-lookup", action="store_true",
                    help="the drafter's blocks only: no chains copied from the text (engine/lookup.py)")
    ap.add_argument("--only", default="", help="with --suite: comma-separated kinds (code, prose, chat, repetition)")
    args = ap.parse_args(argv)
    if args.suite:
        return run_suite(args)
    data = np.load(HELDOUT)
    p_len = int(data["prompt_len"])
    cfg = EngineConfig(n_ctx_slot=p_len + args.tokens + 32, n_gpu_layers=args.ngl, n_threads=args.threads,
                       lookup=not args.no_lookup)
    report = {"drafter": pathlib.Path(args.drafter).name, "tokens": args.tokens, "ngl": args.ngl}
    with api.load(gemma_target(), args.drafter, cfg) as llm:
        for split in ("code", "prose"):
            total = Stats()
            t0 = time.perf_counter()
            for row in data[f"{split}_tokens"][: args.n]:
                res = llm.generate([int(t) for t in row[:p_len]], max_tokens=args.tokens)
                total.merge_tokens(res.stats)
            d = total.as_dict()
            report[split] = {"prompts": args.n, "tau": d["mean_accept_len"], "accept_rate": d["accept_rate"],
                             "n_generated": d["n_generated"], "accept_by_position": d["accept_by_position"],
                             "wall_s": round(time.perf_counter() - t0, 1)}
            print(split, report[split], flush=True)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


def run_suite(args) -> None:
    from pydflash.train import eval_suite as suite

    kinds = set(filter(None, args.only.split(",")))
    chosen = [p for p in suite.prompts(args.n) if not kinds or p.kind in kinds]
    cfg = EngineConfig(n_ctx_slot=320 + args.tokens, n_gpu_layers=args.ngl, n_threads=args.threads,
                       lookup=not args.no_lookup)
    totals: dict[str, Stats] = {}
    per_prompt = []
    with api.load(gemma_target(), args.drafter, cfg) as llm:
        model = llm.engine.model
        for p in chosen:
            # chat turns as the server sends them: <start_of_turn> and friends are one token each
            toks = p.prompt if isinstance(p.prompt, list) else model.tokenize(
                p.prompt, add_special=True, parse_special=p.kind == "chat")
            res = llm.generate(toks, max_tokens=args.tokens)
            name = suite.bucket(p.kind, len(toks))
            totals.setdefault(name, Stats()).merge_tokens(res.stats)
            d = res.stats.as_dict()
            per_prompt.append({"bucket": name, "name": p.name, "prompt_tokens": len(toks), "tau": d["mean_accept_len"],
                               "n_generated": d["n_generated"], "lookup_steps": d["n_lookup_steps"]})
            print(f"{name:14s} {p.name:22s} prompt {len(toks):4d}  tau {d['mean_accept_len']}  "
                  f"copied chains {d['n_lookup_steps']} of {d['n_steps']} steps", flush=True)
    report = {"drafter": pathlib.Path(args.drafter).name, "tokens": args.tokens, "ngl": args.ngl,
              "draft_max": "trained block - 1",
              "lookup": not args.no_lookup, "buckets": {}, "prompts": per_prompt}
    print("\n| bucket | prompts | tau | target | verdict | acceptance by position (1-8) |\n|---|---|---|---|---|---|")
    for name in sorted(totals):
        d = totals[name].as_dict()
        target = suite.target_for(name)
        n = sum(1 for r in per_prompt if r["bucket"] == name)
        report["buckets"][name] = {"prompts": n, "tau": d["mean_accept_len"], "target": target,
                                   "met": d["mean_accept_len"] >= target, "accept_rate": d["accept_rate"],
                                   "lookup_steps": d["n_lookup_steps"], "steps": d["n_steps"],
                                   "accept_by_position": d["accept_by_position"]}
        pos = " / ".join(f"{x:.2f}" for x in d["accept_by_position"][:8])
        print(f"| {name} | {n} | {d['mean_accept_len']} | >= {target} | "
              f"{'met' if d['mean_accept_len'] >= target else 'not met'} | {pos} |")
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
