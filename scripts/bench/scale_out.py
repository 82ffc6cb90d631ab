#!/usr/bin/env python3
"""Past one GPU, measured through HTTP on one host: engine replicas behind Ray Serve, and one target split in two.

``--part replicas``: ``pydflash-server --ray auto`` with 1 and with 2 engine replicas (``--replicas``), each pinned to
a GPU of its own (the Ray app asks ``num_gpus: 1`` per replica whenever the preset has GPU layers, and Ray then sets
``CUDA_VISIBLE_DEVICES`` in the replica), against a direct ``pydflash-server`` on GPU 0 (``--no-direct`` skips it).
The benchmark starts the Ray instance (``ray.init``) and each server joins it, so that it can read Serve's replica
states and stop Serve between conditions.

``--part split``: one target split over two GPUs (scripts/bench/rpc_split.py): llama.cpp's layer split, llama.cpp
RPC to a ``ggml-rpc-server`` on the second GPU, and native llama-server ``-sm layer``; plain against speculative.

Both parts send the frozen fresh prompt set (scripts/bench/prompts_fresh_v1.jsonl) as streamed completions: at
each level C, C clients each send ``--requests`` requests one after another (client i starts at prompt i * 78 / C
and walks the set), after one untimed warm-up round. Reported per level: aggregate tok/s (the servers'
``usage.completion_tokens`` over the level's wall time), TTFT p50/p99, the requests each replica answered
(``X-Pydflash-Replica``), and per GPU the memory in use while the condition ran (placement, read from nvidia-smi).

    # 2-GPU host (scripts/dev/remote.sh scaleout): default pair, -ngl -1, 1-32 clients
    python scripts/bench/scale_out.py --part replicas --server-args "-ngl -1" --clients 1,2,4,8,16,32
    python scripts/bench/scale_out.py --part split --target T.gguf --drafter D.gguf --llama-server PATH
    # CPU plumbing check (tests/server/test_scale_out_dryrun.py runs the same code paths)
    python scripts/bench/scale_out.py --part replicas --tiny --clients 1,4 --no-direct

Writes ``--out`` (JSON) and the tables next to it (``.md``); ``--doc`` also puts them into docs/scale-out.md
between the ``bench_scale_out_<part>`` markers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # scripts/ is not a package
from http_vs_native import fresh_prompts, walk_index  # noqa: E402
from results import default_out  # noqa: E402
from server_load import (  # noqa: E402
    Server, client_limits, fmt, machine, ms, pct, stream_completion, summarize, tree_commit)

REPO = pathlib.Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "scale-out.md"
REPLICA = "x-pydflash-replica"
PROBES = 3  # greedy requests per condition whose texts are compared across conditions
TARGET_REPLICAS = (16, 1.8)  # 2 replicas >= 1.8x one replica at 16+ clients (docs/scale-out.md)


# --- clients (both parts) -----------------------------------------------------------------------------------------
def model_id(base: str) -> str:
    """The served model's name (the default preset's; a llama-server's own), for the request bodies."""
    r = httpx.get(base + "/v1/models", timeout=30)
    r.raise_for_status()
    return r.json()["data"][0]["id"]


async def level(base: str, clients: int, a: argparse.Namespace, body: dict) -> dict:
    """C clients x ``a.requests`` streamed requests over the fresh prompts, after an untimed warm-up round."""
    prompts = fresh_prompts()
    limits = client_limits(clients)
    served: dict[str, int] = {}  # timed requests per engine replica (a direct server sends no header)
    timed = False

    async def count(resp: httpx.Response) -> None:
        if timed:
            name = resp.headers.get(REPLICA, "direct")
            served[name] = served.get(name, 0) + 1

    async with httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(600.0), limits=limits,
                                 event_hooks={"response": [count]}) as client:
        n = len(prompts)
        await asyncio.gather(*(stream_completion(client, {**body, "prompt": prompts[walk_index(n, clients, i, 0)]})
                               for i in range(clients)))

        async def one_client(i: int) -> list[dict]:
            return [await stream_completion(client, {**body, "prompt": prompts[walk_index(n, clients, i, 1 + k)]})
                    for k in range(a.requests)]

        timed = True
        t0 = time.perf_counter()
        runs = [r for rs in await asyncio.gather(*(one_client(i) for i in range(clients))) for r in rs]
        wall = time.perf_counter() - t0
    ttft = [r["frames"][0] - r["t0"] for r in runs if r["frames"]]
    return {**summarize(runs, wall, clients), "ttft_ms_p99": ms(pct(ttft, 0.99)), "per_replica": served}


def probe_texts(base: str, body: dict, n: int) -> list[str]:
    """Greedy non-streamed answers to the first n fresh prompts: what the conditions' outputs are compared on."""
    with httpx.Client(base_url=base, timeout=600) as c:
        out = []
        for prompt in fresh_prompts()[:n]:
            r = c.post("/v1/completions", json={**body, "prompt": prompt})
            r.raise_for_status()
            out.append(r.json()["choices"][0]["text"])
    return out


