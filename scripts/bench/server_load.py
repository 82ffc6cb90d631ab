#!/usr/bin/env python3
"""Load generator for pydflash-server over HTTP: real SSE streams from concurrent async clients (httpx).

For each mode (a server started with that mode's flags, or per-request fields against a running server) and each
concurrency level C, C clients each send N streamed completions of fixed prompts ("temperature": 0,
"ignore_eos": true, "max_tokens": M) one after another. Reported per (mode, C):

- requests/s and generated tokens/s: all requests (or tokens) over the wall time of the level, first send to last
  [DONE]; tokens are the server's ``usage.completion_tokens``;
- time to first token (TTFT): send -> the first SSE frame that carries text (median, p90);
- inter-token gap: the time between consecutive text frames of one stream, pooled over all streams (median, p99).
  A frame can carry several tokens (an accepted draft block, or text held back to finish a UTF-8 character or a
  possible stop string), so with speculation this is the gap between deliveries, not a per-token time; the
  ``tok/frame`` column says how many tokens a frame carried on average;
- the server's ``timings.draft_n`` / ``draft_n_accepted`` summed over the level (from the usage chunk).

Then the long-prefill probe: one stream runs (short prompt); after it has delivered some frames a second request
arrives whose prompt is ~4,000 tokens. Reported: that stream's median gap before the arrival, its largest gap
between the arrival and the long request's first token (its prefill), and the long request's TTFT. The slot
context must hold the long prompt: start the server with ``-c 8192``.

    .venv/bin/python scripts/bench/server_load.py --start "-np 16 -c 8192 -t 2" --modes spec,plain \
        --tokens 32 --requests 2 --out docs/results/2026-12-01-cpu/server_cpu.json
    .venv/bin/python scripts/bench/server_load.py --url http://127.0.0.1:8080 --modes spec,plain-req

Modes: ``spec`` (the server's default: adaptive drafting), ``plain`` (the same server started with ``--no-spec``:
no drafter), ``fixed`` (``--no-draft-adaptive --draft-max K``), ``plain-req`` (``"speculative": {"enabled":
false}`` per request, on the spec server; the only plain mode with ``--url``). The results go to a JSON file and a
markdown file next to it (same stem), with the machine, the exact commands and the commits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import platform
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

import httpx
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # scripts/ is not a package
from results import default_out  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
LLAMA_CPP_COMMIT = "0c1e570"  # vendor/llama.cpp (llama-cpp-python 0.3.36 sdist), plus patches/000*.patch

PROMPTS = [
    "The history of the printing press begins",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Question: A train travels 120 km in 2 hours. What is its average speed?\nAnswer:",
    "Here is a short story about a lighthouse keeper who",
    "The three most important ideas in thermodynamics are",
    "SELECT name, COUNT(*) FROM orders",
    "Dear team,\n\nI am writing to let you know that",
    "In Rust, ownership means that",
]
# ~150 tokens of varied prose, repeated to build the long prompt
LONG_TEXT = (
    "The committee met on a grey Tuesday morning to review the quarterly figures. Revenue had grown in every region "
    "except the north, where two warehouses had closed after the flood. The chair asked each manager to explain the "
    "variance in their own words, and the discussion ran well past noon. Afterwards the analysts rebuilt the "
    "forecast from the invoices up, checked it against the bank statements, and found a rounding error that had "
    "quietly doubled a shipping charge for three months. Nobody was surprised; everybody was relieved. "
)


@dataclass
class Mode:
    name: str
    server_args: list[str] = field(default_factory=list)  # added to --start ARGS
    request: dict = field(default_factory=dict)  # added to every request body


def without_drafter(args: list[str]) -> list[str]:
    """Start args minus ``-md FILE``: pydflash-server refuses ``-md`` together with ``--no-spec``."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in ("-md", "--model-draft"):
            skip = True
        elif not a.startswith("--model-draft="):
            out.append(a)
    return out


def modes_from(names: list[str], fixed_k: int) -> list[Mode]:
    table = {
        "spec": Mode("spec"),
        "plain": Mode("plain", ["--no-spec"]),
        "fixed": Mode(f"fixed K={fixed_k}", ["--no-draft-adaptive", "--draft-max", str(fixed_k)]),
        "plain-req": Mode("plain-req", request={"speculative": {"enabled": False}}),
    }
    bad = [n for n in names if n not in table]
    if bad:
        raise SystemExit(f"bench_server: unknown mode(s) {bad}; known: {sorted(table)}")
    return [table[n] for n in names]


