"""The frozen evaluation set (``eval_fresh_v1.jsonl``): prompts no training path reads, and tau per kind on it.

    python -m pydflash.train.eval_fresh --drafter DRAFTER.gguf --out REPORT.json [--modes fixed,adaptive]
        [--tokens 96] [--ngl 0] [--threads 0] [--target TARGET.gguf] [--n 0]

The set was written by hand before any drafter trained against it: chat requests in Gemma's turn format (some
multi-turn), code openings in 8 languages, prose openings across topics and exactly 10 texts that repeat themselves.
It must never change (``SHA256``, checked on every load and recorded in pydflash/models/MODEL_CARD.md); every
training path drops rows whose prompt contains one of its prompts (``holdout.py``). A later set is a new file.

Modes, each greedy through the engine, one request at a time, copied chains on (the engine's default):
- ``fixed``: always 15 drafts a step (``--no-draft-adaptive --draft-max 15``): the drafter's own acceptance;
- ``adaptive``: the default policy (``--draft-adaptive``), which pauses drafting where it does not pay.
tau = generated tokens / target forwards, summed over a kind's prompts (the bonus token counts), as in
``scripts/bench/drafter_eval.py --suite``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import sys
import time

PATH = pathlib.Path(__file__).resolve().parent / "eval_fresh_v1.jsonl"
SHA256 = "1a2613ef2aaeb10fdc9294ee840e2b7a6b4f21119d5c2b4aeb6537897751a3e0"
KINDS = ("code", "prose", "chat", "repetition")
TARGETS = {"code": 5.0, "prose": 4.0, "chat": 4.0, "repetition": 9.0}  # fixed block, greedy, 96 tokens, CPU
MODES = {"fixed": {"draft_max": 15, "adaptive": False}, "adaptive": {"draft_max": None, "adaptive": True}}


def load(path: pathlib.Path = PATH) -> list[dict]:
    """The set's prompts ({"kind", "source", "text"}), after checking the file is the frozen one."""
    raw = path.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if path == PATH and digest != SHA256:
        raise ValueError(f"{path} changed (sha256 {digest}, frozen {SHA256}): write a new set, never edit this one")
    return [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]


def tokens_of(model, prompt: dict) -> list[int]:
    """As the server sends them: BOS, and Gemma's turn markup parsed into its special tokens in chat prompts."""
    from .generate import prompt_tokens
    return prompt_tokens(model, prompt)


def run_mode(target: str, drafter: str, mode: str, prompts: list[dict], tokens: int, ngl: int, threads: int) -> dict:
    from .. import api
    from ..cache.config import CacheConfig
    from ..config import EngineConfig
    from ..engine.stats import Stats

    cfg = EngineConfig(n_ctx_slot=1024 + tokens, n_gpu_layers=ngl, n_threads=threads, **MODES[mode])
    totals = {k: Stats() for k in KINDS}
    per_prompt = []
    t0 = time.perf_counter()
    # no prompt cache: each prompt is measured as a first request, whatever came before it
    with api.load(target, drafter, cfg, cache=CacheConfig(reuse=False, ram_mib=0, checkpoint_every=0)) as llm:
        model = llm.engine.model
        for i, p in enumerate(prompts):
            toks = tokens_of(model, p)
            res = llm.generate(toks, max_tokens=tokens)
            totals[p["kind"]].merge_tokens(res.stats)
            d = res.stats.as_dict()
            per_prompt.append({"i": i, "kind": p["kind"], "source": p["source"], "prompt_tokens": len(toks),
                               "tau": d["mean_accept_len"], "n_generated": d["n_generated"], "n_steps": d["n_steps"],
                               "lookup_steps": d["n_lookup_steps"], "drafted": d["n_drafted"]})
            print(f"{mode:8s} {i:3d} {p['kind']:10s} prompt {len(toks):4d} tau {d['mean_accept_len']:6.2f}", flush=True)
    kinds = {}
    for k, st in totals.items():
        d = st.as_dict()
        kinds[k] = {"prompts": sum(r["kind"] == k for r in per_prompt), "tau": d["mean_accept_len"],
                    "target": TARGETS[k], "met": d["mean_accept_len"] >= TARGETS[k], "steps": d["n_steps"],
                    "generated": d["n_generated"], "drafted": d["n_drafted"],
                    "lookup_steps": d["n_lookup_steps"], "accept_by_position": d["accept_by_position"]}
    return {"config": MODES[mode], "kinds": kinds, "prompts": per_prompt,
            "wall_s": round(time.perf_counter() - t0, 1)}


def table(report: dict) -> str:
    """Markdown: a row per kind, a column per mode."""
    modes = list(report["modes"])
    head = "| kind | prompts | " + " | ".join(f"tau, {m}" for m in modes) + " | target (fixed) |"
    lines = [head, "|" + "---|" * (len(modes) + 3)]
    for k in KINDS:
        r = {m: report["modes"][m]["kinds"][k] for m in modes}
        first = r[modes[0]]
        lines.append(f"| {k} | {first['prompts']} | " + " | ".join(f"{r[m]['tau']:.2f}" for m in modes)
                     + f" | >= {TARGETS[k]:g} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", default="", help="default: the shipped drafter")
    ap.add_argument("--target", default="", help="default: the Gemma-3-270M target")
    ap.add_argument("--modes", default="fixed,adaptive")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--ngl", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--n", type=int, default=0, help="the first N prompts of each kind (0: all)")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    from ..defaults import SHIPPED_DRAFTER, gemma_target

    modes = [m for m in a.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        ap.error(f"--modes: a comma-separated subset of {', '.join(MODES)}")
    prompts = load()
    if a.n:
        prompts = [p for k in KINDS for p in [q for q in prompts if q["kind"] == k][:a.n]]
    target, drafter = a.target or str(gemma_target()), a.drafter or str(SHIPPED_DRAFTER)
    report = {"set": PATH.name, "sha256": SHA256, "drafter": pathlib.Path(drafter).name, "tokens": a.tokens,
              "ngl": a.ngl, "greedy": True, "lookup": True, "prompts": len(prompts), "modes": {}}
    for m in modes:
        report["modes"][m] = run_mode(target, drafter, m, prompts, a.tokens, a.ngl, a.threads)
    print(table(report))
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