def measure(base: str, a: argparse.Namespace, clients: list[int], probes: int = 0) -> dict:
    body = {"model": model_id(base), "max_tokens": a.tokens, "temperature": 0, "ignore_eos": True}
    texts = probe_texts(base, body, probes)
    levels = []
    for c in clients:
        levels.append(asyncio.run(level(base, c, a, body)))
        print(f"  c={c}: {levels[-1]['tok_per_s']} tok/s, TTFT p50 {levels[-1]['ttft_ms_p50']} ms, "
              f"replicas {sorted(levels[-1]['per_replica'].values())}", file=sys.stderr, flush=True)
    return {"loadavg_1min_at_start": os.getloadavg()[0], "gpu_mib": gpu_memory(), "texts": texts, "levels": levels}


def gpu_memory() -> list[int] | None:
    """MiB in use on each GPU now (None without nvidia-smi): which GPUs a condition's models landed on."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
        return [int(x) for x in out.split()] or None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None


# --- part 1: replicas ---------------------------------------------------------------------------------------------
def preset_args(a: argparse.Namespace, work: pathlib.Path) -> list[str]:
    """The server flags of the preset: the default pair with ``--server-args`` (``-ngl -1`` on a GPU), or a tiny
    factory pair for a plumbing run."""
    args = shlex.split(a.server_args)
    if a.tiny:
        from pydflash.factory import write_tiny_pair

        pair = write_tiny_pair(work / "tiny", arch="gemma3", seed=0)
        args = ["-m", str(pair.target), "-md", str(pair.drafter), "-c", "2048", *args]
    return args


def start_direct(args: list[str], log: pathlib.Path) -> Server:
    # one GPU: llama.cpp would otherwise split the model over every visible GPU by layer
    return Server(args, log, ready_timeout=300, env={"CUDA_VISIBLE_DEVICES": "0"})


def start_serve(args: list[str], replicas: int, log: pathlib.Path) -> Server:
    """``pydflash-server --ray auto``: joins the Ray instance this process started."""
    return Server(["--ray", "auto", "--ray-replicas", str(replicas), *args], log, ready_timeout=600)


def replica_states() -> dict:
    """Serve's view of the engine deployment: {"RUNNING": n, ...}."""
    from ray import serve

    from pydflash.server.ray.app import ENGINE

    app = serve.status().applications.get("pydflash")
    dep = app.deployments.get(ENGINE) if app else None
    return {str(k): v for k, v in dep.replica_states.items()} if dep else {}


def stop_serve(srv: Server) -> None:
    """Stop the server (which deletes its app) and Serve with it, so that the next condition's server starts
    Serve's HTTP proxy on its own port."""
    from ray import serve

    srv.stop()
    serve.shutdown()


def run_replicas(a: argparse.Namespace, work: pathlib.Path) -> dict:
    import ray

    args = preset_args(a, work)
    conds = (["direct"] if a.direct else []) + [f"serve-{r}" for r in a.replicas]
    rounds = []
    ray.init(num_cpus=a.ray_cpus or None, include_dashboard=False, log_to_driver=False)
    try:
        for rnd in range(a.rounds):
            res = {}
            for cond in conds:
                print(f"round {rnd + 1}: {cond}", file=sys.stderr, flush=True)
                log = work / f"{cond}.{rnd}.log"
                if cond == "direct":
                    srv = start_direct(args, log)
                    try:
                        res[cond] = measure(srv.base, a, a.clients, probes=PROBES)
                    finally:
                        srv.stop()
                    continue
                srv = start_serve(args, int(cond.split("-")[1]), log)
                try:
                    res[cond] = {"replica_states": replica_states(), **measure(srv.base, a, a.clients, PROBES)}
                finally:
                    stop_serve(srv)
            rounds.append(res)
    finally:
        ray.shutdown()
    first = rounds[0]
    same = {c: first[c]["texts"] == first[conds[0]]["texts"] for c in conds[1:]}
    return {"server_args": args, "conditions": conds, "rounds": rounds, "ray": ray.__version__,
            f"texts_equal_{conds[0]}": same}


# --- report -------------------------------------------------------------------------------------------------------
def med(rounds: list[dict], cond: str, i: int, key: str):
    xs = [r[cond]["levels"][i][key] for r in rounds if cond in r and r[cond]["levels"][i].get(key) is not None]
    return round(statistics.median(xs), 2) if xs else None


def ratio(x, y) -> float | None:
    return round(x / y, 2) if x and y else None


