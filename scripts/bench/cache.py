#!/usr/bin/env python3
"""Prompt-cache benchmark: time to first token over a 6-turn chat, cache off against cache on.

Each round is one fresh conversation through ``/v1/chat/completions`` (stream, temperature 0): a ~1,000-token
system prompt, then 6 turns, each a short user message and a ~32-token answer (``ignore_eos``) appended to the
history, so every turn resends everything before it. The same conversation runs twice per round, once with
``"cache_prompt": false`` on every request and once with the default (on), in alternating order; each round has
its own system prompt (generated from a seeded word list, so it is reproducible and no round hits another's
cache). Reported per turn: prompt tokens, the server's ``cached_tokens``, and time to first token (send -> first
frame carrying a generated token), median over rounds with the range.

    .venv/bin/python scripts/bench/cache.py --start "-t 2" --rounds 3 --out docs/results/2026-12-01-cpu/cache_cpu.json
    .venv/bin/python scripts/bench/cache.py --start "-ngl -1" --rounds 5 --out docs/cache_gpu.json

``--start`` is added to ``pydflash-server`` (default: the embedded Gemma-3-270M pair). The JSON goes to --out;
the markdown table is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import shlex
import statistics
import sys
import time

import httpx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from results import default_out, results_dir  # noqa: E402,F401  (scripts/ is not a package)
from server_load import (  # noqa: E402
    DONE, LLAMA_CPP_COMMIT, Server, StreamError, fmt, machine, sse_event, tree_commit)

TURNS = [
    "Hi! Can you summarise your main rules in one sentence?",
    "What should I do if my parcel arrives damaged?",
    "And if it never arrives at all?",
    "Can I change the delivery address after ordering?",
    "How long do refunds usually take?",
    "Thanks. Anything else I should know before I order again?",
]
_TOPICS = ["returns", "refunds", "late deliveries", "damaged parcels", "address changes", "gift cards", "invoices",
           "warranty claims", "bulk orders", "student discounts", "lost passwords", "account deletion",
           "price matching", "pre-orders", "international shipping", "customs fees", "loyalty points", "repairs"]
_ACTIONS = ["apologise briefly and", "first confirm the order number, then", "check the order history and",
            "explain the policy in plain words and", "stay polite, keep it short, and"]
_OUTCOMES = ["offer a replacement", "offer a full refund", "open a ticket for the logistics team",
             "send the standard form by email", "escalate to a human agent", "explain the fourteen-day window",
             "point to the help page", "ask for a photo of the item"]
_COMPANIES = ["Northwind Traders", "Blue Harbor Supplies", "Maple & Pine Outfitters", "Quartz Lane Electronics",
              "Sundial Books", "Copperleaf Kitchenware", "Atlas Bicycle Works", "Juniper Garden Centre",
              "Harborlight Pharmacy", "Redwood Office Goods"]


def system_prompt(round_no: int, n_rules: int) -> str:
    """A deterministic support-policy prompt; the company (its first words) differs per round."""
    rng = random.Random(round_no)
    company = _COMPANIES[round_no % len(_COMPANIES)]
    lines = [f"You are the customer-support assistant of {company}. Answer in at most three sentences. "
             f"Follow these rules exactly."]
    for i in range(1, n_rules + 1):
        topic, act, out = rng.choice(_TOPICS), rng.choice(_ACTIONS), rng.choice(_OUTCOMES)
        days = rng.randint(2, 30)
        lines.append(f"Rule {i}: when a customer asks about {topic}, {act} {out}; if the order is older than "
                     f"{days} days, say so and {rng.choice(_OUTCOMES)}.")
    return "\n".join(lines)


def sized_system_prompt(client: httpx.Client, round_no: int, target: int) -> tuple[str, int]:
    """The system prompt with as many rules as bring it closest to ``target`` tokens (by /tokenize)."""
    def n_tokens(n_rules):
        r = client.post("/tokenize", json={"content": system_prompt(round_no, n_rules)})
        r.raise_for_status()
        return len(r.json()["tokens"])

    n_rules = 20
    n = n_tokens(n_rules)
    for _ in range(3):  # rules are about equally long: scale, re-measure
        n_rules = max(1, round(n_rules * target / n))
        n = n_tokens(n_rules)
    return system_prompt(round_no, n_rules), n


def chat_turn(client: httpx.Client, messages: list[dict], max_tokens: int, cache: bool) -> dict:
    """One streamed chat turn: TTFT (to the first frame carrying a generated token), the answer, usage."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, "return_tokens": True, "cache_prompt": cache}
    t0 = time.perf_counter()
    ttft = None
    text, usage, timings = [], None, None
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise StreamError(f"HTTP {r.status_code}: {r.read()[:500]!r}")
        for line in r.iter_lines():
            obj = sse_event(line)
            if obj is None:
                continue
            if obj is DONE:
                break
            for ch in obj.get("choices") or []:
                delta = ch.get("delta") or {}
                if ttft is None and (delta.get("content") or ch.get("tokens")):
                    ttft = time.perf_counter() - t0
                text.append(delta.get("content") or "")
            if obj.get("usage"):
                usage, timings = obj["usage"], obj.get("timings")
    if ttft is None or usage is None:
        raise StreamError("the stream carried no token or no usage")
    return {"ttft_ms": round(1000 * ttft, 1), "answer": "".join(text), "prompt_tokens": usage["prompt_tokens"],
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
            "completion_tokens": usage["completion_tokens"],
            "prompt_ms": round(timings["prompt_ms"], 1) if timings and timings.get("prompt_ms") is not None else None}


