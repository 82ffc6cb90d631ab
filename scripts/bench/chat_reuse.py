"""How much of a chat workload's prompt tokens the prompt cache reuses, in-process, on the tiny Gemma-3 factory pair
(sliding window 64): C conversations sharing a 150-token system prompt over 16 slots, each next turn submitted a
few engine steps after its answer (an HTTP client's turnaround), answers of 12, 16 or 24 tokens, the same
conversations replayed round after round (as `scripts/bench/http_vs_native.py`'s `chat` workload does). No timing:
the counts decide, so it runs anywhere in seconds.

    python scripts/bench/chat_reuse.py --clients 8 --turns 6 --rounds 4

Printed per round: the share of prompt tokens reused, of the first turns', of the later turns', and the device
tier's entries, evictions and expiries.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import sys
import tempfile

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from pydflash.cache import CacheConfig  # noqa: E402
from pydflash.config import EngineConfig  # noqa: E402
from pydflash.engine.engine import Engine  # noqa: E402
from pydflash.engine.request import Request  # noqa: E402
from pydflash.factory import write_tiny_pair  # noqa: E402
from pydflash.pair import load_pair  # noqa: E402


def tokens(seed: int, n: int) -> list[int]:
    return [1] + np.random.default_rng(seed).integers(5, 500, n - 1).tolist()


def one_round(eng: Engine, system: list[int], a: argparse.Namespace, rng: random.Random, on_answer=None,
              session: int | None = None) -> dict:
    """Every conversation once (``a.clients``, ``a.turns``, ``a.turnaround``); the shares reused and the device
    tier's counters. ``on_answer(client, turn, prompt, result)``: called for each answer (the test suite checks
    them against plain decoding). ``session``: a few tokens after the system prompt, new for each conversation and
    session number, as the HTTP benchmark's session line: a round then shares only the system prompt with the last."""
    lines = [tokens(10_000 + 97 * session + c, 6)[1:] if session is not None else [] for c in range(a.clients)]
    hists = [system + lines[c] + tokens(70 + c, 12)[1:] for c in range(a.clients)]
    turn, due, live = [0] * a.clients, {c: 0 for c in range(a.clients)}, {}
    by_turn = [[0, 0] for _ in range(a.turns)]  # reused, prompt tokens
    step = 0
    while due or live:
        for c in [c for c, at in due.items() if at <= step]:
            req = Request(list(hists[c]), max_tokens=rng.choice([12, 16, 24]), ignore_eos=True)
            eng.submit(req)
            live[req.id] = c
            del due[c]
        for ev in eng.step():
            if ev.finished:
                c, r = live.pop(ev.request_id), ev.result
                if on_answer is not None:
                    on_answer(c, turn[c], hists[c], r)
                by_turn[turn[c]][0] += r.stats.n_cached
                by_turn[turn[c]][1] += len(hists[c])
                hists[c] = hists[c] + list(r.tokens) + tokens(400 + 10 * c + turn[c], 8)[1:]
                turn[c] += 1
                if turn[c] < a.turns:
                    due[c] = step + a.turnaround
        step += 1
    later = [sum(x[i] for x in by_turn[1:]) for i in (0, 1)]
    dev = eng.prompt_cache.device
    return {"reused": round(sum(x[0] for x in by_turn) / sum(x[1] for x in by_turn), 3),
            "first_turns": round(by_turn[0][0] / by_turn[0][1], 3), "later_turns": round(later[0] / later[1], 3),
            "entries": len(dev.entries), "evictions": dev.evictions, "expired": dev.expired}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--turnaround", type=int, default=3, help="engine steps between an answer and the next turn")
    ap.add_argument("--system-tokens", type=int, default=150)
    ap.add_argument("--n-ctx-slot", type=int, default=1024)
    ap.add_argument("--new-sessions", action="store_true",
                    help="a new session line after the system prompt each round (the HTTP benchmark's chat workload)")
    ap.add_argument("--out", type=pathlib.Path)
    a = ap.parse_args()
    g3 = write_tiny_pair(pathlib.Path(tempfile.mkdtemp()) / "gemma3", arch="gemma3", seed=0)
    eng = Engine(load_pair(g3.target, g3.drafter), EngineConfig(n_slots=16, n_ctx_slot=a.n_ctx_slot),
                 cache=CacheConfig(block=16))
    rng, system = random.Random(0), tokens(23, a.system_tokens)
    rounds = []
    for r in range(a.rounds):
        rounds.append(one_round(eng, system, a, rng, session=r if a.new_sessions else None))
        print(f"round {r}: {rounds[-1]}")
    eng.close()
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        report = {"args": {k: str(v) for k, v in vars(a).items()}, "rounds": rounds}
        a.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
