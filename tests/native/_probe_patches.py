"""Subprocess probe for test_native_patches.py: runs llama.cpp with its debug logging on (printed by our log
callback under PYDFLASH_VERBOSE) and prints markers between phases, so the test can read what each phase did.

    python _probe_patches.py argmax MODEL    one verify-like batch of 8 outputs under a greedy backend chain
    python _probe_patches.py toggle MODEL    features on, off, on again around one-token steps; saves nothing
    python _probe_patches.py decode MODEL    one plain decode step of 8 sequences, one output each, greedy chains
    python _probe_patches.py span12 MODEL OUT.npy  on the GPU: a 12-token span of one sequence, every row's logits saved
    python _probe_patches.py alternate MODEL  on the GPU: one-token and five-token steps of one sequence, alternating
    python _probe_patches.py logs MODEL      feature toggles (a debug line each) around one-token steps; prints the
                                             lines llama.cpp's logger passed to our callback, by level, as JSON
    python _probe_patches.py drafts TARGET DRAFTER  speculative greedy generation; prints the output and every
                                             block's drafts as JSON
    python _probe_patches.py reuse TARGET DRAFTER [STEPS]  speculative greedy generation with a fixed block; prints
                                             the output, each context's graph reuses and forwards, and the seconds
                                             of the last STEPS steps as JSON
"""

import sys

# libllama before numpy: numpy's OpenBLAS loaded first crashed llama.cpp's CUDA model load on the H200 (README), the
# likely end of this probe's first GPU run (SIGSEGV, 2026-12-01)
import pydflash  # noqa: F401
import numpy as np

from pydflash.native import Context, ContextParams, Model, ModelParams, TokenBatch


def main(what: str, path: str) -> None:
    if what == "span12":
        span12(path, sys.argv[3])
        return
    if what == "alternate":
        alternate(path)
        return
    if what == "logs":
        logs(path)
        return
    if what == "drafts":
        drafts(path, sys.argv[3])
        return
    if what == "reuse":
        reuse(path, sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 0)
        return
    model = Model(path)
    tokens = [(i * 13 + 5) % (model.n_vocab - 16) + 8 for i in range(24)]
    b = TokenBatch(32)
    if what == "argmax":
        ctx = Context(model, ContextParams(n_ctx=128, n_batch=32, n_ubatch=32, n_outputs_max=8,
                                           n_outputs_max_per_seq=8))
        b.add(tokens[:16], 0, 0, False)
        ctx.decode(b)
        sys.stderr.write("@@ verify\n")
        b.clear()
        b.add(tokens[16:24], 16, 0, True)
        ctx.decode(b)
        sys.stderr.write("@@ done\n")
        print(" ".join(map(str, ctx.picks(range(8)))))
        return
    if what == "decode":
        ctx = Context(model, ContextParams(n_ctx=8 * 32, n_batch=64, n_ubatch=64, n_seq_max=8, n_outputs_max=8))
        for s in range(8):
            b.clear()
            b.add(tokens[s:s + 4], 0, s, False)
            ctx.decode(b)
        sys.stderr.write("@@ decode\n")
        b.clear()
        for s in range(8):
            b.add([tokens[s + 4]], 4, s, True)
        ctx.decode(b)
        sys.stderr.write("@@ done\n")
        print(" ".join(map(str, ctx.picks(range(8)))))
        return
    ctx = Context(model, ContextParams(n_ctx=128, n_batch=32, n_ubatch=32, feature_layers=(1,)))
    b.add(tokens[:16], 0, 0, False)
    ctx.decode(b)
    rows = []
    for i, on in enumerate([True, False, True, False, True]):
        sys.stderr.write(f"@@ step {i} features {'on' if on else 'off'}\n")
        ctx.set_features(on)
        b.clear()
        b.add([tokens[16 + i]], 16 + i, 0, True)
        ctx.decode(b)
        if on:
            rows.append(ctx.features(1)[0])
    sys.stderr.write("@@ done\n")
    np.save(sys.argv[3], np.stack(rows))


def gpu_prefilled(path: str, rest: int, **params):
    """(model, context, batch, tokens, n0) on the GPU: a short code prompt but its last `rest` tokens in the KV."""
    model = Model(path, ModelParams(n_gpu_layers=-1))
    ctx = Context(model, ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_outputs_max=rest,
                                       n_outputs_max_per_seq=rest, **params))
    tokens = model.tokenize("def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fib")
    n0 = len(tokens) - rest
    b = TokenBatch(64)
    b.add(tokens[:n0], 0, 0, False)
    ctx.decode(b)
    return model, ctx, b, tokens, n0


