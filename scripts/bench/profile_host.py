"""Where the host part of an engine step goes: the Python (and short native calls) of each phase, per step, with
the contexts' forwards left out. The target is that a 16-slot step's host work stay under 10 %.

    .venv/bin/python scripts/bench/profile_host.py [--model gemma|tiny] [--ngl -1] [--slots 16] [--synth-len 8]
        [--steps 300] [--out docs/profile_host.json]

It runs one engine in this process (no HTTP: the server's engine process runs the same code), fills every slot with
a long request, warms up, then wraps the step's phases (engine.py, drafter.py, verifier.py, native/context.py):
each wrapper adds its wall time less the native forward time spent inside it (``Context.t_native``). Wrapped phases
nest (``propose`` holds ``propose.inject``), so the rows are not to be summed; ``python`` is the step's wall time
less all forwards. Each wrapper costs ~1 us a call, so the wrapped run is a little slower than a bare one (both
are reported).

On a 2-core CPU the first calls after a forward run on cold caches (a rollback right after a decode: ~40 us,
the same call again ~9 us), so CPU figures overstate what the GPU host pays: profile on the GPU.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import sys
import time

import pydflash  # noqa: F401  (loads libllama before numpy)
from pydflash import api
from pydflash.config import EngineConfig
from pydflash.engine.request import Request

PROMPT = [2] + list(range(100, 140))  # token ids (the tiny vocabulary has 588): text does not matter here


def phases(eng):
    """(object, method name, label) of every phase wrapped; the labels say where each one is."""
    d = eng.drafter
    t = [(eng, "_schedule", "schedule"), (eng, "_prefill_chunks", "prefill_chunks"),
         (eng, "_extract_features_if_needed", "extract_features_if_needed"), (eng, "_propose", "propose"),
         (eng.verifier, "verify", "verify"), (eng.verifier.batch, "add_spans", "verify.add_spans"),
         (eng.target_ctx, "layer_rows", "verify.layer_rows"),
         (eng, "_settle_features", "settle_features"), (eng.target_ctx, "picks", "verify.picks"),
         (eng, "_commit", "commit"), (eng, "_accept", "commit.accept"),
         (eng.target_ctx, "_seq_rm", "propose.target_rollback (target seq_rm, in the drafter forward)"),
         (eng.target_ctx, "accept", "commit.sampler_accept"),
         (eng, "_keep_features", "commit.keep_features"), (eng, "_emit", "commit.emit"),
         (eng.prompt_cache, "after_commit", "commit.prompt_cache"), (eng, "_account", "account")]
    if d is not None:
        t += [(d, "inject", "propose.inject"), (d.ctx, "inject", "propose.inject.batch"),
              (d.batch, "add_spans", "propose.add_spans"), (d.ctx, "picks", "propose.picks"),
              (d.ctx, "seq_rm", "verify.drafter_rollback (drafter seq_rm)"),
              (d, "_valid_prefix", "propose.valid_prefix")]
    return t


def wrap(targets, clocks):
    acc = collections.defaultdict(float)
    calls = collections.Counter()

    def native():
        return sum(c.t_native for c in clocks)

    for obj, name, label in targets:
        fn = getattr(obj, name)

        def timed(*a, _fn=fn, _label=label, **k):
            n0, t0 = native(), time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                acc[_label] += time.perf_counter() - t0 - (native() - n0)
                calls[_label] += 1

        setattr(obj, name, timed)
    return acc, calls


def measure(eng, n_steps: int, clocks) -> dict:
    n0, t0 = sum(c.t_native for c in clocks), time.perf_counter()
    for _ in range(n_steps):
        eng.step()
    wall, nat = time.perf_counter() - t0, sum(c.t_native for c in clocks) - n0
    return {"step_ms": 1e3 * wall / n_steps, "forwards_ms": 1e3 * nat / n_steps,
            "python_ms": 1e3 * (wall - nat) / n_steps, "python_share": (wall - nat) / wall}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("gemma", "tiny"), default="gemma")
    ap.add_argument("--ngl", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--synth-len", type=float, default=8.0, help="0: plain decoding (no drafter)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    if a.model == "gemma":
        from pydflash.defaults import SHIPPED_DRAFTER, gemma_target
        target, drafter = gemma_target(), SHIPPED_DRAFTER
    else:
        from pydflash.factory import write_tiny_pair
        from pydflash.defaults import cache_dir
        p = write_tiny_pair(str(cache_dir() / "profile_host_tiny"), arch="gemma3", seed=0)
        target, drafter = p.target, p.drafter
    spec = a.synth_len > 0
    # every slot must still be running at the end: warm-up + bare + wrapped steps commit up to ~9 tokens a slot each
    # at L=8 (the H200 run of 2026-12-02 sized this at 4096 and its slots finished during the wrapped steps)
    n_ctx = 64 + len(PROMPT) + 10 * (a.warmup + a.steps + a.steps // 2)
    cfg = EngineConfig(n_slots=a.slots, n_ctx_slot=n_ctx, n_threads=a.threads, n_gpu_layers=a.ngl,
                       check_invariants=False, adaptive=False,
                       **({"synth_len": a.synth_len} if spec else {"draft_max": 0}))
    llm = api.load(target, drafter if spec else None, config=cfg)
    eng = llm.engine
    # long requests that fit the SWA window's checkpoint rule are not needed here: the prompt cache is kept out
    for _ in range(a.slots):
        eng.submit(Request(PROMPT, max_tokens=n_ctx - len(PROMPT) - 32, ignore_eos=True, cache_prompt=False))
    clocks = [eng.target_ctx] + ([eng.drafter.ctx] if eng.drafter else [])
    for _ in range(a.warmup):
        eng.step()
    bare = measure(eng, a.steps // 2, clocks)
    acc, calls = wrap(phases(eng), clocks)
    wrapped = measure(eng, a.steps, clocks)
    if sum(s is not None for s in eng.slots) < a.slots:  # per-step figures would mix in steps of fewer slots
        raise SystemExit("profile_host: a request finished before the last measured step")
    rows = {label: {"us_per_step": round(1e6 * acc[label] / a.steps, 1), "calls_per_step": calls[label] / a.steps}
            for label in sorted(acc, key=lambda k: -acc[k])}
    out = {"model": a.model, "ngl": a.ngl, "slots": a.slots, "synth_len": a.synth_len, "steps": a.steps,
           "bare": {k: round(v, 4) for k, v in bare.items()}, "wrapped": {k: round(v, 4) for k, v in wrapped.items()},
           "phases": rows}
    llm.close()
    text = json.dumps(out, indent=1)
    if a.out:
        pathlib.Path(a.out).write_text(text + "\n")
    print(text)
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