def replicas_markdown(rep: dict, clients: list[int]) -> str:
    rounds, conds = rep["rounds"], rep["conditions"]
    multi = [c for c in conds if c.startswith("serve-") and c != "serve-1"]
    head = "| clients | " + " | ".join(f"{c} tok/s | {c} TTFT p50 / p99 ms" for c in conds)
    head += "".join(f" | {c} / serve-1" for c in multi) + " |"
    out = [head, "|---" * (1 + 2 * len(conds) + len(multi)) + "|"]
    for i, n in enumerate(clients):
        row = [str(n)]
        for c in conds:
            spread = "/".join(str(v) for r in rounds for v in sorted(r[c]["levels"][i]["per_replica"].values())
                              ) if c in multi else ""
            row += [fmt(med(rounds, c, i, "tok_per_s")) + (f" ({spread})" if spread else ""),
                    f"{fmt(med(rounds, c, i, 'ttft_ms_p50'))} / {fmt(med(rounds, c, i, 'ttft_ms_p99'))}"]
        row += [f"**{fmt(ratio(med(rounds, c, i, 'tok_per_s'), med(rounds, 'serve-1', i, 'tok_per_s')))}**"
                for c in multi]
        out.append("| " + " | ".join(row) + " |")
    gpus = "; ".join(f"{c}: {r[c].get('gpu_mib')}" for r in rounds[:1] for c in conds)
    states = "; ".join(f"{c}: {r[c]['replica_states']}" for r in rounds[:1] for c in conds if c.startswith("serve"))
    same = ", ".join(f"{c} {'yes' if v else 'NO'}" for c, v in rep[f"texts_equal_{conds[0]}"].items())
    out += ["", f"GPU memory in use (MiB per GPU, first round): {gpus}. Serve's engine replicas: {states}. "
            f"Requests per replica in brackets (all rounds). Greedy texts of {PROBES} probes equal to "
            f"{conds[0]}'s: {same or '-'}. Server flags: `{' '.join(rep['server_args']) or '(defaults)'}`; "
            f"Ray {rep['ray']}."]
    return "\n".join(out) + "\n"


def write_doc(part: str, table: str) -> None:
    begin, end = f"<!-- bench_scale_out_{part}:begin -->", f"<!-- bench_scale_out_{part}:end -->"
    text = DOC.read_text(encoding="utf-8")
    block = f"{begin}\n{table}{end}"
    if begin in text and end in text:
        text = text.split(begin, 1)[0] + block + text.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    DOC.write_text(text, encoding="utf-8")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    p.add_argument("--part", choices=("replicas", "split"), required=True)
    p.add_argument("--clients", type=ints, default=[1, 2, 4, 8, 16, 32], help="replicas: concurrency levels")
    p.add_argument("--requests", type=int, default=2, help="streamed requests per client per level (default 2)")
    p.add_argument("--tokens", type=int, default=128, help="max_tokens per request, ignore_eos (default 128)")
    p.add_argument("--rounds", type=int, default=1, help="rounds over all conditions (medians reported)")
    r = p.add_argument_group("replicas")
    r.add_argument("--replicas", type=ints, default=[1, 2], help="engine replica counts (must hold 1)")
    r.add_argument("--server-args", default="", help="pydflash-server flags of the preset (GPU: \"-ngl -1\")")
    r.add_argument("--tiny", action="store_true", help="a tiny factory pair instead of the default pair (CPU)")
    r.add_argument("--no-direct", dest="direct", action="store_false", help="skip the direct pydflash-server")
    r.add_argument("--ray-cpus", type=float, default=0, help="CPUs of the Ray instance (default: all)")
    s = p.add_argument_group("split (scripts/bench/rpc_split.py)")
    s.add_argument("--target", help="the target GGUF to split (default: the 4B-scale factory target)")
    s.add_argument("--drafter", help="its DFlash drafter GGUF")
    s.add_argument("--split-clients", type=ints, default=[1, 4], help="split: concurrency levels (default 1,4)")
    s.add_argument("--only", default="", help="split: comma-separated conditions (default: all that can run)")
    s.add_argument("--synth-len", type=float, default=5.0,
                   help="split: the synthetic acceptance of the spec-synth conditions (0 = none)")
    s.add_argument("--llama-server", help="split: native llama-server for the -sm layer baseline")
    s.add_argument("--threads", type=int, default=0, help="split: pydflash-server -t (0 = llama.cpp's default)")
    p.add_argument("--out", default=default_out("scale_out.json"), help="JSON report; the tables go next to it")
    p.add_argument("--doc", action="store_true", help=f"also write the tables into {DOC.relative_to(REPO)}")
    a = p.parse_args(argv)
    if a.part == "replicas" and 1 not in a.replicas:
        p.error("--replicas must include 1 (the scaling factor is against one replica)")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-scale-out-"))
    report = {"argv": sys.argv[1:] if argv is None else list(argv), "commit": tree_commit(), "machine": machine(),
              "date": time.strftime("%Y-%m-%d"), "part": a.part, "logs": str(work)}
    if a.part == "replicas":
        report["replicas"] = run_replicas(a, work)
        table = replicas_markdown(report["replicas"], a.clients)
    else:
        import rpc_split

        report["split"] = rpc_split.run_split(a, work, measure)
        table = rpc_split.split_markdown(report["split"], a.split_clients)
    head = (f"Measured by `scripts/bench/scale_out.py {' '.join(report['argv'])}` at {report['commit']}, "
            f"{report['date']}: {report['machine']['cpu']}, {report['machine']['cores_usable']} cores, GPU "
            f"{report['machine'].get('gpu') or 'none'}. Raw numbers: `{a.out}`.\n\n")
    out = pathlib.Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    out.with_suffix(".md").write_text(head + table)
    print(head + table)
    if a.doc:
        write_doc(a.part, head + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