# --- statistics ---------------------------------------------------------------------------------------------------
def pct(xs: list[float], q: float) -> float | None:
    """The q-quantile (0..1), linear between closest ranks; None for no data."""
    if not xs:
        return None
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def ms(x: float | None) -> float | None:
    return None if x is None else round(1000 * x, 2)


# --- one stream ---------------------------------------------------------------------------------------------------
class StreamError(Exception):
    pass


DONE = object()  # what sse_event returns for ``data: [DONE]``


def sse_event(line: str):
    """One SSE line of an OpenAI stream: None (not a data line), DONE, or the frame's JSON object; an error event
    raises StreamError."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == "[DONE]":
        return DONE
    obj = json.loads(data)
    if "error" in obj:
        raise StreamError(f"error event: {obj['error']}")
    return obj


async def stream_completion(client: httpx.AsyncClient, body: dict, on_frame=None, stop: asyncio.Event | None = None):
    """POST a streamed completion; returns send time, text-frame times, end time, usage and timings.

    ``on_frame(t)`` is called at each text frame; if ``stop`` is set the stream is closed early (the server cancels
    the request when the client goes away)."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    frames: list[float] = []
    usage = timings = None
    async with client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise StreamError(f"HTTP {r.status_code}: {(await r.aread())[:500]!r}")
        async for line in r.aiter_lines():
            obj = sse_event(line)
            if obj is None:
                continue
            if obj is DONE:
                break
            now = time.perf_counter()
            choices = obj.get("choices") or []
            if choices and choices[0].get("text"):
                frames.append(now)
                if on_frame:
                    on_frame(now)
            if obj.get("usage"):
                usage, timings = obj["usage"], obj.get("timings")
            if stop is not None and stop.is_set():
                break
    return {"t0": t0, "t1": time.perf_counter(), "frames": frames, "usage": usage, "timings": timings}


def request_body(mode: Mode, prompt, max_tokens: int) -> dict:
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, **mode.request}


# --- one concurrency level ----------------------------------------------------------------------------------------
def client_limits(clients: int) -> httpx.Limits:
    """The benchmark client's pool: a connection per client and a few spare. Idle connections leave it after 2 s:
    llama-server closes one after 5 s idle, uvicorn by default too, and httpx's own 5 s races that close (a request
    sent as the server closes its connection is lost: ReadError). Interleaved rounds leave a server's clients idle
    while the others play theirs, ~5 s at 16 clients with four servers up: two requests were lost so on 2026-12-06."""
    return httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4, keepalive_expiry=2.0)


async def run_level(base: str, mode: Mode, clients: int, n_req: int, max_tokens: int, warmup: bool) -> dict:
    limits = client_limits(clients)
    async with httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(600.0), limits=limits) as client:
        if warmup:  # untimed: graph shapes for this batch size, adaptive drafting's step-cost calibration
            await asyncio.gather(*(stream_completion(client, request_body(mode, PROMPTS[i % len(PROMPTS)], max_tokens))
                                   for i in range(clients)))

        async def one_client(i: int) -> list[dict]:
            out = []
            for j in range(n_req):
                prompt = PROMPTS[(i * n_req + j) % len(PROMPTS)]
                out.append(await stream_completion(client, request_body(mode, prompt, max_tokens)))
            return out

        t_start = time.perf_counter()
        per_client = await asyncio.gather(*(one_client(i) for i in range(clients)))
        wall = time.perf_counter() - t_start
    runs = [r for rs in per_client for r in rs]
    return summarize(runs, wall, clients)