def conversation(client: httpx.Client, system: str, max_tokens: int, cache: bool) -> list[dict]:
    messages = [{"role": "system", "content": system}]
    turns = []
    for user in TURNS:
        messages.append({"role": "user", "content": user})
        t = chat_turn(client, messages, max_tokens, cache)
        messages.append({"role": "assistant", "content": t["answer"]})
        turns.append(t)
    return turns


def summarize(rounds: list[dict]) -> list[dict]:
    """Per turn: medians and ranges over rounds, cache off and on."""
    rows = []
    for i in range(len(TURNS)):
        row = {"turn": i + 1}
        for mode in ("off", "on"):
            ts = [r[mode][i]["ttft_ms"] for r in rounds]
            row[mode] = {"ttft_ms_median": round(statistics.median(ts), 1), "ttft_ms_min": min(ts),
                         "ttft_ms_max": max(ts),
                         "prompt_tokens_median": statistics.median(r[mode][i]["prompt_tokens"] for r in rounds),
                         "cached_tokens_median": statistics.median(r[mode][i]["cached_tokens"] for r in rounds),
                         "prompt_ms_median": _median(r[mode][i]["prompt_ms"] for r in rounds)}
        rows.append(row)
    return rows


def _median(xs):
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 1) if xs else None


def markdown(report: dict) -> str:
    out = ["| turn | prompt tokens | cached (on) | TTFT off, ms: median [range] | TTFT on, ms: median [range] "
           "| off / on | server prefill off / on, ms |", "|---|---|---|---|---|---|---|"]
    for row in report["summary"]:
        off, on = row["off"], row["on"]
        ratio = off["ttft_ms_median"] / on["ttft_ms_median"] if on["ttft_ms_median"] else None
        out.append(f"| {row['turn']} | {fmt(on['prompt_tokens_median'])} | {fmt(on['cached_tokens_median'])} "
                   f"| {off['ttft_ms_median']:g} [{off['ttft_ms_min']:g}-{off['ttft_ms_max']:g}] "
                   f"| {on['ttft_ms_median']:g} [{on['ttft_ms_min']:g}-{on['ttft_ms_max']:g}] "
                   f"| {'-' if ratio is None else f'{ratio:.1f}x'} "
                   f"| {fmt(off['prompt_ms_median'])} / {fmt(on['prompt_ms_median'])} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--start", default="", help="extra pydflash-server ARGS (quoted), e.g. \"-t 2\" or \"-ngl -1\"")
    ap.add_argument("--rounds", type=int, default=3, help="conversations per mode (>= 3 for a range)")
    ap.add_argument("--system-tokens", type=int, default=1000, help="size of the system prompt")
    ap.add_argument("--tokens", type=int, default=32, help="answer tokens per turn (ignore_eos)")
    ap.add_argument("--ready-timeout", type=float, default=600.0)
    ap.add_argument("--out", default=default_out("cache.json"), help="JSON report (the server log goes next to it)")
    ap.add_argument("--table", metavar="JSON", help="only print the table of an earlier report")
    args = ap.parse_args(argv)
    if args.table:
        report = json.loads(pathlib.Path(args.table).read_text())
        report["summary"] = summarize(report["rounds"])
        print(markdown(report))
        return 0
    if args.rounds < 1:
        raise SystemExit("bench_cache: --rounds must be >= 1")

    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    log_path = out.with_suffix(".log")
    report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
              "pydflash_commit": tree_commit(), "llama_cpp_commit": LLAMA_CPP_COMMIT,
              "params": {"rounds": args.rounds, "turns": len(TURNS), "system_tokens": args.system_tokens,
                         "answer_tokens": args.tokens},
              "commands": ["python " + " ".join(shlex.quote(a) for a in [
                  "scripts/bench/cache.py", *(argv if argv is not None else sys.argv[1:])])],
              "rounds": []}
    server = Server(shlex.split(args.start), log_path, args.ready_timeout)
    report["commands"].append("pydflash-server " + " ".join(shlex.quote(a) for a in server.cmd[3:]))
    try:
        with httpx.Client(base_url=server.base, timeout=600) as client:
            chat_turn(client, [{"role": "user", "content": "Hello"}], 4, cache=False)  # warm-up, untimed
            for r in range(args.rounds):
                system, n_system = sized_system_prompt(client, r, args.system_tokens)
                res = {"round": r, "system_tokens": n_system}
                # alternate which goes first, so neither always runs on a warmer machine
                for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
                    res[mode] = conversation(client, system, args.tokens, cache=mode == "on")
                    print(f"round {r} cache {mode}: TTFT ms " + ", ".join(f"{t['ttft_ms']:g}" for t in res[mode])
                          + "; cached " + ", ".join(str(t["cached_tokens"]) for t in res[mode]),
                          file=sys.stderr, flush=True)
                report["rounds"].append(res)
    finally:
        server.stop()
    report["machine"]["loadavg_at_end"] = os.getloadavg()
    report["summary"] = summarize(report["rounds"])
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