def span12(path: str, out: str) -> None:
    """A verify-sized forward: 12 columns in every matmul, the case patches/0006 runs as MMVQ passes on Hopper. Then
    the same 12 tokens one at a time (one column: MMVQ whatever the switch says), plain decoding's logits, as the
    reference both paths of the span are measured against. Saved as (2, 12, n_vocab): span rows, one-token rows."""
    model, ctx, b, tokens, n0 = gpu_prefilled(path, 12, backend_greedy=False)
    sys.stderr.write("@@ span\n")
    b.clear()
    b.add(tokens[n0:], n0, 0, True)
    ctx.decode(b)
    span = np.stack([ctx.logits(i) for i in range(12)])
    sys.stderr.write("@@ one token at a time\n")
    ctx.seq_rm(0, n0)
    single = []
    for i, t in enumerate(tokens[n0:]):
        b.clear()
        b.add([t], n0 + i, 0, True)
        ctx.decode(b)
        single.append(ctx.logits(0))
    sys.stderr.write("@@ done\n")
    np.save(out, np.stack([span, np.stack(single)]))
    # freed before the interpreter exits rather than left to its teardown, with a CUDA backend behind them
    ctx.close()
    model.close()


def alternate(path: str) -> None:
    """Plain steps and 1 + 4-token verifies, alternating as speculative decoding does (patches/0007), each rolled back
    so that every step of a shape sees the same KV span."""
    model, ctx, b, tokens, n0 = gpu_prefilled(path, 5)
    picks = []
    for i in range(12):
        if i == 4:
            sys.stderr.write("@@ alternating\n")  # both shapes have had their two warm-up calls
        span = tokens[n0:n0 + (1 if i % 2 == 0 else 5)]
        b.clear()
        b.add(span, n0, 0, True)
        ctx.decode(b)
        picks.append(ctx.picks(range(len(span))))
        ctx.seq_rm(0, n0)
    sys.stderr.write("@@ done\n")
    print(picks)
    ctx.close()
    model.close()


def logs(path: str) -> None:
    """What reaches the Python log callback from a run that logs debug lines: each feature toggle logs one
    (llama_context::set_embeddings_layer_inp), as ggml-cuda logs one at each CUDA graph replay."""
    import json

    from pydflash.native import _lib

    model = Model(path)
    ctx = Context(model, ContextParams(n_ctx=64, n_batch=16, n_ubatch=16, feature_layers=(1,)))
    b = TokenBatch(16)
    before = dict(_lib.log_lines)
    for i in range(8):
        ctx.set_features(i % 2 == 1)
        b.clear()
        b.add([5 + i], i, 0, True)
        ctx.decode(b)
    print(json.dumps({str(k): v - before.get(k, 0) for k, v in _lib.log_lines.items()}))
    ctx.close()
    model.close()


def drafts(target: str, drafter: str) -> None:
    import json

    from pydflash import api
    from pydflash.config import EngineConfig
    from pydflash.engine import drafter as drafter_mod

    seen = []
    real = drafter_mod.Drafter.propose
    drafter_mod.Drafter.propose = lambda self, plan, **kw: seen.append(real(self, plan, **kw)) or seen[-1]
    with api.load(target, drafter, config=EngineConfig(n_ctx_slot=256)) as llm:
        prompt = llm.tokenize("def add(a, b):\n    return a + b\n")
        sys.stderr.write("@@ generate\n")
        res = llm.generate(prompt, max_tokens=24, ignore_eos=True)
        sys.stderr.write("@@ done\n")
    print(json.dumps({"tokens": res.tokens, "drafts": [sorted(d.items()) for d in seen]}))


def reuse(target: str, drafter: str, timed_steps: int) -> None:
    import json
    import time

    from pydflash import api
    from pydflash.config import EngineConfig
    from pydflash.engine.request import Request

    cfg = EngineConfig(n_ctx_slot=128 + 8 * timed_steps, adaptive=False, draft_max=7, lookup=False)
    with api.load(target, drafter, config=cfg) as llm:
        eng = llm.engine
        prompt = llm.tokenize("def add(a, b):\n    return a + b\n")
        res = llm.generate(prompt, max_tokens=48, ignore_eos=True)
        d, t = eng.drafter.ctx, eng.target_ctx
        out = {"tokens": res.tokens, "drafter_reused": d.graphs_reused, "drafter_forwards": d.n_writes,
               "target_reused": t.graphs_reused, "target_forwards": t.n_writes}
        if timed_steps:  # a long request: the wall time of its later steps (graphs settled)
            eng.submit(Request(prompt, max_tokens=8 * timed_steps, ignore_eos=True, cache_prompt=False))
            for _ in range(8):
                eng.step()
            t0 = time.perf_counter()
            for _ in range(timed_steps):
                eng.step()
            out["ms_per_step"] = round(1e3 * (time.perf_counter() - t0) / timed_steps, 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