def summarize(runs: list[dict], wall: float, clients: int) -> dict:
    ttft = [r["frames"][0] - r["t0"] for r in runs if r["frames"]]
    gaps = [b - a for r in runs for a, b in zip(r["frames"], r["frames"][1:])]
    tokens = sum(r["usage"]["completion_tokens"] for r in runs if r["usage"])
    frames = sum(len(r["frames"]) for r in runs)
    draft_n = sum((r["timings"] or {}).get("draft_n", 0) for r in runs)
    draft_ok = sum((r["timings"] or {}).get("draft_n_accepted", 0) for r in runs)
    # time per output token of each stream after its first frame (the decode rate one client sees)
    tpot = [(r["frames"][-1] - r["frames"][0]) / (r["usage"]["completion_tokens"] - 1)
            for r in runs if r["usage"] and r["usage"]["completion_tokens"] > 1 and len(r["frames"]) > 1]
    return {
        "clients": clients, "requests": len(runs), "wall_s": round(wall, 3),
        "req_per_s": round(len(runs) / wall, 3), "tok_per_s": round(tokens / wall, 2), "completion_tokens": tokens,
        "ttft_ms_p50": ms(pct(ttft, 0.5)), "ttft_ms_p90": ms(pct(ttft, 0.9)),
        "gap_ms_p50": ms(pct(gaps, 0.5)), "gap_ms_p99": ms(pct(gaps, 0.99)), "gap_ms_max": ms(max(gaps, default=None)),
        "tpot_ms_p50": ms(pct(tpot, 0.5)), "tokens_per_frame": round(tokens / frames, 2) if frames else None,
        "draft_n": draft_n, "draft_n_accepted": draft_ok,
        "acceptance": round(draft_ok / draft_n, 3) if draft_n else None,
    }


# --- the long-prefill probe ---------------------------------------------------------------------------------------
async def long_prompt_ids(client: httpx.AsyncClient, n: int) -> list[int]:
    r = await client.post("/tokenize", json={"content": LONG_TEXT, "add_special": False})
    r.raise_for_status()
    unit = r.json()["tokens"]
    bos = (await client.post("/tokenize", json={"content": "", "add_special": True})).json()["tokens"]
    ids = list(bos)
    while len(ids) < n:
        ids += unit
    return ids[:n]


