#!/usr/bin/env python3
"""Scale-out on Ray Serve: aggregate tok/s at 1 and 2 engine replicas, and what Ray adds per request.

One run measures three conditions side by side on one preset (the embedded Gemma-3-270M pair unless ``--tiny``):

- ``direct``: ``pydflash-server --config models.toml`` (router + one worker process), the reference;
- ``serve-1`` / ``serve-2``: ``pydflash.server.ray.app`` on a local Ray instance with 1 and 2 engine replicas, each
  replica holding the preset (``--threads`` llama.cpp threads, the same number of Ray CPUs).

For each condition and each concurrency C, C clients each send N streamed completions one after another
(``scripts/bench/server_load.py``'s clients and summary: aggregate tok/s over the level's wall time, TTFT, frame gaps),
after one untimed warm-up round. Then the latency probe: ``--latency-requests`` sequential non-streamed requests
for one token (a short prompt: prefill + one step), whose median is the per-request cost of the path. Conditions
are interleaved by round (``--rounds``); the medians over rounds go to the table.

    .venv/bin/python scripts/bench/scale_out.py                      # writes docs/results/2026-12-01-cpu/scale_out_cpu.json + the table
    .venv/bin/python scripts/bench/scale_out.py --tiny --clients 1,4 --no-doc   # a quick smoke run

The table is written into docs/scale-out.md between the ``bench_scale_out`` markers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

import httpx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from results import default_out, results_dir  # noqa: E402,F401  (scripts/ is not a package)
from server_load import (  # noqa: E402
    PROMPTS, Server, fmt, machine, ms, pct, stream_completion, summarize, tree_commit,
)

REPO = pathlib.Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "scale-out.md"
BEGIN, END = "<!-- bench_scale_out:begin -->", "<!-- bench_scale_out:end -->"


def write_models(folder: pathlib.Path, a: argparse.Namespace) -> pathlib.Path:
    if a.tiny:
        from pydflash.factory import write_tiny_pair

        pair = write_tiny_pair(folder / "tiny", arch="gemma3", seed=0)
        target, drafter = f'"{pair.target}"', f'"{pair.drafter}"'
    else:
        target, drafter = '"embedded"', None
    lines = ['["bench"]', f"target = {target}", f"n_slots = {a.slots}", f"n_ctx_slot = {a.ctx}",
             f"n_threads = {a.threads}"]
    if drafter:
        lines.append(f"drafter = {drafter}")
    path = folder / "models.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


# --- one condition ----------------------------------------------------------------------------------------------
async def level(base: str, clients: int, a: argparse.Namespace) -> dict:
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    served: dict[str, int] = {}  # timed requests per engine replica (X-Pydflash-Replica; direct: none)
    timed = False

    async def count(resp: httpx.Response) -> None:
        if timed:
            name = resp.headers.get("x-pydflash-replica", "direct").rsplit("#", 1)[-1]
            served[name] = served.get(name, 0) + 1

    async with httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(600.0), limits=limits,
                                 event_hooks={"response": [count]}) as client:
        body = {"model": "bench", "max_tokens": a.tokens, "temperature": 0, "ignore_eos": True}
        await asyncio.gather(*(stream_completion(client, {**body, "prompt": PROMPTS[i % len(PROMPTS)]})
                               for i in range(clients)))  # warm-up, untimed

        async def one_client(i: int) -> list[dict]:
            return [await stream_completion(client, {**body, "prompt": PROMPTS[(i * a.requests + j) % len(PROMPTS)]})
                    for j in range(a.requests)]

        timed = True
        t0 = time.perf_counter()
        runs = [r for rs in await asyncio.gather(*(one_client(i) for i in range(clients))) for r in rs]
        return {**summarize(runs, time.perf_counter() - t0, clients), "per_replica": sorted(served.values())}


def latency(base: str, n: int) -> dict:
    """Sequential one-token requests: the cost of the path with the least engine work."""
    body = {"model": "bench", "prompt": "Hello", "max_tokens": 1, "temperature": 0}
    out = []
    with httpx.Client(base_url=base, timeout=60) as c:
        for i in range(n + 3):
            t0 = time.perf_counter()
            r = c.post("/v1/completions", json=body)
            r.raise_for_status()
            if i >= 3:  # the first few warm the connection and the prompt cache
                out.append(time.perf_counter() - t0)
    return {"n": n, "p50_ms": ms(pct(out, 0.5)), "p90_ms": ms(pct(out, 0.9))}


def measure(base: str, a: argparse.Namespace) -> dict:
    load = os.getloadavg()[0]  # the machine is shared: what else ran shows here
    levels = [asyncio.run(level(base, c, a)) for c in a.clients]
    return {"loadavg_1min_at_start": load, "levels": levels, "latency": latency(base, a.latency_requests)}


def run_direct(cfg: pathlib.Path, a: argparse.Namespace, log_dir: pathlib.Path) -> dict:
    srv = Server(["--config", str(cfg), "--max-resident", "1"], log_dir / "direct.log", ready_timeout=300)
    try:
        return measure(srv.base, a)
    finally:
        srv.stop()


def run_serve(cfg: pathlib.Path, replicas: int, a: argparse.Namespace, base: str) -> dict:
    from ray import serve

    from pydflash.server.preset import ServerModels
    from pydflash.server.ray.app import build

    app = build(ServerModels.from_toml(cfg), max_models_per_replica=1,
                engine_options={"num_replicas": replicas, "ray_actor_options": {"num_cpus": a.threads}})
    serve.run(app, name="bench", route_prefix="/")
    try:
        return measure(base, a)
    finally:
        serve.delete("bench")


# --- report -------------------------------------------------------------------------------------------------------
def median_level(rounds: list[dict], cond: str, i: int, key: str):
    xs = [r[cond]["levels"][i][key] for r in rounds if r[cond]["levels"][i][key] is not None]
    return round(statistics.median(xs), 2) if xs else None


def median_latency(rounds: list[dict], cond: str, key: str):
    return round(statistics.median(r[cond]["latency"][key] for r in rounds), 2)


def split(rounds: list[dict], cond: str, i: int) -> str:
    """How the timed requests spread over the replicas, per round: " (4/4, 3/5)"; nothing for one replica."""
    n = int(cond.split("-")[1]) if cond.startswith("serve-") else 1
    if n < 2:
        return ""
    per = [r[cond]["levels"][i].get("per_replica", []) for r in rounds]
    return " (" + ", ".join("/".join(map(str, [0] * (n - len(p)) + p)) for p in per) + ")"


def ratio(x, y) -> str:
    return f"{x / y:.2f}" if x and y else "-"


def markdown(report: dict) -> str:
    a, rounds = report["args"], report["rounds"]
    conds = ["direct"] + [f"serve-{r}" for r in a["replicas"]]
    names = {"direct": "direct pydflash-server", **{f"serve-{r}": f"Serve, {r} replica{'s' * (r > 1)}"
                                                     for r in a["replicas"]}}
    m = report["machine"]
    out = [f"Measured by `scripts/bench/scale_out.py {' '.join(report['argv'])}` at {report['commit']}, "
           f"{report['date']}: {m['cpu']}, {m['cores_usable']} usable cores (shared; load average at start "
           f"{', '.join(f'{x:.1f}' for x in m['loadavg_at_start'])}), Ray {report['ray']}. Preset: "
           f"{'the tiny factory gemma3 pair' if a['tiny'] else 'the embedded Gemma-3-270M Q4_K_M + shipped drafter'}"
           f", {a['slots']} slots of {a['ctx']} tokens, {a['threads']} llama.cpp thread(s) per engine (and per "
           f"replica as Ray CPUs); {a['requests']} streamed requests of {a['tokens']} tokens per client; median of "
           f"{len(rounds)} round(s), conditions interleaved per round. Raw numbers: `{report['json']}`.", "",
           "| clients | " + " | ".join(f"{names[c]} tok/s" for c in conds) + " | "
           + " | ".join(f"{r} / 1 replica" for r in a["replicas"] if r > 1) + " | 1 replica / direct |",
           "|---" * (len(conds) + len([r for r in a["replicas"] if r > 1]) + 2) + "|"]
    for i, c in enumerate(a["clients"]):
        tps = {k: median_level(rounds, k, i, "tok_per_s") for k in conds}
        row = [str(c)] + [fmt(tps[k]) + split(rounds, k, i) for k in conds]
        row += [f"**{ratio(tps[f'serve-{r}'], tps['serve-1'])}**" for r in a["replicas"] if r > 1]
        row.append(ratio(tps["serve-1"], tps["direct"]))
        out.append("| " + " | ".join(row) + " |")
    loads = "; ".join(", ".join(f"{k} {r[k].get('loadavg_1min_at_start', 0):.1f}" for k in conds) for r in rounds)
    out += ["", f"Load average (1 min) when each condition started, by round: {loads}.",
            "", "Per request, one client (what the Ray path adds over the direct server):", "",
            "| | " + " | ".join(names[c] for c in conds) + " | Ray adds (1 replica - direct) |",
            "|---" * (len(conds) + 2) + "|"]
    lat = {k: median_latency(rounds, k, "p50_ms") for k in conds}
    out.append(f"| one-token request, p50 ms ({a['latency_requests']} sequential) | "
               + " | ".join(fmt(lat[k]) for k in conds) + f" | {lat['serve-1'] - lat['direct']:+.1f} ms |")
    if 1 in a["clients"]:
        i = a["clients"].index(1)
        for key, label in (("ttft_ms_p50", "streamed TTFT p50, ms"), ("gap_ms_p50", "gap between frames p50, ms")):
            v = {k: median_level(rounds, k, i, key) for k in conds}
            delta = f"{v['serve-1'] - v['direct']:+.2f} ms" if v["serve-1"] and v["direct"] else "-"
            out.append(f"| {label} | " + " | ".join(fmt(v[k]) for k in conds) + f" | {delta} |")
    return "\n".join(out) + "\n"


def write_doc(table: str, doc: pathlib.Path) -> None:
    text = doc.read_text(encoding="utf-8") if doc.exists() else ""
    block = f"{BEGIN}\n{table}{END}"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    doc.write_text(text, encoding="utf-8")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    p.add_argument("--clients", type=ints, default=[1, 4, 8], help="concurrency levels (default 1,4,8)")
    p.add_argument("--replicas", type=ints, default=[1, 2], help="engine replica counts (default 1,2; must hold 1)")
    p.add_argument("--requests", type=int, default=2, help="streamed requests per client (default 2)")
    p.add_argument("--tokens", type=int, default=64, help="max_tokens per request (default 64)")
    p.add_argument("--slots", type=int, default=4, help="slots per engine (default 4)")
    p.add_argument("--ctx", type=int, default=1024, help="context per slot (default 1024)")
    p.add_argument("--threads", type=int, default=1, help="llama.cpp threads per engine = Ray CPUs per replica")
    p.add_argument("--latency-requests", type=int, default=30, help="sequential one-token requests (default 30)")
    p.add_argument("--rounds", type=int, default=1, help="rounds over all conditions (default 1)")
    p.add_argument("--tiny", action="store_true", help="the tiny factory pair instead of Gemma-3-270M (smoke runs)")
    p.add_argument("--out", default=default_out("scale_out.json"), help="JSON report (relative to the repo)")
    p.add_argument("--no-doc", action="store_true", help=f"do not write the table into {DOC.relative_to(REPO)}")
    a = p.parse_args(argv)
    if 1 not in a.replicas:
        p.error("--replicas must include 1 (the ratios are against one replica)")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    import ray
    from ray import serve

    from server_load import free_port

    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-scale-out-"))
    cfg = write_models(work, a)
    report = {"argv": sys.argv[1:] if argv is None else list(argv), "commit": tree_commit(), "machine": machine(),
              "date": time.strftime("%Y-%m-%d"), "ray": ray.__version__, "json": a.out,
              "args": {k: v for k, v in vars(a).items() if k not in ("out", "no_doc")}, "rounds": []}
    port = free_port()
    ray.init(num_cpus=max(a.replicas) * a.threads, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        for rnd in range(a.rounds):
            res = {"direct": run_direct(cfg, a, work)}
            print(f"round {rnd + 1}: direct {[lv['tok_per_s'] for lv in res['direct']['levels']]} tok/s",
                  file=sys.stderr, flush=True)
            for r in a.replicas:
                res[f"serve-{r}"] = run_serve(cfg, r, a, f"http://127.0.0.1:{port}")
                print(f"round {rnd + 1}: serve-{r} {[lv['tok_per_s'] for lv in res[f'serve-{r}']['levels']]} tok/s",
                      file=sys.stderr, flush=True)
            report["rounds"].append(res)
    finally:
        serve.shutdown()
        ray.shutdown()
    (REPO / a.out).write_text(json.dumps(report, indent=1) + "\n")
    table = markdown(report)
    print(table)
    if not a.no_doc:
        write_doc(table, DOC)
    return 0


if __name__ == "__main__":
    sys.exit(main())
