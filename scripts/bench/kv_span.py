"""The KV span: how many cells every step's attention spans in the one unified KV, and what the prompt cache adds.

llama.cpp sizes each forward's attention (and the mask the host builds for it) by the highest cell in use, padded
to 256 (``llama_kv_cache::get_n_kv``: ``used_max_p1``), not by the cells in use: cells that idle slots keep, and the
holes a released sequence leaves above the running ones, cost every running request on every step. llama.cpp
prints each ubatch's figures with ``LLAMA_KV_CACHE_DEBUG=1`` (``find_slot: stream[s], n = used_max_p1, used = ...``);
pydflash passes llama.cpp's log to stderr with ``PYDFLASH_VERBOSE=1``. The log lines cost time inside the forward,
so read spans from such a run, and speed from another.

    # server logs of an HTTP run made with PYDFLASH_VERBOSE=1 LLAMA_KV_CACHE_DEBUG=1 (http_vs_native.py --log-dir)
    python scripts/bench/kv_span.py --logs LOGDIR/py-dflash.log LOGDIR/py-dflash-nocache.log
    # in-process: a closed loop of C clients over 16 slots, each fresh-set prompt once, one process per variant
    python scripts/bench/kv_span.py --run [--clients 8] [--requests 40] [--variants off,on,settled]

Variants: ``off`` (no prompt cache), ``on`` (the defaults, as a fresh server starts), ``settled`` (the defaults
after a long run that reused nothing: the reuse rate decayed to 0). Both contexts' lines count (the target's and
the drafter's KV grow together). Per variant: the span (n) and the cells in use, mean / median / p90, the mean
padded span, and for ``--run`` the kept cells (``PromptCache.kept_now``) and the step rate.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
LINE = re.compile(r"find_slot: stream\[\d+\], n = +(\d+), used = +(\d+)")
PAD = 256  # llama.cpp's n_pad for the KV span (get_padded_n_kv with flash attention)
BEGIN, END = "kv_span: begin", "kv_span: end"  # the measured part of a --run child's log


def spans(lines) -> tuple[list[int], list[int]]:
    """(n, used) of every find_slot line between BEGIN and END, or of all of them where there are no markers."""
    lines = list(lines)
    marked = any(BEGIN in x for x in lines)
    on, ns, used = not marked, [], []
    for x in lines:
        if BEGIN in x:
            on = True
        elif END in x:
            on = False
        elif on and (m := LINE.search(x)):
            ns.append(int(m[1]))
            used.append(int(m[2]))
    return ns, used


def summarize(ns: list[int], used: list[int]) -> dict:
    if not ns:
        return {"ubatches": 0}

    def stats(xs):
        xs = sorted(xs)
        return {"mean": round(statistics.mean(xs), 1), "median": statistics.median(xs),
                "p90": xs[int(0.9 * (len(xs) - 1))]}

    return {"ubatches": len(ns), "span": stats(ns), "used": stats(used),
            "padded_span_mean": round(statistics.mean(-(-n // PAD) * PAD for n in ns), 1)}


VARIANTS = ("off", "on", "settled")


def child(a) -> int:
    """One variant's closed loop, in this process (run with the log variables set by ``--run``)."""
    import pydflash  # noqa: F401  (loads libllama before numpy)
    from pydflash import api
    from pydflash.cache.config import CacheConfig
    from pydflash.config import EngineConfig
    from pydflash.engine.request import Request

    sys.path.insert(0, str(REPO / "scripts" / "bench"))
    import kept_cells

    cache = CacheConfig(reuse=False, device_cells=0) if a.child == "off" else CacheConfig()
    cfg = EngineConfig(n_slots=16, n_ctx_slot=a.ctx, n_gpu_layers=a.ngl, n_threads=a.threads, check_invariants=False)
    llm = api.load(a.target, a.drafter or None, config=cfg, cache=cache)
    eng = llm.engine
    if a.child == "settled":
        eng.prompt_cache.reuse_rate = 0.0  # as after a long run of traffic that reused nothing
    fresh = (REPO / "scripts/bench/prompts_fresh_v1.jsonl").read_text().splitlines()
    toks = [llm.tokenize(json.loads(x)["prompt"]) for x in fresh]
    kept = []

    def record_kept():
        if eng.prompt_cache is not None:
            kept.append(eng.prompt_cache.kept_now()[1])

    print(BEGIN, file=sys.stderr, flush=True)
    res = kept_cells.phase(eng, lambda i: Request(prompt=toks[i % len(toks)], max_tokens=a.tokens, ignore_eos=True),
                           a.requests, a.clients, after_step=record_kept)
    print(END, file=sys.stderr, flush=True)
    res["kept_cells_mean"] = round(statistics.mean(kept), 1) if kept else 0.0
    llm.close()
    print(json.dumps(res))
    return 0


def run(a) -> dict:
    out = {}
    env = dict(os.environ, PYDFLASH_VERBOSE="1", LLAMA_KV_CACHE_DEBUG="1")
    for v in a.variants.split(","):
        if v not in VARIANTS:
            sys.exit(f"kv_span: unknown variant {v!r} (choose from {', '.join(VARIANTS)})")
        with tempfile.TemporaryFile("w+") as log:
            t0 = time.perf_counter()
            cmd = [sys.executable, __file__, "--child", v, "--clients", str(a.clients), "--requests", str(a.requests),
                   "--tokens", str(a.tokens), "--target", a.target, "--drafter", a.drafter, "--ctx", str(a.ctx),
                   "--ngl", str(a.ngl), "--threads", str(a.threads)]
            p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=log, text=True, cwd=REPO)
            log.seek(0)
            text = log.read()
            if p.returncode:
                sys.exit(f"kv_span: variant {v} failed (exit {p.returncode}): {text.strip().splitlines()[-1:]}")
            row = summarize(*spans(text.splitlines()))
            row.update(json.loads(p.stdout.strip().splitlines()[-1]), wall_s=round(time.perf_counter() - t0, 1))
        out[v] = row
        print(f"{v}: {json.dumps(row)}", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--logs", nargs="+", help="llama.cpp logs (with LLAMA_KV_CACHE_DEBUG=1) to summarise")
    ap.add_argument("--run", action="store_true", help="in-process closed loops, one process per variant")
    ap.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    ap.add_argument("--variants", default="off,on,settled")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--tokens", type=int, default=128, help="max_tokens of each request (ignore_eos)")
    ap.add_argument("--target", default=str(REPO / ".cache/models/gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--drafter", default=str(REPO / "pydflash/models/gemma-3-270m-dflash-q8_0.gguf"),
                    help="'' for plain decoding")
    ap.add_argument("--ctx", type=int, default=4096, help="context per slot (pydflash-server's default)")
    ap.add_argument("--ngl", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="", help="write the summary here as JSON")
    a = ap.parse_args(argv)
    if a.child:
        return child(a)
    if not (a.logs or a.run):
        ap.error("give --logs or --run")
    if a.logs:
        out = {"logs": {}}
        for path in a.logs:
            try:
                text = pathlib.Path(path).read_text(errors="replace")
            except OSError as exc:
                ap.error(f"cannot read {path}: {exc.strerror}")
            out["logs"][path] = summarize(*spans(text.splitlines()))
            print(f"{path}: {json.dumps(out['logs'][path])}")
    else:
        out = {"clients": a.clients, "requests": a.requests, "tokens": a.tokens, "target": a.target,
               "drafter": a.drafter, "variants": run(a)}
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