async def long_prefill_probe(base: str, mode: Mode, n_prompt: int, frames_before: int, stream_tokens: int) -> dict:
    """One stream runs; after ``frames_before`` of its text frames, a request with an n_prompt-token prompt
    arrives. Returns the stream's median gap before the arrival and its largest gap during the long prefill."""
    async with httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(600.0)) as client:
        ids = await long_prompt_ids(client, n_prompt)
        started = asyncio.Event()
        stop = asyncio.Event()
        times: list[float] = []

        def on_frame(t: float) -> None:
            times.append(t)
            if len(times) >= frames_before:
                started.set()

        running = asyncio.create_task(stream_completion(
            client, request_body(mode, PROMPTS[0], stream_tokens), on_frame=on_frame, stop=stop))
        waiter = asyncio.create_task(started.wait())
        await asyncio.wait({running, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if running.done() and not started.is_set():
            waiter.cancel()
            running.result()  # its own error, if it failed
            raise StreamError(f"the running stream ended after {len(times)} frames, before the probe began")
        long_res = await stream_completion(client, request_body(mode, ids, 4))
        t_arrive, t_long_first = long_res["t0"], (long_res["frames"] or [long_res["t1"]])[0]
        n_at_end = len(times)
        while not running.done() and len(times) < n_at_end + 8:  # a few frames after the prefill, then hang up
            await asyncio.sleep(0.01)
        stop.set()
        try:
            await asyncio.wait_for(running, timeout=60)
        except asyncio.TimeoutError:
            running.cancel()
    before = [b - a for a, b in zip(times, times[1:]) if b <= t_arrive]
    # every gap that overlaps [arrival, the long request's first token]
    during = [b - a for a, b in zip(times, times[1:]) if b > t_arrive and a < t_long_first]
    ended_early = bool(times) and times[-1] < t_long_first
    median = pct(before, 0.5)
    worst = max(during, default=None)
    return {
        "prompt_tokens": len(ids), "stream_frames": len(times), "frames_before_arrival": len(before) + 1,
        "median_gap_ms_before": ms(median), "largest_gap_ms_during_prefill": ms(worst),
        "largest_over_median": round(worst / median, 1) if worst and median else None,
        "long_ttft_ms": ms(t_long_first - t_arrive), "stream_ended_before_prefill_done": ended_early,
        "long_prompt_tokens_server": (long_res["usage"] or {}).get("prompt_tokens"),
    }


# --- the server ---------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerStartError(SystemExit):
    """The server exited or never became healthy (a SystemExit, so this script still ends with one line)."""


class Server:
    """pydflash-server in its own process group (the router and its workers go down together).

    ``program`` swaps in another server that takes ``--port`` and answers ``GET /health`` with 200 once ready
    (scripts/bench/http_vs_native.py passes a native llama-server binary)."""

    def __init__(self, args: list[str], log_path: pathlib.Path, ready_timeout: float,
                 program: list[str] | None = None, env: dict[str, str] | None = None):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        program = program or [sys.executable, "-m", "pydflash.cli.server"]
        self.cmd = [*program, "--port", str(self.port), *args]
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(self.cmd, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True, env={**os.environ, **(env or {})})
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()  # a router whose worker lives on, and the log file
                raise ServerStartError(f"bench_server: the server exited ({self.proc.returncode}); see {log_path}")
            try:
                if httpx.get(self.base + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise ServerStartError(f"bench_server: the server was not healthy after {ready_timeout} s; see {log_path}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=20)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.log.close()


# --- report -------------------------------------------------------------------------------------------------------
def machine() -> dict:
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    info = {"host": platform.node(), "cpu": cpu, "cores_usable": len(os.sched_getaffinity(0)),
            "python": platform.python_version(), "loadavg_at_start": os.getloadavg()}
    try:
        info["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                      "--format=csv,noheader"],
                                     capture_output=True, text=True, timeout=20).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        info["gpu"] = None
    return info


def tree_commit() -> str:
    if os.environ.get("PYDFLASH_TREE_COMMIT"):  # the device copy has no .git: the carry records it
        return os.environ["PYDFLASH_TREE_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()
        return head + (" (+ uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def fmt(x) -> str:
    return "-" if x is None else f"{x:g}" if isinstance(x, float) else str(x)


def markdown(report: dict) -> str:
    p = report["params"]
    lines = [
        f"Machine: {report['machine']['cpu']}, {report['machine']['cores_usable']} usable cores"
        + (f", GPU {report['machine']['gpu']}" if report["machine"].get("gpu") else "")
        + f"; load average {report['machine']['loadavg_at_start'][0]:.1f} at the start, "
        f"{report['machine']['loadavg_at_end'][0]:.1f} at the end.",
        f"Tree: pydflash {report['pydflash_commit']}; llama.cpp {report['llama_cpp_commit']}. {report['date']}.",
        "",
        f"Each client sends {p['requests']} streamed completions one after another (fixed prompts, temperature 0, "
        f"ignore_eos, max_tokens {p['tokens']}){'; one untimed warm-up round per level' if p['warmup'] else ''}.",
        "",
        "| mode | clients | requests | req/s | tok/s | TTFT p50 ms | TTFT p90 ms | gap p50 ms | gap p99 ms | "
        "tok/frame | accepted/drafted | tok/s vs plain |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    plain_name = next((m for m in report["results"] if m.startswith("plain")), None)
    for name, res in report["results"].items():
        for lvl in res["levels"]:
            base = None
            if plain_name:
                base = next((x["tok_per_s"] for x in report["results"][plain_name]["levels"]
                             if x["clients"] == lvl["clients"]), None)
            ratio = round(lvl["tok_per_s"] / base, 2) if base else None
            acc = f"{lvl['draft_n_accepted']}/{lvl['draft_n']}" if lvl["draft_n"] else "-"
            lines.append(f"| {name} | {lvl['clients']} | {lvl['requests']} | {fmt(lvl['req_per_s'])} | "
                         f"{fmt(lvl['tok_per_s'])} | {fmt(lvl['ttft_ms_p50'])} | {fmt(lvl['ttft_ms_p90'])} | "
                         f"{fmt(lvl['gap_ms_p50'])} | {fmt(lvl['gap_ms_p99'])} | {fmt(lvl['tokens_per_frame'])} | "
                         f"{acc} | {fmt(ratio)} |")
    if any(res.get("long_prefill") for res in report["results"].values()):
        lines += [
            "",
            f"Long prefill: one stream runs; after {p['frames_before']} of its frames a request with a "
            f"{p['long_prompt']}-token prompt arrives (max_tokens 4).",
            "",
            "| mode | stream's median gap before, ms | its largest gap during the prefill, ms | largest / median | "
            "long request's TTFT, ms |",
            "|---|---|---|---|---|",
        ]
        for name, res in report["results"].items():
            lp = res.get("long_prefill")
            if not lp:
                continue
            if "error" in lp:
                lines.append(f"| {name} | error: {lp['error']} | | | |")
                continue
            note = " (stream ended first)" if lp["stream_ended_before_prefill_done"] else ""
            lines.append(f"| {name} | {fmt(lp['median_gap_ms_before'])} | {fmt(lp['largest_gap_ms_during_prefill'])}"
                         f"{note} | {fmt(lp['largest_over_median'])} | {fmt(lp['long_ttft_ms'])} |")
    lines += ["", "Commands:", ""] + [f"    {c}" for c in report["commands"]]
    return "\n".join(lines) + "\n"


# --- main ---------------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--url", help="a running server (only request-level modes: spec, plain-req)")
    src.add_argument("--start", help="start pydflash-server with these ARGS for each mode (quote them)")
    ap.add_argument("--modes", default="spec,plain", help="comma-separated: spec, plain, fixed, plain-req")
    ap.add_argument("--fixed-k", type=int, default=15, help="drafts per step of the fixed mode")
    ap.add_argument("--clients", default="1,4,16", help="concurrency levels (\"\" = only the long-prefill probe)")
    ap.add_argument("--requests", type=int, default=2, help="requests per client per level")
    ap.add_argument("--tokens", type=int, default=32, help="max_tokens of each request (ignore_eos)")
    ap.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up round of each level")
    ap.add_argument("--long-prompt", type=int, default=4000, help="prompt tokens of the long-prefill probe (0 = off)")
    ap.add_argument("--frames-before", type=int, default=16, help="running stream frames before the long prompt")
    ap.add_argument("--stream-tokens", type=int, default=1024, help="max_tokens of the probe's running stream")
    ap.add_argument("--ready-timeout", type=float, default=600.0)
    ap.add_argument("--out", default=default_out("server_load.json"),
                    help="JSON report; the markdown goes next to it (.md)")
    ap.add_argument("--log-dir", default=None, help="server logs (default: next to --out)")
    args = ap.parse_args(argv)

    modes = modes_from([m.strip() for m in args.modes.split(",") if m.strip()], args.fixed_k)
    if args.url and any(m.server_args for m in modes):
        raise SystemExit("bench_server: with --url only request-level modes run (spec, plain-req)")
    levels = [int(c) for c in args.clients.split(",") if c.strip()]  # "" = only the long-prefill probe
    out = pathlib.Path(args.out)
    log_dir = pathlib.Path(args.log_dir) if args.log_dir else out.parent
    log_dir.mkdir(parents=True, exist_ok=True)
    report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
              "pydflash_commit": tree_commit(), "llama_cpp_commit": LLAMA_CPP_COMMIT,
              "params": {"modes": [m.name for m in modes], "clients": levels, "requests": args.requests,
                         "tokens": args.tokens, "warmup": not args.no_warmup, "long_prompt": args.long_prompt,
                         "frames_before": args.frames_before, "stream_tokens": args.stream_tokens},
              "commands": ["python " + " ".join(shlex.quote(a) for a in ["scripts/bench/server_load.py",
                                                                          *(argv or sys.argv[1:])])],
              "results": {}}
    for mode in modes:
        server = None
        base = args.url
        if args.start is not None:
            log_path = log_dir / f"{out.stem}.{mode.name.split()[0]}.log"
            start = shlex.split(args.start)
            if "--no-spec" in mode.server_args:
                start = without_drafter(start)
            server = Server([*start, *mode.server_args], log_path, args.ready_timeout)
            base = server.base
            report["commands"].append("pydflash-server " + " ".join(shlex.quote(a) for a in server.cmd[3:]))
        try:
            res = {"levels": []}
            for c in levels:
                lvl = asyncio.run(run_level(base, mode, c, args.requests, args.tokens, not args.no_warmup))
                print(f"{mode.name} c={c}: {lvl['tok_per_s']} tok/s, {lvl['req_per_s']} req/s, "
                      f"TTFT p50 {lvl['ttft_ms_p50']} ms, gap p50 {lvl['gap_ms_p50']} ms", file=sys.stderr, flush=True)
                res["levels"].append(lvl)
            if args.long_prompt:
                try:
                    res["long_prefill"] = asyncio.run(long_prefill_probe(
                        base, mode, args.long_prompt, args.frames_before, args.stream_tokens))
                except (StreamError, httpx.HTTPError) as exc:
                    res["long_prefill"] = {"error": str(exc)[:300]}
                print(f"{mode.name} long prefill: {res['long_prefill']}", file=sys.stderr, flush=True)
            report["results"][mode.name] = res
        finally:
            if server is not None:
                server.stop()
    report["machine"]["loadavg_at_end"] = os.getloadavg()  # other work on a shared machine skews absolute figures
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
