#!/usr/bin/env python3
"""The target local against split over llama.cpp RPC servers: decode tok/s, plain and speculative, interleaved.

Starts ``--servers`` ggml-rpc-server processes from our build on loopback (one thread each, no file cache), then
for each round runs one request through four engines in turn: local plain, local with the drafter, split plain,
split with the drafter (all layers offloaded, ``-ngl -1``: the servers hold the repeating layers, the local CPU the
embeddings and the output head). On one host this measures the protocol's cost (a round trip per graph split per
step, tensors copied through the kernel), not a network; the servers share the host's cores with the client.

    .venv/bin/python scripts/bench/rpc_split.py [--model tiny|gemma] [--tokens 128] [--rounds 3] [--out docs/x.json]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import socket
import statistics
import subprocess
import time

from pydflash import api, rpc
from pydflash.config import EngineConfig
from pydflash.defaults import cache_dir, default_pair
from pydflash.engine.request import Request
from pydflash.factory import write_tiny_pair
from pydflash.native._lib import LIB_DIR

PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"


def start_servers(n: int, threads: int) -> tuple[list, list[str]]:
    procs, eps = [], []
    env = dict(os.environ, LD_LIBRARY_PATH=str(LIB_DIR))
    for _ in range(n):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs.append(subprocess.Popen([str(LIB_DIR.parent / "bin" / "ggml-rpc-server"), "-H", "127.0.0.1", "-p",
                                       str(port), "-t", str(threads)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        eps.append(f"127.0.0.1:{port}")
        for _ in range(200):
            try:
                rpc.probe(rpc.parse_endpoint(eps[-1]), timeout_s=2.0)
                break
            except rpc.RpcUnreachable:
                time.sleep(0.05)
    return procs, eps


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("tiny", "gemma"), default="tiny")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="threads of the client and of each server")
    ap.add_argument("--out", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)

    if args.model == "gemma":
        pair = default_pair()
        target, drafter = pair.target, pair.drafter
    else:
        tiny = write_tiny_pair(cache_dir() / "bench-rpc-tiny", arch="qwen3", seed=0)
        target, drafter = tiny.target, tiny.drafter
    procs, eps = start_servers(args.servers, args.threads)
    try:
        base = dict(n_ctx_slot=1024, n_threads=args.threads, adaptive=False)
        split = dict(base, n_gpu_layers=-1, rpc=tuple(eps))
        modes = {"local plain": (None, base), "local spec": (drafter, base),
                 "split plain": (None, split), "split spec": (drafter, split)}
        tps: dict[str, list[float]] = {m: [] for m in modes}
        step_ms: dict[str, list[float]] = {m: [] for m in modes}  # a drafting step commits tau tokens
        texts: dict[str, str] = {}
        for _ in range(args.rounds):
            for mode, (dft, cfg) in modes.items():
                t0 = time.perf_counter()
                with api.load(target, dft, EngineConfig(**cfg)) as llm:
                    load_s = time.perf_counter() - t0
                    res = llm.generate(PROMPT, max_tokens=args.tokens, ignore_eos=True, cache_prompt=False)
                tps[mode].append(res.stats.tokens_per_second)
                step_ms[mode].append(1e3 * res.stats.mean_accept_len / res.stats.tokens_per_second)
                texts.setdefault(mode, res.text)
                print(f"{mode:12s} {res.stats.tokens_per_second:8.1f} tok/s  {step_ms[mode][-1]:7.2f} ms/step  "
                      f"tau {res.stats.mean_accept_len:.2f}  load {load_s:.2f} s", flush=True)
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)
    out = {"model": args.model, "target": str(target), "tokens": args.tokens, "rounds": args.rounds,
           "servers": args.servers, "threads": args.threads, "host_cpus": os.cpu_count(),
           "median_tok_s": {m: statistics.median(v) for m, v in tps.items()},
           "median_ms_per_step": {m: statistics.median(v) for m, v in step_ms.items()}, "tok_s": tps,
           # quantized weights: the servers' CPU buffers are not repacked as the local ones are (other kernels, other
           # rounding), so a near-tie may flip; tests/test_rpc.py checks f32 against the regret gate
           "split_text_equals_local": {"plain": texts["split plain"] == texts["local plain"],
                                       "spec": texts["split spec"] == texts["local spec"]}}
    print(json.dumps({k: out[k] for k in ("median_tok_s", "median_ms_per_step", "split_text_equals_local")}))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
