"""Native cost of the pieces of a DFlash step, measured in isolation (Gemma-3-270M target, random drafter).

Answers "where does a step's time go" without the engine around it:
  - a plain one-token step with and without target-feature extraction, and the first step after toggling it;
  - a verify forward of `span` tokens per sequence for 1 and 8 sequences, every position an output with a
    greedy backend sampler (what the engine does), against the same forward with only the last position an output;
  - the drafter's noise-block forward for 1 and 8 sequences;
  - re-decoding a span of the prompt with features (what a paused slot's repair costs);
  - shapes that change from step to step, as serving meets them: a drafting step's drafter work (inject the 1..16
    rows the last step committed, then the block) and a 5-token verify right after a plain step;
  - a plain step on target contexts made as pydflash's plain engine makes them (no feature layers; also with outputs
    sized for one token per sequence): what a drafter-capable target costs a step where nobody drafts.

Every figure is the median over --reps of one decode including its synchronisation, in milliseconds. For the pieces
a serving step is made of, ``<key>_launch`` is the median time until the last llama_decode returned (the host's part:
graph build or reuse, inputs, kernel launches; the device runs asynchronously from there) and ``<key>_wait`` what was
left for the device (its work past the launches, the outputs' copy). A piece whose wait is small is host-bound: a
faster kernel would not shorten it.

    .venv/bin/python scripts/bench/step_costs.py [--ngl -1] [--reps 30] \\
        [--out docs/results/2026-11-29-h200/step_costs_gpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

import pydflash  # noqa: F401  (loads libllama before numpy)
import numpy as np
from pydflash.defaults import cache_dir, gemma_target
from pydflash.factory.for_target import write_random_drafter_for
from pydflash.native import Context, ContextParams, TokenBatch
from pydflash.native._lib import llama_set_embeddings_layer_inp
from pydflash.pair import load_pair
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # scripts/ is not a package
from results import default_out  # noqa: E402

PROMPT = "The quick brown fox jumps over the lazy dog while the cat sleeps in the warm afternoon sun. " * 3


LAUNCHED: list[float] = []  # perf_counter when each decode's llama_decode returned (its ``during`` hook)


def launched() -> None:
    LAUNCHED.append(time.perf_counter())


CONTEXTS: list = []  # the contexts whose graph reuses are counted (main fills it)


def timed(fn, reps, split: dict | None = None, key: str = ""):
    """Median ms of fn; with ``split``, also its host part (start to the last llama_decode's return) and the wait
    after it, as split[key + "_launch"] / split[key + "_wait"], and how many of its forwards a rep reused the graph
    of the one before (split[key + "_reused"]: a forward that does not builds and allocates its graph again)."""
    fn()  # warm-up: graph allocation for this shape
    reused0 = sum(c.graphs_reused for c in CONTEXTS)
    out, host = [], []
    for _ in range(reps):
        LAUNCHED.clear()
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
        if LAUNCHED:
            host.append((LAUNCHED[-1] - t) * 1e3)
    total = round(statistics.median(out), 3)
    if split is not None and host:
        split[f"{key}_reused"] = round((sum(c.graphs_reused for c in CONTEXTS) - reused0) / reps, 2)
        split[f"{key}_launch"] = round(statistics.median(host), 3)
        split[f"{key}_wait"] = round(statistics.median(o - h for o, h in zip(out, host)), 3)
    return total


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--ngl", type=int, default=-1)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", default=default_out("step_costs.json"))
    ap.add_argument("--drafter", default=None,
                    help="drafter GGUF whose block forward is timed (default: a random drafter of one layer)")
    args = ap.parse_args(argv)
    target = gemma_target()
    drafter = args.drafter or write_random_drafter_for(target, cache_dir() / "models" / "gemma3-random-drafter.gguf")
    pair = load_pair(target, drafter, n_gpu_layers=args.ngl)
    layers = tuple(pair.feature_layers)
    block = pair.block_size
    n_seq = 8
    tctx = Context(pair.target, ContextParams(
        n_ctx=n_seq * 1024, n_batch=512, n_ubatch=512, n_seq_max=n_seq, n_outputs_max=n_seq * block,
        n_outputs_max_per_seq=block, n_threads=args.threads, feature_layers=layers))
    dctx = Context(pair.drafter, ContextParams(
        n_ctx=n_seq * 1024, n_batch=512, n_ubatch=512, n_seq_max=n_seq, n_outputs_max=n_seq * block,
        n_outputs_max_per_seq=block, n_threads=args.threads), ctx_other=tctx, causal=False)
    CONTEXTS[:] = [tctx, dctx]
    b = TokenBatch(512)
    prompt = pair.target.tokenize(PROMPT)
    n0 = len(prompt)
    filler = (prompt * 8)[1:]
    # prefill every sequence; the drafter gets the features
    for s in range(n_seq):
        b.clear()
        b.add(prompt, 0, s, False)
        tctx.decode(b)
        dctx.inject(tctx.features(n0), np.arange(n0, dtype=np.int32), np.full(n0, s, dtype=np.int32))
    res = {"env_per_row_greedy": bool(os.environ.get("PYDFLASH_PER_ROW_GREEDY")), "ngl": args.ngl,
           # llama.cpp's switches that change the host's part (a variant run sets them)
           "env": {k: os.environ[k] for k in ("LLAMA_GRAPH_REUSE_DISABLE", "GGML_CUDA_DISABLE_GRAPHS",
                                              "GGML_LOG_SKIP_DEBUG") if k in os.environ}}

    def set_features(on):
        for lid in layers:
            llama_set_embeddings_layer_inp(tctx.ptr, lid, on)

    def verify(n_seqs, span, all_outputs=True, ctx=tctx):
        def run():
            b.clear()
            for s in range(n_seqs):
                flags = True if all_outputs else [False] * (span - 1) + [True]
                b.add(filler[:span], n0, s, flags)
            ctx.decode(b, during=launched)
            ctx.picks(range(b.n) if all_outputs else [b.n - 1])
            for s in range(n_seqs):
                ctx.seq_rm(s, n0)
        return run

    def draft(n_seqs, k):
        def run():
            b.clear()
            for s in range(n_seqs):
                b.add([prompt[-1]] + [pair.mask_token] * k, n0, s, True)
            dctx.decode(b, during=launched)
            dctx.picks(range(b.n))
            for s in range(n_seqs):
                dctx.seq_rm(s, n0)
        return run

    for feat in (True, False):
        set_features(feat)
        key = f"plain_c1_features_{'on' if feat else 'off'}"
        res[key] = timed(verify(1, 1), args.reps, res, key)
        res[f"plain_c8_features_{'on' if feat else 'off'}"] = timed(verify(8, 1), args.reps)
    toggles = []
    for i in range(10):
        set_features(i % 2 == 0)
        t = time.perf_counter()
        verify(1, 1)()
        toggles.append((time.perf_counter() - t) * 1e3)
    res["plain_c1_first_step_after_toggle"] = round(statistics.median(toggles), 3)
    set_features(True)
    for c in (1, 8):
        for span in (2, 5, 16):
            key = f"verify_c{c}_span{span}_all_outputs"
            res[key] = timed(verify(c, span), args.reps, res, key)
            res[f"verify_c{c}_span{span}_last_output"] = timed(verify(c, span, all_outputs=False), args.reps)
        # 1 .. 15 drafts: the block forward's fixed part and its per-token slope
        for k in (1, 4, 8, 15):
            res[f"draft_c{c}_k{k}"] = timed(draft(c, k), args.reps, res, f"draft_c{c}_k{k}")
    # what a serving step sees: shapes that change from step to step on one context (patches/0007 keeps a CUDA graph
    # per shape; keyed by the first node alone, every change ran the step without one)
    feats = tctx.features(n0).copy()  # the last prefill's rows (any real feature rows will do)
    committed = iter([8, 4, 12, 6, 10, 2, 16, 7] * 1000)  # rows the step before committed (1 .. 16)

    def steady_draft(n_seqs, k):
        """One drafting step's drafter work: inject the rows the last step committed, then the block."""
        def run():
            m = next(committed)
            dctx.inject(np.concatenate([feats[:m]] * n_seqs), np.tile(np.arange(n0, n0 + m, dtype=np.int32), n_seqs),
                        np.repeat(np.arange(n_seqs, dtype=np.int32), m))
            b.clear()
            for s in range(n_seqs):
                b.add([prompt[-1]] + [pair.mask_token] * k, n0 + m, s, True)
            dctx.decode(b, during=launched)
            dctx.picks(range(b.n))
            for s in range(n_seqs):
                dctx.seq_rm(s, n0)
        return run

    def alternating_verify(n_seqs, span):
        """A verify of `span` tokens right after a plain step, as a probe or a drafting step after a pause meets it."""
        plain, spec = verify(n_seqs, 1), verify(n_seqs, span)

        def run():
            plain()
            t = time.perf_counter()
            spec()
            return time.perf_counter() - t
        return run

    for c in (1, 8):
        res[f"steady_draft_c{c}_k15"] = timed(steady_draft(c, 15), args.reps, res, f"steady_draft_c{c}_k15")
        after_plain = alternating_verify(c, 5)
        spans = [after_plain() for _ in range(args.reps)]
        res[f"verify_c{c}_span5_after_plain_step"] = round(1e3 * statistics.median(spans), 3)
    for n in (32, 64, 128):
        res[f"redecode_{n}_with_features"] = timed(verify(1, n, all_outputs=False), max(5, args.reps // 3))
    # a useless drafter's paused steps ran ~4 % slower in the verify than pydflash plain's (HTTP, H200, c1)
    for name, outputs in (("", block), ("_one_output", 1)):
        pctx = Context(pair.target, ContextParams(
            n_ctx=n_seq * 1024, n_batch=512, n_ubatch=512, n_seq_max=n_seq, n_outputs_max=n_seq * outputs,
            n_outputs_max_per_seq=outputs, n_threads=args.threads))
        for s in range(n_seq):
            b.clear()
            b.add(prompt, 0, s, False)
            pctx.decode(b)
        for c in (1, 8):
            res[f"plain_c{c}_no_feature_layers{name}"] = timed(verify(c, 1, ctx=pctx), args.reps)
        pctx.close()
    # the cost bar for a bigger drafter: its block forward stays under 30 % of the 16-token verify it feeds
    for c in (1, 8):
        res[f"draft_k15_over_verify_span16_c{c}"] = round(
            res[f"draft_c{c}_k15"] / res[f"verify_c{c}_span16_all_outputs"], 3)
    res["drafter"] = os.path.basename(str(drafter))
    for key, val in res.items():
        print(f"{key:40s} {val}", file=sys.stderr)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    dctx.close()
    tctx.close()
    pair.close()


if __name__ == "__main__":
    main()
