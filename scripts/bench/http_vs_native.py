#!/usr/bin/env python3
"""Native llama-server against pydflash-server, side by side through HTTP, one run on one machine.

Two modes. ``--defaults`` (what a user gets; its report leads) measures both servers as shipped; without it, the
held-out-prompt conditions below compare tuned setups (threads, draft lengths, cache_prompt false, synthetic
acceptance).

``--defaults``: conditions (ids for --only / --skip)

- ``native-bs``: llama-server ``-kvu -bs`` (--llama-server: on the device the build of the pinned tree WITHOUT
  patches/, so that it is the server a user of that llama.cpp runs);
- ``py-plain`` (``--no-spec``), ``py-dflash`` (the shipped drafter), ``py-random`` (a random drafter): pydflash-server
  with no other flag;
- secondary: ``py-plain-nocache``, ``py-dflash-nocache``: the same with every tier of the prompt cache off
  (``--no-cache-reuse --cache-ram 0 --cache-device 0``);
- diagnosis, only when ``--only`` names it: ``py-plain-nodevice`` (``--no-spec --cache-device 0``: slots keep their
  prompts, no device tier).

Every server gets only the model, ``-np`` (the largest level), the context (``--ctx``, 4096 per slot; native ``-c``
is the total) and ``-ngl``: no threads, cache or draft flags. All servers run at once and each level's rounds are
interleaved across them (as ``--interleave`` below). Workloads (``--workloads``, each its own table; a workload runs
the conditions its targets need):

- ``recur`` / ``recur-stream``: the frozen fresh prompt set (scripts/bench/prompts_fresh_v1.jsonl, 78 prompts
  written for this and used for nothing else) as text, non-streamed / streamed. Client i of C starts at prompt
  i * 78 // C and walks the set, cycling, so prompts recur across clients, rounds and levels as in real traffic.
  Bodies: ``prompt``, ``max_tokens`` = --tokens, ``temperature`` 0, ``ignore_eos``; NO ``cache_prompt`` (each
  server's own default);
- ``noreuse``: the same prompts, each behind a first line of random words and its own key: no request shares a
  prefix with an earlier one (what the cache costs when it never helps);
- ``chat``: C clients (--chat-clients) each run one of the 8 conversations of scripts/bench/chat_fresh_v1.json
  (client i: conversation i mod 8), 6 user turns one after another; each turn sends the shared ~1,100-token
  system prompt, a session line (new each round), the transcript so far and the new user turn as one Gemma-format
  text prompt (``temperature`` 0, ``max_tokens`` --chat-tokens, ``stop`` at the turn markers), and the reply is
  appended to the transcript. tok/s and the round's wall time;
- ``recur-cp0`` (secondary, not in the default list): ``recur`` with ``cache_prompt: false`` in every body;
- ``evalset`` (not in the default list): the drafter's frozen evaluation set (pydflash/train/eval_fresh_v1.jsonl,
  108 prompts: code, prose, chat turns in Gemma's format, repetition; each kind spread evenly over the order
  walked, since the file holds them kind after kind), walked as ``recur`` walks its set, non-streamed, pydflash
  plain and the shipped pair only: the drafter's speed-up through the server on prompts no training path reads.

The report (markdown) opens with the targets: shipped pair >= 1.5x native -bs at every level, non-streamed and
streamed; cache on >= 0.97x cache off on ``noreuse``; cache on >= 1.3x cache off on ``chat`` at 8 clients; shipped
pair >= 1.0x pydflash plain; random drafter >= 0.97x plain. Without a llama-server binary the native condition is
skipped (noted in the report).

    .venv/bin/python scripts/bench/http_vs_native.py --defaults --ngl -1 --out-dir docs/defaults
    .venv/bin/python scripts/bench/http_vs_native.py --defaults --clients 1,2 --rounds 1 --tokens 16 --chat-clients 1 \\
        --chat-turns 2 --chat-tokens 16 --out-dir /tmp/smoke                                  # a CPU smoke

Held-out-prompt mode: conditions (ids for --only / --skip, which take comma-separated fnmatch patterns such as
``native-*``):

- ``native-plain``, ``native-bs``: llama-server (--llama-server), without / with backend sampling (``-bs``);
- ``native-dflash``: the same with the shipped drafter (``-md D --spec-type draft-dflash``), ``-bs`` and draft-side
  backend sampling (``--spec-draft-backend-sampling``);
- ``native-synth1/4/8``: the same at forced mean acceptance length L (``--spec-synth-len L``; L counts the bonus
  token). These two run --llama-server-patched where given (the shipped GGUF's reduced head, patches/0011);
- ``py-plain``: pydflash-server ``--no-spec``; ``py-synth1/4/8``: ``-md D --spec-synth-len L`` (fixed block);
  ``py-synth1/4/8-spare``: the same with ``PYDFLASH_SPARE_SCHED=1`` (patches/0012), run only when ``--only`` names
  it;
- ``py-dflash``: ``-md D``, adaptive drafting (the server's default);
- ``py-random``: a random (useless) drafter, adaptive: the "never below 0.97x of plain" target (the drafter
  scripts/bench/engine.py makes with pydflash.factory, or ``--random-drafter``);
- ``py-synth1-adaptive`` (only when ``--only`` names it): ``--spec-synth-len 1 --draft-adaptive``, a drafter none of
  whose drafts is accepted, under adaptive drafting: the useless drafter of ``--target-set scale4b``, where a random
  drafter agrees with the random-weight target;
- ``py-synth5-adaptive`` (only when ``--only`` names it): ``--spec-synth-len 5 --draft-adaptive``, synthetic L = 5
  under adaptive drafting, as a user's server drafts (``py-synth5`` fixes the block).

Both servers get the same model files, slots (``-np`` = the largest client count), context per slot (native
``-c`` is the total, split over the slots, so it gets ``ctx * np``), threads and GPU layers. Each condition starts
its own server, waits for ``/health``, and for each concurrency level C runs one untimed warm-up round (as many
requests as a timed one, unless ``--warmup-requests``), then
``--rounds`` timed rounds in which C clients each send ``--requests`` streamed ``/v1/completions`` one after
another (more at low concurrency, so that a round holds at least ``--min-round-requests``; temperature 0,
``ignore_eos``, ``max_tokens`` = ``--tokens``, ``cache_prompt`` false unless ``--cache-prompt``: both servers read
that llama-server extension). Every server sees the same prompts in the
same order: held-out code prompts (the first ``prompt_len`` token ids of each ``code_tokens`` row of
pydflash/train/heldout_eval.npz, as scripts/bench/drafter_eval.py uses them; they start with BOS, and token-id prompts
get no second BOS from either server).

With ``--interleave`` every condition's server starts first and stays up (one H200 holds them all; an idle server
costs nothing), and at each level the rounds alternate across servers, round r of each before round r + 1 of any,
in an order rotated each round: conditions are then compared over rounds seconds apart, not minutes, so the
machine's drift (clocks, other load) reaches them alike. The ratio that matters most for a useless drafter, ~3 %
from plain, is smaller than the drift between conditions run minutes apart. The targets between two pydflash
conditions also give the ratio of each pair of same-numbered rounds (median and range).

Per round: tok/s = the servers' ``usage.completion_tokens`` summed over the round's wall time (first send to last
[DONE]); TTFT p50 (send -> first frame with text); drafted / accepted from ``timings.draft_n`` /
``draft_n_accepted`` (both servers report them). Per level: the median over rounds, with min and max.

    .venv/bin/python scripts/bench/http_vs_native.py --ngl -1 --threads 8 --out-dir docs
    .venv/bin/python scripts/bench/http_vs_native.py --interleave --ngl -1 --out-dir docs   # servers side by side
    .venv/bin/python scripts/bench/http_vs_native.py --only 'native-*' --out-dir /tmp/part1     # a chunk of the run
    .venv/bin/python scripts/bench/http_vs_native.py --render /tmp/part1/benchmarks.json /tmp/part2/benchmarks.json \\
        --out-dir docs                                                                # merge, write md + png

The JSON is rewritten after each condition, so a run cut short keeps what it finished.

Other models (the 4B-scale run: docs/byo-pair.md, "Speed at 4B scale"; scripts/dev/remote.sh scale4b-a/-b):
``--model T --drafter D --random-drafter D`` name the pair (a random-weight drafter serves as the synthetic
conditions' drafter), ``--synth-lens 1,3,5,8`` the synthetic lengths (conditions ``native-synthL`` / ``py-synthL``),
``--prompt-vocab 151936`` folds the held-out prompts' Gemma-3 ids into the target's vocabulary (id mod N: random
weights care about the prompts' lengths, not their tokens), ``--target-set scale4b`` checks that run's targets
(py-synth5 >= 2.0x native-bs at c1 and >= 1.5x at c8, the useless drafter ``py-synth1-adaptive`` >= 0.97x plain at
every level), ``--model-label`` names the models in the report.

    .venv/bin/python scripts/bench/http_vs_native.py --interleave --model T --drafter D --random-drafter D \\
        --synth-lens 1,3,5,8 --prompt-vocab 151936 --target-set scale4b --model-label "Qwen3-4B-shaped ..." \\
        --only 'native-bs,py-plain,py-synth*,py-synth1-adaptive' --ngl -1 --out-dir /tmp/scale4b
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import fnmatch
import hashlib
import json
import os
import pathlib
import random
import re
import shlex
import shutil
import statistics
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass

import httpx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from results import default_out, results_dir  # noqa: E402,F401  (scripts/ is not a package)
from server_load import (  # noqa: E402
    LLAMA_CPP_COMMIT, Server, ServerStartError, StreamError, client_limits, machine, ms, pct, stream_completion,
    tree_commit)

REPO = pathlib.Path(__file__).resolve().parents[2]
HELDOUT = REPO / "pydflash" / "train" / "heldout_eval.npz"  # the same file as scripts/bench/drafter_eval.py
SHIPPED_DRAFTER = REPO / "pydflash" / "models" / "gemma-3-270m-dflash-q8_0.gguf"
# the held-out mode's report names its models so, unless --model-label says otherwise
DEFAULT_MODEL_LABEL = f"Gemma-3-270M Q4_K_M target; the shipped drafter {SHIPPED_DRAFTER.name}"
# where a native llama-server may be, first found wins (the device build, then local builds)
LLAMA_SERVER_CANDIDATES = [
    pathlib.Path("/root/pydflash-dev/llama.cpp/build/bin/llama-server"),
    REPO / ".cache" / "native" / "current" / "bin" / "llama-server",
    REPO / "vendor" / "llama.cpp" / "build" / "bin" / "llama-server",
    pathlib.Path("/tmp/ls-build/bin/llama-server"),
]
# Every ratio is against the strongest native plain server at the same concurrency: the faster of llama-server with
# and without backend sampling, whichever wins at that load ("native-best" names that per-level maximum; it is no
# server of its own). On the H200 -bs won at every level (docs/results/2026-12-01-h200-e): without it, each token of
# 4 slots costs ~4.3 ms against ~2.1 ms (the logits go to the host to be sampled there).
NATIVE_PLAINS = ("native-plain", "native-bs")
BASELINE = "native-best"


# --- conditions ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Condition:
    id: str
    server: str  # "native" or "pydflash"
    label: str
    args: tuple[str, ...] = ()  # added after the shared flags
    drafter: str = ""  # "", "shipped" or "random": which -md the condition gets
    env: tuple[tuple[str, str], ...] = ()  # the server's environment on top of this process's


# native drafts --spec-draft-n-max tokens per step, 3 by default; server_args() adds it (the trained block - 1 = 15,
# what pydflash drafts), else --spec-synth-len is capped at 4
NATIVE_DFLASH = ("--spec-type", "draft-dflash", "-bs", "--spec-draft-backend-sampling")


def native_synth(n: int) -> Condition:
    return Condition(f"native-synth{n}", "native", f"native DFlash, synthetic L={n}, -bs",
                     (*NATIVE_DFLASH, "--spec-synth-len", str(n)), "shipped")


def py_synth(n: int) -> Condition:
    return Condition(f"py-synth{n}", "pydflash", f"pydflash, synthetic L={n}", ("--spec-synth-len", str(n)), "shipped")


def py_synth_spare(n: int) -> Condition:
    """The A/B for patches/0012 (opt-in): the drafter's injection and block keep their graphs allocated in two
    schedulers, instead of both being built again every drafting step (at 4B scale the block is the cost to cut)."""
    return Condition(f"py-synth{n}-spare", "pydflash", f"pydflash, synthetic L={n}, PYDFLASH_SPARE_SCHED=1",
                     ("--spec-synth-len", str(n)), "shipped", (("PYDFLASH_SPARE_SCHED", "1"),))


def synthetic(server: str, lens) -> list[Condition]:
    """One server's synthetic-acceptance conditions at each L in lens: native's, or pydflash's each followed by its
    patches/0012 twin (CONDITIONS and conditions() both lay them out so)."""
    if server == "native":
        return [native_synth(n) for n in lens]
    return [f(n) for n in lens for f in (py_synth, py_synth_spare)]


CONDITIONS = [
    Condition("native-plain", "native", "native plain"),
    Condition("native-bs", "native", "native plain -bs", ("-bs",)),
    Condition("native-dflash", "native", "native DFlash, shipped drafter, -bs", NATIVE_DFLASH, "shipped"),
    *synthetic("native", (1, 4, 8)),
    Condition("py-plain", "pydflash", "pydflash plain", ("--no-spec",)),
    *synthetic("pydflash", (1, 4, 8)),
    Condition("py-dflash", "pydflash", "pydflash, shipped drafter, adaptive", (), "shipped"),
    Condition("py-random", "pydflash", "pydflash, random drafter, adaptive", (), "random"),
    # A useless drafter by construction: synthetic acceptance at L = 1 accepts no draft whatever the weights, where
    # a random drafter beside a random-weight target (factory.scale) agrees with it (both repeat one token: 96 %
    # accepted at 4B scale, 2026-12-07), so py-random tests nothing there. Runs where --only names it.
    Condition("py-synth1-adaptive", "pydflash", "pydflash, synthetic L=1, adaptive (a useless drafter)",
              ("--spec-synth-len", "1", "--draft-adaptive"), "shipped"),
    # The synthetic rows above fix the block (15 drafts a step, as native's rows do); a user's server drafts
    # adaptively. At 4B scale and 16 clients a fixed block of L = 5 ran at 0.75x pydflash plain (a 256-token verify):
    # what the default policy makes of the same acceptance. Runs where --only names it.
    Condition("py-synth5-adaptive", "pydflash", "pydflash, synthetic L=5, adaptive (the default policy)",
              ("--spec-synth-len", "5", "--draft-adaptive"), "shipped"),
    # CUDA loads each kernel at its first launch by default (lazy module loading): a batch shape that needs kernels
    # no earlier step used pays for loading them, which a drafting server meets at many shapes. The A/B for that:
    Condition("py-dflash-eager", "pydflash", "pydflash, shipped drafter, adaptive, CUDA_MODULE_LOADING=EAGER", (),
              "shipped", (("CUDA_MODULE_LOADING", "EAGER"),)),
    # the engine on a thread of the worker, as before it had a process of its own (server/engine_process.py):
    # for the A/B
    *(Condition(f"{c}-thread", "pydflash", f"{label}, engine thread in the worker", args, drafter,
                (("PYDFLASH_ENGINE_PROCESS", "0"),))
      for c, label, args, drafter in (("py-plain", "pydflash plain", ("--no-spec",), ""),
                                      ("py-synth8", "pydflash, synthetic L=8", ("--spec-synth-len", "8"), "shipped"))),
]

SYNTH_ID = re.compile(r"(native|py)-synth\d+(-spare)?")
OPT_IN = ("-spare", "-adaptive")  # conditions that run only where --only names them (select)


def conditions(synth_lens=(1, 4, 8)) -> list[Condition]:
    """CONDITIONS with each server's synthetic conditions at synth_lens (--synth-lens) in place of L = 1, 4, 8."""
    out = []
    for c in CONDITIONS:
        if c.id in ("native-synth1", "py-synth1"):  # where each server's synthetic conditions stand
            out += synthetic(c.server, synth_lens)
        elif not SYNTH_ID.fullmatch(c.id):
            out.append(c)
    return out


# (the words, condition, clients (None = every level), reference condition, comparison, bound)
TARGETS = [
    ("synthetic length 8, c1", "py-synth8", 1, BASELINE, ">=", 2.5),
    ("synthetic length 8, c8", "py-synth8", 8, BASELINE, ">=", 2.0),
    ("shipped drafter, adaptive, held-out code prompts, c1", "py-dflash", 1, BASELINE, ">", 1.0),
    ("shipped drafter, adaptive, held-out code prompts, c8", "py-dflash", 8, BASELINE, ">", 1.0),
    ("shipped drafter, adaptive, c1, with the new drafter", "py-dflash", 1, BASELINE, ">=", 1.5),
    ("useless drafter, adaptive, every concurrency", "py-random", None, "py-plain", ">=", 0.97),
]
# --target-set scale4b: random-weight Qwen3-4B-shaped pair (python -m pydflash.factory.scale), --synth-lens 1,3,5,8
# (docs/byo-pair.md, "Speed at 4B scale"). Against native-bs itself, the one native plain server that run starts
SCALE4B_TARGETS = [
    ("synthetic length 5, c1", "py-synth5", 1, "native-bs", ">=", 2.0),
    ("synthetic length 5, c8", "py-synth5", 8, "native-bs", ">=", 1.5),
    ("useless drafter (L = 1), adaptive, every concurrency", "py-synth1-adaptive", None, "py-plain", ">=", 0.97),
]
# --target-set scale31b: the Gemma-4-31B-shaped pair (remote.sh scale31b). The issue sets no bar at this size; the
# 4B-scale one is checked for reference
SCALE31B_TARGETS = [
    ("synthetic length 5, c1 (the 4B-scale bar)", "py-synth5", 1, "native-bs", ">=", 2.0),
    ("synthetic length 5, c8 (the 4B-scale bar)", "py-synth5", 8, "native-bs", ">=", 1.5),
]
TARGET_SETS = {"issue": TARGETS, "scale4b": SCALE4B_TARGETS, "scale31b": SCALE31B_TARGETS}


# --- the defaults mode (--defaults): what a user gets ---------------------------------------------------------------
# Both servers with their own defaults: only the model, slots, context and GPU layers are given (native also -kvu and
# -bs, its fastest plain setup on the H200: see NATIVE_PLAINS), no threads, no cache flags, no draft length. The
# native baseline is whatever --llama-server names: on the device, llama-server built from the pinned tree without
# patches/ (scripts/dev/remote.sh), so that it is the server a user of that llama.cpp would run.
# every tier off: the slot's own prompt, the device tier (on by default) and the RAM tier
NOCACHE = ("--no-cache-reuse", "--cache-ram", "0", "--cache-device", "0")
NOCACHE_WORDS = " ".join(NOCACHE)
DEFAULT_CONDITIONS = [
    Condition("native-bs", "native", "llama-server -kvu -bs", ("-kvu", "-bs")),
    Condition("py-plain", "pydflash", "pydflash plain (--no-spec)", ("--no-spec",)),
    Condition("py-dflash", "pydflash", "pydflash, shipped drafter", (), "shipped"),
    Condition("py-random", "pydflash", "pydflash, random drafter", (), "random"),
    # secondary: what the prompt cache is worth, on (the default) against off
    Condition("py-plain-nocache", "pydflash", f"pydflash plain, cache off ({NOCACHE_WORDS})", ("--no-spec", *NOCACHE)),
    Condition("py-dflash-nocache", "pydflash", f"pydflash, shipped drafter, cache off ({NOCACHE_WORDS})", NOCACHE,
              "shipped"),
]
# diagnosis only, run when --only names them: which part of the cache costs (2026-12-05: with every tier on,
# pydflash plain ran at 0.59-0.85x of itself with every tier off on traffic that reuses nothing)
DIAG_CONDITIONS = [
    Condition("py-plain-nodevice", "pydflash", "pydflash plain, no device tier (--cache-device 0)",
              ("--no-spec", "--cache-device", "0")),
    # patches/0012 for the shipped pair: the engine gives the drafter's context a spare scheduler by default (its
    # injection and block graphs stay allocated; on Gemma-3-270M the drafter's part of a drafting step took 1.26 ms
    # at one slot against 0.47-0.50 ms for its block alone); without it, and with one for every context
    Condition("py-dflash-nospare", "pydflash", "pydflash, shipped drafter, PYDFLASH_SPARE_SCHED=0 (no spare scheduler)",
              (), "shipped", (("PYDFLASH_SPARE_SCHED", "0"),)),
    Condition("py-dflash-spare", "pydflash", "pydflash, shipped drafter, PYDFLASH_SPARE_SCHED=1 (every context)",
              (), "shipped", (("PYDFLASH_SPARE_SCHED", "1"),)),
]
BENCH_DIR = REPO / "scripts" / "bench"
FRESH_PROMPTS = BENCH_DIR / "prompts_fresh_v1.jsonl"
FRESH_CHAT = BENCH_DIR / "chat_fresh_v1.json"
# frozen (scripts/bench/README.md): a benchmark on an edited file would not be comparable with earlier runs
FROZEN_SHA256 = {
    FRESH_PROMPTS.name: "890325a554298d55cf474f9f84a60ec54add483def91a6557e5da453815e8b2f",
    FRESH_CHAT.name: "c11725fb6aa192b6c23a8d8657b7b34f107a2e57a435b9aafd76eceec083bff9",
}
# the model's turn ends at an EOG token both servers stop at; the stop strings only bound a reply that runs on
CHAT_STOP = ["<end_of_turn>", "<start_of_turn>"]


@dataclass(frozen=True)
class Workload:
    id: str
    label: str
    kind: str  # "recur": the fresh set, recurring; "noreuse": each prompt behind a line never sent before; "chat"
    stream: bool = False
    conds: tuple[str, ...] = ("*",)  # fnmatch patterns: the conditions that run it (the others would add no target)
    body: tuple[tuple[str, object], ...] = ()  # body fields on top of the defaults' (none: each server's default)
    prompts: str = "fresh"  # the prompt set walked: "fresh" (prompts_fresh_v1.jsonl) or "evalset" (eval_fresh_v1)


WORKLOADS = [
    Workload("recur", "fresh prompts, recurring, non-streamed", "recur"),
    Workload("recur-stream", "fresh prompts, recurring, streamed", "recur", stream=True),
    Workload("noreuse", "fresh prompts, each behind a first line never sent before (no prefix reuse), non-streamed",
             "noreuse", conds=("py-plain*", "py-dflash*")),
    Workload("chat", "multi-turn chat, a shared ~1,100-token system prompt, non-streamed", "chat",
             conds=("native-bs", "py-plain*", "py-dflash*")),
    # secondary, not in the default list: the requests ask for no prompt cache (the llama-server field)
    Workload("recur-cp0", "fresh prompts, recurring, non-streamed, requests with cache_prompt: false", "recur",
             conds=("native-bs", "py-plain", "py-dflash"), body=(("cache_prompt", False),)),
    Workload("evalset", "the drafter's frozen evaluation set, recurring, non-streamed", "recur",
             conds=("py-plain", "py-dflash", "py-dflash-spare", "py-dflash-nospare"), prompts="evalset"),
]
DEFAULT_WORKLOADS = "recur,recur-stream,noreuse,chat"

# (the words, workload, condition, clients (None = every level), reference, comparison, bound)
DEFAULT_TARGETS = [
    ("shipped pair vs native -bs, non-streamed", "recur", "py-dflash", None, "native-bs", ">=", 1.5),
    ("shipped pair vs native -bs, streamed", "recur-stream", "py-dflash", None, "native-bs", ">=", 1.5),
    ("cache on vs off, no prefix reuse, plain", "noreuse", "py-plain", None, "py-plain-nocache", ">=", 0.97),
    ("cache on vs off, no prefix reuse, shipped pair", "noreuse", "py-dflash", None, "py-dflash-nocache", ">=", 0.97),
    ("cache on vs off, chat, c8, plain", "chat", "py-plain", 8, "py-plain-nocache", ">=", 1.3),
    ("cache on vs off, chat, c8, shipped pair", "chat", "py-dflash", 8, "py-dflash-nocache", ">=", 1.3),
    ("shipped pair vs pydflash plain, non-streamed", "recur", "py-dflash", None, "py-plain", ">=", 1.0),
    ("shipped pair vs pydflash plain, streamed", "recur-stream", "py-dflash", None, "py-plain", ">=", 1.0),
    ("random drafter vs plain, non-streamed", "recur", "py-random", None, "py-plain", ">=", 0.97),
    ("random drafter vs plain, streamed", "recur-stream", "py-random", None, "py-plain", ">=", 0.97),
    # the drafter's own targets through the server, on its evaluation set
    ("shipped pair vs pydflash plain, drafter's evaluation set, c1", "evalset", "py-dflash", 1, "py-plain", ">=", 1.3),
    ("shipped pair vs pydflash plain, drafter's evaluation set, c8", "evalset", "py-dflash", 8, "py-plain", ">=", 1.1),
]


def frozen_text(path: pathlib.Path) -> str:
    """A frozen input's text, refused when it is not the recorded one."""
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != FROZEN_SHA256[path.name]:
        raise SystemExit(f"bench_http: {path} is not the frozen file (sha256 differs from scripts/bench/README.md)")
    return data.decode("utf-8")


def fresh_prompts() -> list[str]:
    return [json.loads(line)["prompt"] for line in frozen_text(FRESH_PROMPTS).splitlines() if line.strip()]


def fresh_chat() -> dict:
    return json.loads(frozen_text(FRESH_CHAT))


def evalset_prompts() -> list[str]:
    """The drafter's frozen evaluation set as text (its loader checks the file's sha256); the server parses the
    chat prompts' turn markers into their special tokens, as the evaluation's own tokenizing does. The file holds
    its kinds one after another, so a run that walks part of it would see one or two kinds: each kind is spread
    evenly over the walk instead (a prompt's place is its rank within its kind over the kind's size; file order
    breaks ties), so any stretch of it holds every kind in its share of the set."""
    from pydflash.train import eval_fresh
    prompts = eval_fresh.load()
    size, seen = collections.Counter(p["kind"] for p in prompts), collections.Counter()
    place = []
    for i, p in enumerate(prompts):
        place.append(((seen[p["kind"]] + 0.5) / size[p["kind"]], i))
        seen[p["kind"]] += 1
    return [prompts[i]["text"] for _, i in sorted(place)]


def walk_index(n: int, clients: int, client: int, k: int) -> int:
    """The prompt of a client's k-th request at a level (warm-up included): client i of C starts at i * n // C and
    walks the set in order, cycling, so that prompts recur across clients and rounds as in real traffic."""
    return (client * n // clients + k) % n


NOREUSE_WORDS = (
    "amber", "basalt", "cobalt", "dune", "ember", "fjord", "garnet", "harbor", "indigo", "juniper", "kestrel",
    "lantern", "meadow", "nickel", "orchid", "pebble", "quarry", "raven", "saffron", "thistle", "umber", "velvet",
    "willow", "yarrow", "zephyr", "acorn", "birch", "canyon", "delta", "falcon", "glacier", "heron")


def unique_line(*key) -> str:
    """A first line that no other key gets: random words (so that two prompts part from their first token on) and
    the key itself (so that they always part). Deterministic: every server sees the same prompts."""
    words = random.Random("/".join(map(str, key))).sample(NOREUSE_WORDS, 5)
    return " ".join(words) + " (" + "-".join(map(str, key)) + ")"


def defaults_body(wl: Workload, prompt: str, a: argparse.Namespace) -> dict:
    """A request of the recurring and no-reuse workloads: greedy, ignore_eos, max_tokens; no cache_prompt (each
    server's default) unless the workload sets it."""
    return {"prompt": prompt, "max_tokens": a.tokens, "temperature": 0, "ignore_eos": True, **dict(wl.body)}


def chat_body(prompt: str, a: argparse.Namespace) -> dict:
    """A chat turn: greedy until the model ends its turn (or --chat-tokens); no cache_prompt (the server's default)."""
    return {"prompt": prompt, "max_tokens": a.chat_tokens, "temperature": 0, "stop": CHAT_STOP}


def chat_prompt(system: str, exchanges: list[tuple[str, str]], user: str, session: str) -> str:
    """System prompt + transcript so far + the new user turn, in Gemma's turn format, as one text prompt (Gemma has
    no system role: the system prompt opens the first user turn). The session line after the system prompt keeps one
    round's conversations from replaying an earlier round's, while every session shares the system prompt."""
    users = [u for u, _ in exchanges] + [user]
    users[0] = f"{system}\n\n[chat {session}]\n{users[0]}"
    parts = []
    for k, u in enumerate(users):
        parts.append(f"<start_of_turn>user\n{u}<end_of_turn>\n<start_of_turn>model\n")
        if k < len(exchanges):
            parts.append(f"{exchanges[k][1]}<end_of_turn>\n")
    return "".join(parts)


def runs_workload(wl: Workload, cond_id: str) -> bool:
    return any(fnmatch.fnmatch(cond_id, p) for p in wl.conds)


def select_workloads(names: str) -> list[Workload]:
    known = {w.id: w for w in WORKLOADS}
    out = [known.get(n.strip()) for n in names.split(",") if n.strip()]
    if None in out:
        raise SystemExit(f"bench_http: unknown workload in {names!r}; known: {', '.join(known)}")
    return out


def select(only: str, skip: str, table: list[Condition] = CONDITIONS) -> list[Condition]:
    def match(c: Condition, pats: str) -> bool:
        return any(fnmatch.fnmatch(c.id, p.strip()) for p in pats.split(",") if p.strip())

    known = [c.id for c in table]
    for pats in (only, skip):
        for p in (p.strip() for p in pats.split(",") if p.strip()):
            if not any(fnmatch.fnmatch(k, p) for k in known):
                raise SystemExit(f"bench_http: {p!r} matches no condition; known: {', '.join(known)}")
    named = {p.strip() for p in only.split(",")}
    # an A/B twin (py-synthN-spare, py-synthN-adaptive) runs only where --only names it: `py-synth*` keeps meaning
    # the fixed-block synthetic rows
    return [c for c in table if (c.id in named if c.id.endswith(OPT_IN) else not only or match(c, only))
            and not match(c, skip)]


def server_args(cond: Condition, a: argparse.Namespace, target: str, drafters: dict[str, str]) -> list[str]:
    """The flags of one condition's server. The shared ones mean the same thing on both servers, except the
    context: native -c is the total KV, split evenly over -np slots."""
    if getattr(a, "defaults", False):
        return defaults_server_args(cond, a, target, drafters)
    slots = max(a.clients)
    md = ["-md", drafters[cond.drafter]] if cond.drafter else []
    if cond.server == "pydflash":
        return ["-m", target, *md, "-np", str(slots), "-c", str(a.ctx), "-t", str(a.threads), "-ngl", str(a.ngl),
                *(["-v"] if a.py_verbose else []), *cond.args]
    ngl = "all" if a.ngl < 0 else str(a.ngl)  # native -1 means "auto" (fit to memory), not "all"
    if cond.drafter:
        md += ["-ngld", ngl, "--spec-draft-n-max", str(a.native_draft_max)]
    # -kvu: one KV pool for all slots, as pydflash has. Without it the H200 run of 2026-12-01 decoded 4-8-slot
    # batches on slot ids 8-15 at 14-22 ms per token against 2-3 ms on ids 0-7 (docs/benchmarks.md)
    return ["-m", target, *md, "-np", str(slots), "-c", str(a.ctx * slots), "-kvu", "-t", str(a.threads), "-ngl", ngl,
            *cond.args]


def defaults_server_args(cond: Condition, a: argparse.Namespace, target: str, drafters: dict[str, str]) -> list[str]:
    """--defaults: the model, slots, context and GPU layers, then the condition's own flags; nothing else."""
    slots = a.slots
    md = ["-md", drafters[cond.drafter]] if cond.drafter else []
    if cond.server == "pydflash":
        return ["-m", target, *md, "-np", str(slots), "-c", str(a.ctx), "-ngl", str(a.ngl),
                *(["-v"] if a.py_verbose else []), *cond.args]
    ngl = "all" if a.ngl < 0 else str(a.ngl)
    return ["-m", target, "-np", str(slots), "-c", str(a.ctx * slots), "-ngl", ngl, *cond.args]


# --- inputs -------------------------------------------------------------------------------------------------------
def heldout_code_prompts() -> list[list[int]]:
    import numpy as np  # only here: numpy before libllama matters in-process, and this process loads no libllama

    data = np.load(HELDOUT)
    p_len = int(data["prompt_len"])
    return [[int(t) for t in row[:p_len]] for row in data["code_tokens"]]


def fold_prompts(prompts: list[list[int]], n_vocab: int) -> list[list[int]]:
    """--prompt-vocab: the held-out prompts (Gemma-3 ids, up to 262,144) as ids of a vocabulary of n_vocab, id mod
    n_vocab, for random-weight targets of another tokenizer (pydflash.factory.scale's 151,936): their speed depends
    on the prompts' lengths, which this keeps, not on which tokens they hold."""
    return [[t % n_vocab for t in p] for p in prompts]


def resolve_models(need_random: bool) -> tuple[str, str | None]:
    """The Gemma target (assembled from its PyPI package once) and, if asked, the random drafter
    scripts/bench/engine.py uses.

    In a child process: importing pydflash loads libllama (on the GPU build that means CUDA) into this one."""
    code = ("from pydflash.defaults import gemma_target, cache_dir\n"
            "t = gemma_target(); print(t)\n"
            "if %r:\n"
            "    from pydflash.factory.for_target import write_random_drafter_for\n"
            "    print(write_random_drafter_for(t, cache_dir() / 'models' / 'gemma3-random-drafter.gguf'))\n"
            % need_random)
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"bench_http: could not resolve the models:\n{r.stderr[-2000:]}")
    lines = r.stdout.split()
    return lines[0], (lines[1] if need_random else None)


def find_llama_server(given: str | None) -> str:
    if given:
        if not os.access(given, os.X_OK):
            raise SystemExit(f"bench_http: --llama-server {given}: not an executable file")
        return given
    for c in LLAMA_SERVER_CANDIDATES:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    on_path = shutil.which("llama-server")
    if on_path:
        return on_path
    raise SystemExit("bench_http: no llama-server found (build the llama-server target of vendor/llama.cpp and "
                     "pass --llama-server PATH, or --skip 'native-*')")


# --- one condition ------------------------------------------------------------------------------------------------
async def run_round(client: httpx.AsyncClient, prompts: list[list[int]], first: int, clients: int, requests: int,
                    a: argparse.Namespace) -> dict:
    """C clients, each sending its requests one after another; prompt k of the round is prompts[first + k]."""

    async def one_client(i: int) -> list[dict]:
        out = []
        for j in range(requests):
            # cache_prompt (a llama-server extension pydflash-server shares): off by default, so that every round
            # prefills its prompts in full whatever earlier rounds and levels left in the caches
            body = {"prompt": prompts[(first + i * requests + j) % len(prompts)], "max_tokens": a.tokens,
                    "temperature": 0, "ignore_eos": True, "cache_prompt": a.cache_prompt}
            out.append(await stream_completion(client, body))
        return out

    return await timed_clients(one_client, clients)


async def timed_clients(one_client, clients: int) -> dict:
    """Run one_client(i) for i < clients at once; the round's record over their requests and its wall time."""
    t0 = time.perf_counter()
    runs = [r for rs in await asyncio.gather(*(one_client(i) for i in range(clients))) for r in rs]
    return round_stats(runs, time.perf_counter() - t0)


def round_stats(runs: list[dict], wall: float) -> dict:
    """One round's record from its requests (stream_completion's or complete()'s results)."""
    def timing(key: str, r: dict):
        return (r["timings"] or {}).get(key, 0)

    done = sum(r["usage"]["completion_tokens"] for r in runs if r["usage"])
    drafted = sum(timing("draft_n", r) for r in runs)
    accepted = sum(timing("draft_n_accepted", r) for r in runs)
    # both servers report the whole prompt in usage.prompt_tokens and the part their cache supplied in timings.cache_n
    prompt = sum((r["usage"] or {}).get("prompt_tokens", 0) for r in runs)
    cached = sum(timing("cache_n", r) for r in runs)

    def share_of(rs: list[dict]):  # the cached share of some of the requests (a chat's first turns, its later ones)
        n = sum((r["usage"] or {}).get("prompt_tokens", 0) for r in rs)
        return round(sum(timing("cache_n", r) for r in rs) / n, 4) if n else None
    # pydflash-server's engine split (timings.steps, *_ms; native has none): ms per engine step, per part. The
    # step's wall through HTTP is the round's wall over its steps at 1 client; the gap to the split is the server's
    steps = sum(timing("steps", r) for r in runs)
    split = {p: round(sum(timing(f"{p}_ms", r) for r in runs) / steps, 4) if steps else None
             for p in ("draft", "verify", "commit", "host")}
    return {
        "wall_s": round(wall, 4), "requests": len(runs), "completion_tokens": done,
        "tok_per_s": round(done / wall, 2),
        "ttft_ms_p50": ms(pct([r["frames"][0] - r["t0"] for r in runs if r["frames"]], 0.5)),
        "latency_ms_p50": ms(pct([r["t1"] - r["t0"] for r in runs], 0.5)),
        "prompt_tokens": prompt, "cache_n": cached, "cached_share": round(cached / prompt, 4) if prompt else None,
        "cached_share_first_turns": share_of([r for r in runs if r.get("turn") == 0]),
        "cached_share_later_turns": share_of([r for r in runs if r.get("turn", 0) > 0]),
        "draft_n": drafted, "draft_n_accepted": accepted,
        "acceptance": round(accepted / drafted, 4) if drafted else None,
        # tokens per target forward of a slot: each verify (or plain) step commits one token the drafter did not
        # supply, so this is tau (bonus included), averaged over drafting and non-drafting steps alike. Drafts
        # accepted past max_tokens may be counted by a server without being delivered: short runs overstate it
        "tokens_per_step": round(done / (done - accepted), 3) if done > accepted else None,
        **({"engine_steps": steps, "draft_steps": sum(timing("draft_steps", r) for r in runs),
            "engine_ms_per_step": split, "prefill_ms": round(sum(timing("prompt_ms", r) for r in runs), 3)}
           if steps else {}),
    }


async def complete(client: httpx.AsyncClient, body: dict) -> dict:
    """POST a non-streamed completion; the same record as stream_completion's (no frames), plus the text."""
    t0 = time.perf_counter()
    r = await client.post("/v1/completions", json=body)
    t1 = time.perf_counter()
    if r.status_code != 200:
        raise StreamError(f"HTTP {r.status_code}: {r.content[:500]!r}")
    obj = r.json()
    return {"t0": t0, "t1": t1, "frames": [], "usage": obj.get("usage"), "timings": obj.get("timings"),
            "text": ((obj.get("choices") or [{}])[0]).get("text") or ""}


def requests_at(a: argparse.Namespace, clients: int) -> int:
    """Requests per client per round at this level: --requests, more at low concurrency so that a round holds at
    least --min-round-requests. At 1 client two 256-token requests took 0.7 s on the H200, and such rounds of pydflash
    plain spread over 687-781 tok/s (docs/results/2026-12-01-h200-f): too short to see the 3 % that the useless-drafter
    bound allows."""
    return max(a.requests, -(-getattr(a, "min_round_requests", 0) // clients))


async def run_level(base: str, prompts: list[list[int]], clients: int, a: argparse.Namespace) -> list[dict]:
    limits = client_limits(clients)
    async with httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(a.request_timeout), limits=limits) as client:
        requests = requests_at(a, clients)
        per_round = clients * requests
        # untimed: CUDA graphs for this batch size, adaptive drafting's cost calibration, the prompt caches
        await run_round(client, prompts, 0, clients, warmup_requests(a, requests), a)
        return [await run_round(client, prompts, r * per_round, clients, requests, a)
                for r in range(a.rounds)]


def warmup_requests(a: argparse.Namespace, requests: int) -> int:
    """Requests per client in a level's untimed warm-up round: --warmup-requests, or as many as a timed round.
    One each was too short on the H200 (2026-12-02): adaptive drafting's first probe at a new concurrency, with
    the drafter shapes it first runs there, fell into the first timed round of the useless drafter at 4 and 16
    clients (0.14 and 0.48 ms of drafter time per step there, ~0.005 in the other rounds)."""
    return getattr(a, "warmup_requests", 0) or requests


def summarize(rounds: list[dict]) -> dict:
    def spread(key: str) -> dict | None:
        xs = [r[key] for r in rounds if r.get(key) is not None]
        if not xs:
            return None
        return {"median": round(statistics.median(xs), 3), "min": min(xs), "max": max(xs)}

    return {k: spread(k) for k in ("tok_per_s", "ttft_ms_p50", "latency_ms_p50", "wall_s", "cached_share",
                                   "cached_share_first_turns", "cached_share_later_turns", "acceptance",
                                   "tokens_per_step", "completion_tokens")}


def start_condition(cond: Condition, a: argparse.Namespace, target: str, drafters: dict[str, str],
                    llama_server: str, log_dir: pathlib.Path) -> tuple[dict, Server | None]:
    """(the condition's result record, its running server or None when it did not start)."""
    args = server_args(cond, a, target, drafters)
    # native DFlash reads the shipped GGUF's reduced head through patches/0011: those conditions may name the
    # patched build while the plain ones run the pristine one
    binary = (getattr(a, "llama_server_patched", None) or llama_server) if cond.drafter else llama_server
    program = [binary] if cond.server == "native" else None
    log_path = log_dir / f"{cond.id}.log"
    res: dict = {"label": cond.label, "server": cond.server, "levels": {}}
    try:
        env = dict(cond.env)
        if a.step_trace and cond.server == "pydflash":  # a JSON line per engine step (pydflash/engine/trace.py)
            pathlib.Path(a.step_trace).mkdir(parents=True, exist_ok=True)
            env["PYDFLASH_STEP_TRACE"] = str(pathlib.Path(a.step_trace) / cond.id)
        server = Server(args, log_path, a.ready_timeout, program=program, env=env)
    except ServerStartError as exc:
        res["command"] = None
        res["error"] = f"{exc}: {log_tail(log_path)}"
        return res, None
    res["command"] = shlex.join([f"{k}={v}" for k, v in cond.env] + server.cmd)
    if cond.server == "native":  # the build string the binary reports (its commit is "unknown" off git)
        try:
            res["build_info"] = httpx.get(server.base + "/props", timeout=10).json().get("build_info")
        except (httpx.HTTPError, ValueError):
            pass
    return res, server


def record_level(res: dict, cond_id: str, clients: int, rounds: list[dict] | None, error: BaseException | None) -> None:
    if error is not None:
        res["levels"][str(clients)] = {"error": f"{type(error).__name__}: {str(error)[:400]}"}
        print(f"  {cond_id} c{clients}: ERROR {res['levels'][str(clients)]['error']}", file=sys.stderr, flush=True)
        return
    res["levels"][str(clients)] = s = {"rounds": rounds, **summarize(rounds)}
    lat = ("TTFT", s["ttft_ms_p50"]) if s["ttft_ms_p50"] else ("latency", s["latency_ms_p50"])
    print(f"  {cond_id} c{clients}: {s['tok_per_s']['median']} tok/s [{s['tok_per_s']['min']}-"
          f"{s['tok_per_s']['max']}], {lat[0]} p50 {(lat[1] or {}).get('median')} ms, wall "
          f"{(s['wall_s'] or {}).get('median')} s, cached {(s['cached_share'] or {}).get('median')}, "
          f"acceptance {(s['acceptance'] or {}).get('median')}", file=sys.stderr, flush=True)


def run_condition(cond: Condition, a: argparse.Namespace, target: str, drafters: dict[str, str], llama_server: str,
                  prompts: list[list[int]], log_dir: pathlib.Path) -> dict:
    t0 = time.perf_counter()
    res, server = start_condition(cond, a, target, drafters, llama_server, log_dir)
    if server is None:
        return res
    try:
        for c in a.clients:
            try:
                record_level(res, cond.id, c, asyncio.run(run_level(server.base, prompts, c, a)), None)
            except (StreamError, httpx.HTTPError) as exc:
                record_level(res, cond.id, c, None, exc)
    finally:
        server.stop()
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    return res


async def interleaved_level(bases: dict[str, str], prompts: list[list[int]], clients: int, a: argparse.Namespace,
                            transport: httpx.AsyncBaseTransport | None = None,
                            ) -> tuple[dict[str, list[dict]], dict[str, BaseException]]:
    """One level of the held-out-prompt conditions for every running server (see interleave)."""
    requests = requests_at(a, clients)
    per_round = clients * requests

    async def play(client: httpx.AsyncClient, r: int) -> dict:
        if r < 0:  # the untimed warm-up (see run_level)
            return await run_round(client, prompts, 0, clients, warmup_requests(a, requests), a)
        return await run_round(client, prompts, r * per_round, clients, requests, a)

    return await interleave(bases, clients, a, play, transport)


async def interleave(bases: dict[str, str], clients: int, a: argparse.Namespace, play,
                     transport: httpx.AsyncBaseTransport | None = None,
                     ) -> tuple[dict[str, list[dict]], dict[str, BaseException]]:
    """One level for every running server: ``play(client, r)`` plays round r on one server (r = -1: an untimed
    warm-up) and returns its record. A warm-up round each, then round r of every server before round r + 1
    of any, the order rotated each round, so that a drift of the machine (clocks, other load) over the level
    reaches every condition alike. A server whose round fails sits out the rest of the level."""
    limits = client_limits(clients)
    timeout = httpx.Timeout(a.request_timeout)
    rounds: dict[str, list[dict]] = {cid: [] for cid in bases}
    errors: dict[str, BaseException] = {}
    clients_of = {cid: httpx.AsyncClient(base_url=base, timeout=timeout, limits=limits, transport=transport)
                  for cid, base in bases.items()}
    try:
        for r in range(-1, a.rounds):
            live = [cid for cid in bases if cid not in errors]
            shift = max(r, 0) % max(len(live), 1)
            for cid in live[shift:] + live[:shift]:
                try:
                    record = await play(clients_of[cid], r)
                    if r >= 0:
                        rounds[cid].append(record)
                except (StreamError, httpx.HTTPError) as exc:
                    errors[cid] = exc
    finally:
        for client in clients_of.values():
            await client.aclose()
    return rounds, errors


def run_interleaved(conds: list[Condition], a: argparse.Namespace, target: str, drafters: dict[str, str],
                    llama_server: str, prompts: list[list[int]], log_dir: pathlib.Path, report: dict) -> None:
    """Every condition's server up at once (one GPU holds them all; an idle server costs nothing), the levels run
    with rounds interleaved across servers: ratios between conditions then compare rounds seconds apart, not
    minutes."""
    servers: dict[str, Server] = {}
    t0 = time.perf_counter()
    try:
        for cond in conds:
            print(f"bench_http: starting {cond.id} ({cond.label})", file=sys.stderr, flush=True)
            res, server = start_condition(cond, a, target, drafters, llama_server, log_dir)
            report["conditions"][cond.id] = res
            if server is None:
                print(f"  {cond.id}: did not start: {res['error']}", file=sys.stderr)
            else:
                servers[cond.id] = server
        for c in a.clients:
            rounds, errors = asyncio.run(interleaved_level({cid: s.base for cid, s in servers.items()}, prompts, c, a))
            for cid in servers:
                record_level(report["conditions"][cid], cid, c, rounds[cid], errors.get(cid))
            report["machine"]["loadavg_at_end"] = os.getloadavg()
            write_outputs(report, pathlib.Path(a.out_dir), a.stem, render=False)
    finally:
        for server in servers.values():
            server.stop()
    for cid in servers:
        report["conditions"][cid]["wall_s"] = round(time.perf_counter() - t0, 1)


# --- the defaults mode's runs -------------------------------------------------------------------------------------
async def send(client: httpx.AsyncClient, body: dict, stream: bool) -> dict:
    return await (stream_completion(client, body) if stream else complete(client, body))


def workload_prompt(wl: Workload, prompts: list[str], clients: int, client: int, k: int) -> str:
    """The text of a client's k-th request at a level of a recurring or no-reuse workload."""
    text = prompts[walk_index(len(prompts), clients, client, k)]
    if wl.kind == "noreuse":  # the level and k are in the key: no request repeats another's first line in the run
        return unique_line(wl.id, clients, client, k) + "\n" + text
    return text


def recur_player(wl: Workload, prompts: list[str], clients: int, a: argparse.Namespace):
    """play(client, r) for interleave(): C clients, each sending its requests one after another, walking the set."""
    requests = requests_at(a, clients)
    warm = warmup_requests(a, requests)

    async def play(client: httpx.AsyncClient, r: int) -> dict:
        n, first = (warm, 0) if r < 0 else (requests, warm + r * requests)

        async def one_client(i: int) -> list[dict]:
            return [await send(client, defaults_body(wl, workload_prompt(wl, prompts, clients, i, k), a), wl.stream)
                    for k in range(first, first + n)]

        return await timed_clients(one_client, clients)

    return play


def chat_player(chat: dict, clients: int, a: argparse.Namespace):
    """play(client, r) for interleave(): client i runs conversation i mod 8, its turns one after another, each
    reply appended to the transcript that the next turn sends."""
    convs = chat["conversations"]

    async def play(client: httpx.AsyncClient, r: int) -> dict:
        async def one_client(i: int) -> list[dict]:
            session = f"{clients}.{r + 1}.{i}"  # r = -1: the warm-up's own sessions
            exchanges: list[tuple[str, str]] = []
            out = []
            for user in convs[i % len(convs)]["turns"][:a.chat_turns]:
                res = await complete(client, chat_body(chat_prompt(chat["system"], exchanges, user, session), a))
                exchanges.append((user, res["text"]))
                out.append({**res, "turn": len(out)})
            return out

        return await timed_clients(one_client, clients)

    return play


def workload_record(wl: Workload, a: argparse.Namespace) -> dict:
    """A workload's entry in the report: what it is and the exact request body it sends."""
    body = chat_body("<transcript>", a) if wl.kind == "chat" else defaults_body(wl, "<prompt>", a)
    if wl.stream:  # what stream_completion adds
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    return {"label": wl.label, "kind": wl.kind, "stream": wl.stream, "body": body, "conditions": {}}


def run_workload(wl: Workload, servers: dict[str, Server], inputs: dict, a: argparse.Namespace,
                 report: dict) -> None:
    bases = {cid: s.base for cid, s in servers.items() if runs_workload(wl, cid)}
    if not bases:
        return
    rec = report["workloads"].setdefault(wl.id, workload_record(wl, a))
    for c in a.chat_clients if wl.kind == "chat" else a.clients:
        play = (chat_player(inputs["chat"], c, a) if wl.kind == "chat"
                else recur_player(wl, inputs["prompts"][wl.prompts], c, a))
        print(f"bench_http: {wl.id} c{c}: {', '.join(bases)}", file=sys.stderr, flush=True)
        rounds, errors = asyncio.run(interleave(bases, c, a, play))
        for cid in bases:
            record_level(rec["conditions"].setdefault(cid, {"levels": {}}), f"{wl.id} {cid}", c, rounds[cid],
                         errors.get(cid))
        report["machine"]["loadavg_at_end"] = os.getloadavg()
        write_outputs(report, pathlib.Path(a.out_dir), a.stem, render=False)


def run_defaults(conds: list[Condition], workloads: list[Workload], a: argparse.Namespace, target: str,
                 drafters: dict[str, str], llama_server: str, log_dir: pathlib.Path, report: dict) -> None:
    """Every condition's server up at once, then each workload's levels with rounds interleaved across the servers
    that run it (as run_interleaved)."""
    inputs = {"prompts": {"fresh": fresh_prompts(), "evalset": evalset_prompts()}, "chat": fresh_chat()}
    servers: dict[str, Server] = {}
    t0 = time.perf_counter()
    try:
        for cond in conds:
            print(f"bench_http: starting {cond.id} ({cond.label})", file=sys.stderr, flush=True)
            res, server = start_condition(cond, a, target, drafters, llama_server, log_dir)
            res.pop("levels")  # a workload's levels live under report["workloads"]
            report["conditions"][cond.id] = res
            if server is None:
                print(f"  {cond.id}: did not start: {res['error']}", file=sys.stderr)
            else:
                servers[cond.id] = server
        for wl in workloads:
            run_workload(wl, servers, inputs, a, report)
    finally:
        for server in servers.values():
            server.stop()
    for cid in servers:
        report["conditions"][cid]["wall_s"] = round(time.perf_counter() - t0, 1)


def log_tail(path: pathlib.Path, n: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


# --- report -------------------------------------------------------------------------------------------------------
def level_of(report: dict, cond: str, clients: int) -> dict:
    """A condition's record at one concurrency level ({} where it has none)."""
    return report["conditions"].get(cond, {}).get("levels", {}).get(str(clients), {})


def median_of(report: dict, cond: str, clients: int) -> float | None:
    if cond == BASELINE:
        return max((m for m in (median_of(report, n, clients) for n in NATIVE_PLAINS) if m is not None), default=None)
    return (level_of(report, cond, clients).get("tok_per_s") or {}).get("median")


def ratio(report: dict, cond: str, clients: int, ref: str = BASELINE) -> float | None:
    x, base = median_of(report, cond, clients), median_of(report, ref, clients)
    return x / base if x is not None and base else None


def paired(report: dict, cond: str, clients: int, ref: str) -> list[float] | None:
    """Round r of cond over round r of ref at this level, for every r, when the two ran interleaved in one chunk
    (round r of each within seconds of the other): a ratio that the machine's drift over the level leaves alone, so
    its spread shows how far the ratio of medians can be trusted. None for the native-best baseline (a maximum over
    two servers, possibly run in another chunk) and where the rounds do not pair up."""
    if ref == BASELINE or not report["params"].get("interleave"):
        return None
    rounds = [level_of(report, c, clients).get("rounds") or [] for c in (cond, ref)]
    if not rounds[0] or len(rounds[0]) != len(rounds[1]):
        return None
    return [x["tok_per_s"] / y["tok_per_s"] for x, y in zip(*rounds) if y["tok_per_s"]]


def targets(report: dict) -> list[dict]:
    """Each target of the issue as met / not met / not measured, from the medians (with the paired per-round
    ratios beside them where there are some)."""
    if report.get("mode") == "defaults":
        return defaults_targets(report)
    levels = report["params"]["clients"]
    return [verdict(report, what, cond, clients, ref, op, bound, levels)
            for what, cond, clients, ref, op, bound in TARGET_SETS[report["params"].get("target_set", "issue")]]


def verdict(report: dict, what: str, cond: str, clients: int | None, ref: str, op: str, bound: float,
            levels: list[int]) -> dict:
    """One target: the ratio of medians at its level (clients None: at every level), met / not met / not
    measured, and the paired per-round ratios beside them where there are some."""
    at = [clients] if clients is not None else levels
    got = {c: ratio(report, cond, c, ref) for c in at}
    measured = {c: r for c, r in got.items() if r is not None}
    if not measured or (clients is not None and clients not in measured):
        verdict = "not measured"
    else:
        # unrounded: 0.967 is not >= 0.97 (rounded to two places it was, and a useless drafter's c16 passed)
        ok = all((r > bound) if op == ">" else (r >= bound) for r in measured.values())
        verdict = "met" if ok else "not met"
        if ok and len(measured) < len(at):
            verdict = "met where measured"
    pairs = {str(c): pr for c in at if (pr := paired(report, cond, c, ref))}
    return {"target": what, "condition": cond, "reference": ref, "op": op, "bound": bound,
            "ratios": {str(c): None if r is None else round(r, 3) for c, r in got.items()}, "verdict": verdict,
            **({"paired": {c: [round(statistics.median(pr), 3), round(min(pr), 3), round(max(pr), 3)]
                           for c, pr in pairs.items()}} if pairs else {})}


def view(report: dict, wid: str) -> dict:
    """A defaults-mode workload as a report of the held-out mode's shape (params, conditions with their levels), so
    that level_of, median_of, ratio, paired and cell read it. Its rounds always ran interleaved."""
    conds = (report.get("workloads") or {}).get(wid, {}).get("conditions", {})
    return {"params": {**report["params"], "interleave": True},
            "conditions": {cid: {**report["conditions"].get(cid, {}), **c} for cid, c in conds.items()}}


def workload_levels(report: dict, wid: str) -> list[int]:
    p = report["params"]
    return p.get("chat_clients", []) if wid == "chat" else p["clients"]


def defaults_targets(report: dict) -> list[dict]:
    return [{"workload": wid, **verdict(view(report, wid), what, cond, clients, ref, op, bound,
                                        workload_levels(report, wid))}
            for what, wid, cond, clients, ref, op, bound in DEFAULT_TARGETS]


def cell(report: dict, cond: str, clients: int) -> str:
    lvl = level_of(report, cond, clients)
    if not lvl:
        return "-"
    if "error" in lvl:
        return "error"
    t = lvl["tok_per_s"]
    r = ratio(report, cond, clients)
    return f"{num(t['median'])} [{num(t['min'])}-{num(t['max'])}]" + (f" ({r:.2f}x)" if r is not None else "")


def best_native(report: dict, clients: int) -> str | None:
    """Which native plain condition is the baseline at this concurrency (None: neither was measured)."""
    meds = {n: median_of(report, n, clients) for n in NATIVE_PLAINS}
    meds = {n: m for n, m in meds.items() if m is not None}
    return max(meds, key=meds.get) if meds else None


def num(x: float) -> str:
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def extra_cell(lvl: dict | None) -> str:
    if not lvl or "error" in lvl:
        return "-"
    ttft = (lvl.get("ttft_ms_p50") or {}).get("median")
    acc = (lvl.get("acceptance") or {}).get("median")
    tau = (lvl.get("tokens_per_step") or {}).get("median")
    parts = [f"{ttft:.0f} ms" if ttft is not None else "-"]
    if acc is not None:
        parts.append(f"acc {acc:.2f}, tau {tau:.2f}" if tau is not None else f"acc {acc:.2f}")
    return ", ".join(parts)


def split_cell(lvl: dict | None, clients: int = 0) -> str:
    """The engine's step split of the level's median round (by tok/s), "" where the server reported none."""
    rounds = [r for r in (lvl or {}).get("rounds", []) if r.get("engine_ms_per_step")]
    if not rounds:
        return ""
    r = sorted(rounds, key=lambda r: r["tok_per_s"])[len(rounds) // 2]
    sp = r["engine_ms_per_step"]
    out = " + ".join(f"{sp[p]:.2f}" for p in ("draft", "verify", "commit", "host"))
    out += f", {r['draft_steps'] / r['engine_steps']:.0%} drafting"
    if clients == 1:  # requests one after another: the round's wall is their prefills plus their steps
        out += f", wall {(1e3 * r['wall_s'] - r['prefill_ms']) / r['engine_steps']:.2f}"
    return out


def per_client(p: dict) -> str:
    """Requests per client per round, as the header states them."""
    per = p.get("requests_per_client") or {}
    if len(set(per.values())) <= 1:
        return str(p["requests"])
    return ", ".join(f"{n} at c{c}" for c, n in per.items())


def warmup_words(p: dict) -> str:
    """What a level's warm-up round sent; runs before 2026-12-02 recorded none: one request per client."""
    per = p.get("warmup_requests_per_client")
    if not per:
        return "one request per client"
    if per == p.get("requests_per_client"):
        return "as many requests as a timed round"
    return ", ".join(f"{n} per client at c{c}" for c, n in per.items())


def table_head(levels: list[int]) -> list[str]:
    """The header rows of a table with one column per concurrency level."""
    return ["| condition | " + " | ".join(f"c{c}" for c in levels) + " |", "|---|" + "---|" * len(levels)]


def markdown(report: dict) -> str:
    p, m = report["params"], report["machine"]
    levels = p["clients"]
    names = list(report["conditions"])
    hw = m.get("gpu") or f"{m['cpu']} ({m['cores_usable']} usable cores)"
    lines = [
        f"# Native llama-server vs pydflash-server through HTTP ({hw})",
        "",
        f"One run, {report['date']}. pydflash {report['pydflash_commit']}; llama.cpp {report['llama_cpp_commit']} "
        f"(vendored, with patches/). {report.get('model_label') or DEFAULT_MODEL_LABEL}. "
        f"Held-out code prompts ({p['prompt_tokens']} tokens), temperature 0, ignore_eos, "
        f"cache_prompt {str(p.get('cache_prompt')).lower()}, max_tokens {p['tokens']}; each of C clients sends "
        f"{per_client(p)} streamed /v1/completions per round, one untimed warm-up round per level "
        f"({warmup_words(p)}), then "
        f"{p['rounds']} timed round{'s' if p['rounds'] > 1 else ''}. Native DFlash drafts "
        f"{p.get('native_draft_max', '?')} tokens per step (`--spec-draft-n-max`). Both servers: {max(levels)} "
        f"slots, {p['ctx']} tokens of context per slot, {p['threads']} threads, ngl {p['ngl']}."
        + (" Every server ran at once; at each level the rounds were interleaved across servers (round r of each "
           "before round r + 1 of any, the order rotated each round)." if p.get("interleave") else ""),
        "",
        "tok/s (completion tokens over the round's wall time): median [min-max] over rounds, and the ratio of "
        "medians to the strongest native plain server at the same concurrency (`native-best`: the faster of "
        "`native-plain` and `native-bs` there).",
        "",
        *table_head(levels),
    ]
    for n in names:
        cond = report["conditions"][n]
        cells = [cell(report, n, c) for c in levels] if "error" not in cond else ["did not start"] * len(levels)
        lines.append(f"| {cond['label']} (`{n}`) | " + " | ".join(cells) + " |")
    best = [best_native(report, c) for c in levels]
    if any(best):
        lines.append(f"| strongest native plain (`{BASELINE}`) | " + " | ".join(f"`{b}`" if b else "-" for b in best)
                     + " |")
    lines += [
        "",
        "TTFT p50 (median over rounds), and where the server drafts: accepted / drafted (acc) and tau, the "
        "committed tokens per target forward of a slot, bonus token included (completion / (completion - accepted)).",
        "",
        *table_head(levels),
    ]
    for n in names:
        lv = report["conditions"][n].get("levels", {})
        lines.append(f"| `{n}` | " + " | ".join(extra_cell(lv.get(str(c))) for c in levels) + " |")
    split_rows = [n for n in names if any(split_cell(lv) for lv in report["conditions"][n].get("levels", {}).values())]
    if split_rows:
        lines += ["", "pydflash's engine per step (median round, ms): draft + verify + commit + host, the share of "
                  "steps that drafted, and at 1 client the round's wall less its prefills per step (its gap to the "
                  "split is the HTTP side's).", "", *table_head(levels)]
        for n in split_rows:
            lv = report["conditions"][n].get("levels", {})
            lines.append(f"| `{n}` | " + " | ".join(split_cell(lv.get(str(c)), c) or "-" for c in levels) + " |")
    lines += ["", "## Speed targets", "", "| target | measured (ratio of medians) | verdict |", "|---|---|---|"]
    lines += [target_row(t) for t in report.get("targets") or targets(report)]
    errors = [(n, c.get("error")) for n, c in report["conditions"].items() if c.get("error")]
    if errors:
        lines += ["", "Conditions that did not start:", ""] + [f"- `{n}`: {e.splitlines()[0]}" for n, e in errors]
    lines += ["", "Commands:", ""] + [f"    {c}" for c in report["commands"]]
    for n, cond in report["conditions"].items():
        if cond.get("command"):
            lines.append(f"    # {n}: {cond['command']}")
    return "\n".join(lines) + "\n"


def target_row(t: dict) -> str:
    """A target's row of the targets table."""
    pairs = t.get("paired") or {}
    got = ", ".join((f"c{c} {r:.2f}x" if r is not None else f"c{c} -")
                    + (" (rounds paired: {:.2f} [{:.2f}-{:.2f}])".format(*pairs[c]) if c in pairs else "")
                    for c, r in t["ratios"].items())
    where = f"`{t['workload']}`: " if t.get("workload") else ""
    return (f"| {t['target']} ({where}`{t['condition']}` / `{t['reference']}` {t['op']} {t['bound']}x) | {got} | "
            f"**{t['verdict']}** |")


def defaults_markdown(report: dict) -> str:
    """--defaults: the targets first, then how it was run, then a table pair per workload, then the commands."""
    m = report["machine"]
    hw = m.get("gpu") or f"{m['cpu']} ({m['cores_usable']} usable cores)"
    lines = [f"# What a user gets: pydflash-server and llama-server with their defaults, through HTTP ({hw})", "",
             *defaults_header(report), "", "## Targets", "",
             "Default flags on both sides, the fresh prompt set; the ratio of the medians over rounds decides, the "
             "paired rounds (round r of one condition over round r of the other, seconds apart) show its spread.", "",
             "| target | measured (ratio of medians) | verdict |", "|---|---|---|",
             *[target_row(t) for t in report.get("targets") or targets(report)], "",
             *defaults_method(report)]
    for wid, wl in (report.get("workloads") or {}).items():
        lines += ["", *workload_tables(report, wid, wl)]
    notes = [f"- `{n}`: {c['skipped']}" for n, c in report["conditions"].items() if c.get("skipped")]
    notes += [f"- `{n}`: did not start: {c['error'].splitlines()[0]}" for n, c in report["conditions"].items()
              if c.get("error")]
    if notes:
        lines += ["", "Conditions not measured:", "", *notes]
    if report.get("partial"):
        lines += ["", f"Partial run: {report['partial']} (the levels without rows were not measured)."]
    lines += ["", "Commands:", "", *[f"    {c}" for c in report["commands"]]]
    lines += [f"    # {n}: {c['command']}" for n, c in report["conditions"].items() if c.get("command")]
    return "\n".join(lines) + "\n"


def defaults_header(report: dict) -> list[str]:
    p, inp = report["params"], report.get("inputs") or {}
    native = report.get("llama_server") or "none (not measured)"
    return [f"One run, {report['date']}. pydflash {report['pydflash_commit']} (llama.cpp {report['llama_cpp_commit']} "
            f"with patches/); native: `{native}`"
            + (f" (build {b})" if (b := report["conditions"].get("native-bs", {}).get("build_info")) else "")
            + f". Gemma-3-270M Q4_K_M target, the shipped drafter {SHIPPED_DRAFTER.name}. Prompts: "
            + "; ".join(f"`{v['file']}` ({v['count']} {k}, sha256 {v['sha256'][:12]}...)" for k, v in inp.items())
            + f". {p['rounds']} timed round{'s' if p['rounds'] > 1 else ''} per level after an untimed warm-up."]


def defaults_method(report: dict) -> list[str]:
    """How the run was made, in words: flags, traffic, bodies."""
    p = report["params"]
    slots = p["slots"]
    return [
        "## How it was run", "",
        f"- Servers: every condition's server up at once, each with its own defaults apart from the model (`-m`), "
        f"{slots} slots (`-np`), context (pydflash `-c {p['ctx']}` per slot; llama-server `-c {p['ctx'] * slots}`, "
        f"its total) and GPU layers (`-ngl`); llama-server also `-kvu -bs`, the conditions their own flags (the "
        "labels name them; the exact commands are at the end). No threads, cache or draft flags otherwise.",
        "- Requests: `/v1/completions` with a text `prompt`; the bodies below name every field sent. None carries "
        "`cache_prompt` unless its workload says so: each server uses its own default.",
        f"- Traffic: at C clients each client sends its requests one after another ({per_client(p)} per round, the "
        f"chat workload one conversation). Client i of C starts at prompt i * N / C of the N-prompt set and walks "
        "it in order, cycling, so that prompts recur across clients, rounds, levels and workloads as in real "
        "traffic; every server gets the same sequence. `noreuse`: each prompt behind a first line of random words "
        "and its own key, so that no request shares more than its first token with any earlier one. `chat`: client "
        f"i runs conversation i mod 8 ({p.get('chat_turns')} user turns), each turn the shared system prompt, a "
        "session line, the transcript so far and the new user turn as one Gemma-format text prompt, the reply "
        "appended to the transcript; one round is every client's whole conversation.",
        "- Rounds: at each level an untimed warm-up round, then the timed rounds, interleaved across the servers "
        "(round r of each before round r + 1 of any, the order rotated each round). tok/s = completion tokens "
        "over the round's wall time (first send to last reply); median [min-max] over rounds.",
    ]


def workload_tables(report: dict, wid: str, wl: dict) -> list[str]:
    v = view(report, wid)
    levels = workload_levels(report, wid)
    names = [n for n in report["conditions"] if n in v["conditions"]]
    lines = [f"## {wl['label']} (`{wid}`)", "", f"Body: `{json.dumps(wl['body'])}`", "",
             "tok/s: median [min-max] over rounds (ratio of medians to `native-bs`)"
             + ("; and the median round's wall time (every conversation, first send to last reply)."
                if wl["kind"] == "chat" else "."), "", *table_head(levels)]
    for n in names:
        cells = [cell(v, n, c) + (chat_wall(v, n, c) if wl["kind"] == "chat" else "") for c in levels]
        lines.append(f"| {v['conditions'][n].get('label', n)} (`{n}`) | " + " | ".join(cells) + " |")
    lines += ["", ("TTFT p50" if wl["stream"] else "request latency p50") + " (median over rounds), the share of "
              "prompt tokens the server's cache supplied (`timings.cache_n` / `usage.prompt_tokens`), and where the "
              "server drafts: accepted / drafted (acc) and tau. Greedy requests, so every server should generate "
              "the same tokens: a round's completion tokens unlike native's are flagged (**N tok/round, native M**: "
              "an output that differs, not a speed).", "", *table_head(levels)]
    native = v["conditions"].get("native-bs", {}).get("levels", {})
    for n in names:
        lv = v["conditions"][n].get("levels", {})
        lines.append(f"| `{n}` | " + " | ".join(defaults_extra_cell(lv.get(str(c)), wl["stream"], native.get(str(c)))
                                                for c in levels) + " |")
    return lines


def chat_wall(v: dict, cond: str, clients: int) -> str:
    wall = (level_of(v, cond, clients).get("wall_s") or {}).get("median")
    return f", {wall:.1f} s" if wall is not None else ""


def completion_median(lvl: dict | None) -> float | None:
    """A level's median completion tokens per round (from its rounds where an older report lacks the summary)."""
    if not lvl or "error" in lvl:
        return None
    if lvl.get("completion_tokens"):
        return lvl["completion_tokens"]["median"]
    xs = [r["completion_tokens"] for r in lvl.get("rounds", []) if r.get("completion_tokens") is not None]
    return statistics.median(xs) if xs else None


def defaults_extra_cell(lvl: dict | None, stream: bool, native: dict | None = None) -> str:
    if not lvl or "error" in lvl:
        return "-"
    done, ref = completion_median(lvl), completion_median(native)
    t = (lvl.get("ttft_ms_p50" if stream else "latency_ms_p50") or {}).get("median")
    share = (lvl.get("cached_share") or {}).get("median")
    parts = [f"{t:.0f} ms" if t is not None else "-", f"cached {share:.0%}" if share is not None else "cached -"]
    first, later = ((lvl.get(f"cached_share_{k}_turns") or {}).get("median") for k in ("first", "later"))
    if first is not None and later is not None:  # a chat: where the reuse is lost
        parts[-1] += f" (first turns {first:.0%}, later {later:.0%})"
    acc = (lvl.get("acceptance") or {}).get("median")
    tau = (lvl.get("tokens_per_step") or {}).get("median")
    if acc is not None:
        parts.append(f"acc {acc:.2f}" + (f", tau {tau:.2f}" if tau is not None else ""))
    if done is not None and ref is not None and done != ref:
        parts.append(f"**{done:.0f} tok/round, native {ref:.0f}**")
    return ", ".join(parts)


def plot(report: dict, png: pathlib.Path) -> bool:
    """tok/s median against concurrency, one line per condition, min-max as error bars (--defaults: a panel per
    workload). False without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if report.get("mode") == "defaults":
        panels = [(view(report, wid), workload_levels(report, wid), textwrap.fill(f"{wid}: {wl['label']}", 80))
                  for wid, wl in (report.get("workloads") or {}).items()]
    else:
        panels = [(report, report["params"]["clients"], None)]
    if not panels:
        return False
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 4.5 * len(panels)), squeeze=False)
    for ax, (rep, levels, title) in zip(axes[:, 0], panels):
        plot_panel(ax, rep, levels)
        if title:
            ax.set_title(title, fontsize=9)
    hw = report["machine"].get("gpu") or report["machine"]["cpu"]
    title = (report.get("model_label") or "Gemma-3-270M Q4_K_M").split(";")[0]
    fig.suptitle(f"{title} through HTTP ({hw.split(',')[0]})", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / (4.5 * len(panels))))  # room for the suptitle above the first panel
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return True


def plot_panel(ax, report: dict, levels: list[int]) -> None:
    for n, cond in report["conditions"].items():
        pts = [(int(c), lv["tok_per_s"]) for c, lv in cond.get("levels", {}).items() if "tok_per_s" in lv]
        if not pts:
            continue
        pts.sort()
        xs = [c for c, _ in pts]
        ys = [t["median"] for _, t in pts]
        err = [[t["median"] - t["min"] for _, t in pts], [t["max"] - t["median"] for _, t in pts]]
        # one colour per kind of condition, dashed for native: the pairs to compare share a colour
        kind = n.split("-", 1)[-1]
        style = (":" if n == "native-plain" else "--" if cond.get("server") == "native"
                 else "-." if n.endswith("-nocache") else "-")
        ax.errorbar(xs, ys, yerr=err, fmt=style + "o", color=PLOT_COLOURS.get(kind, "tab:brown"), capsize=3,
                    markersize=4, label=cond.get("label", n))
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("tok/s (aggregate, median over rounds)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))


PLOT_COLOURS = {"plain": "black", "bs": "black", "synth1": "tab:red", "synth3": "tab:pink", "synth4": "tab:orange",
                "synth5": "tab:olive", "synth8": "tab:green",
                "dflash": "tab:blue", "random": "tab:purple", "plain-nocache": "dimgrey", "dflash-nocache": "tab:cyan"}


def write_outputs(report: dict, out_dir: pathlib.Path, stem: str, render: bool) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    report["targets"] = targets(report)
    (out_dir / f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
    if render:
        render_md = defaults_markdown if report.get("mode") == "defaults" else markdown
        (out_dir / f"{stem}.md").write_text(render_md(report))
        if not plot(report, out_dir / f"{stem}.png"):
            print("bench_http: no matplotlib here, no PNG (render later: --render JSON)", file=sys.stderr)


def merge(paths: list[str]) -> dict:
    """Chunks of one run (split with --only or --clients to fit time limits) as one report; a condition's levels
    from several chunks are merged, later files winning per level."""
    reports = [json.loads(pathlib.Path(p).read_text()) for p in paths]
    if any(r.get("mode") == "defaults" for r in reports):
        return merge_defaults(paths, reports)
    out = dict(reports[0])
    out["conditions"] = {}
    out["commands"] = []
    out["chunks"] = [{"file": str(p), "date": r["date"], "machine": r["machine"],
                      "pydflash_commit": r["pydflash_commit"]} for p, r in zip(paths, reports)]
    clients: list[int] = []
    for path, r in zip(paths, reports):
        for cid, cond in r["conditions"].items():
            seen = out["conditions"].get(cid)
            # the same condition at other concurrencies in another chunk: keep both chunks' levels
            levels = {**seen["levels"], **cond["levels"]} if seen else cond["levels"]
            out["conditions"][cid] = {**cond, "levels": levels}
        out["commands"] += r["commands"]
        clients += [c for c in r["params"]["clients"] if c not in clients]
        for key in ("tokens", "requests", "rounds", "ctx", "threads", "ngl"):
            if r["params"][key] != out["params"][key]:
                print(f"bench_http: warning: {path} has {key}={r['params'][key]}, the first chunk "
                      f"{out['params'][key]}", file=sys.stderr)
    params = {k: v for r in reversed(reports) for k, v in r["params"].items()}  # the first chunk wins
    out["params"] = {**params, "clients": sorted(clients)}
    gpus = {(r["machine"].get("gpu"), r["machine"]["host"]) for r in reports}
    if len(gpus) > 1:
        print(f"bench_http: warning: the chunks ran on different machines: {gpus}", file=sys.stderr)
    # conditions in the canonical order, whatever synthetic lengths ran (L <= 16: a block of at most 15 drafts)
    order = [c.id for c in conditions(range(1, 17))]
    out["conditions"] = dict(sorted(out["conditions"].items(),
                                    key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))
    return out


def merge_defaults(paths: list[str], reports: list[dict]) -> dict:
    """--defaults chunks (the device runs them in several calls) as one report: each workload's conditions keep
    their levels from every chunk, a later chunk winning at a level both measured; a server record that ran wins
    over one that was skipped."""
    if not all(r.get("mode") == "defaults" for r in reports):
        raise SystemExit("bench_http: --render cannot merge --defaults runs with held-out-prompt runs")
    out = {**reports[0], "conditions": {}, "workloads": {}, "commands": []}
    out["chunks"] = [{"file": str(p), "date": r["date"], "machine": r["machine"],
                      "pydflash_commit": r["pydflash_commit"]} for p, r in zip(paths, reports)]
    for r in reports:
        for cid, rec in r["conditions"].items():
            if cid not in out["conditions"] or not rec.get("skipped"):
                out["conditions"][cid] = rec
        for wid, wl in r.get("workloads", {}).items():
            dst = out["workloads"].setdefault(wid, {**wl, "conditions": {}})
            for cid, cond in wl["conditions"].items():
                seen = dst["conditions"].get(cid, {}).get("levels", {})
                dst["conditions"][cid] = {**cond, "levels": {**seen, **cond["levels"]}}
        out["commands"] += r["commands"]
        out["llama_server"] = out.get("llama_server") or r.get("llama_server")
    for key in ("clients", "chat_clients"):
        out["params"] = {**out["params"], key: sorted({c for r in reports for c in r["params"].get(key, [])})}
    for key in ("requests_per_client", "warmup_requests_per_client"):
        out["params"][key] = {k: v for r in reports for k, v in r["params"].get(key, {}).items()}
    partial = [f"{p}: {r['partial']}" for p, r in zip(paths, reports) if r.get("partial")]
    out["partial"] = "; ".join(partial) if partial else None
    order = [c.id for c in DEFAULT_CONDITIONS]
    out["conditions"] = dict(sorted(out["conditions"].items(),
                                    key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))
    return out


# --- main ---------------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--render", nargs="+", metavar="JSON",
                    help="only re-render benchmarks.md/.png from these JSON files (chunks are merged)")
    ap.add_argument("--defaults", action="store_true",
                    help="what a user gets: both servers with their default flags, the fresh prompt set as text, "
                         "no cache_prompt field, workloads --workloads (see the docstring)")
    ap.add_argument("--workloads", default=DEFAULT_WORKLOADS,
                    help=f"--defaults: comma-separated workloads ({', '.join(w.id for w in WORKLOADS)})")
    ap.add_argument("--chat-clients", default="1,4,8", help="--defaults: concurrency levels of the chat workload")
    ap.add_argument("--chat-tokens", type=int, default=96, help="--defaults: max_tokens of a chat turn")
    ap.add_argument("--chat-turns", type=int, default=6, help="--defaults: user turns per conversation (at most 6)")
    ap.add_argument("--llama-server", default=None, help="native llama-server binary (default: search the builds)")
    ap.add_argument("--llama-server-patched", default=None,
                    help="llama-server built with patches/, for the native conditions with a drafter "
                         "(native-dflash, native-synth*; default: --llama-server)")
    ap.add_argument("--only", default="", help="comma-separated condition patterns to run (fnmatch)")
    ap.add_argument("--skip", default="", help="comma-separated condition patterns to leave out")
    ap.add_argument("--clients", default="1,4,8,16", help="concurrency levels")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per level")
    ap.add_argument("--requests", type=int, default=2, help="requests per client per round")
    ap.add_argument("--warmup-requests", type=int, default=0,
                    help="requests per client in each level's untimed warm-up round (0: as in a timed round)")
    ap.add_argument("--min-round-requests", type=int, default=8,
                    help="at low concurrency, more requests per client, so that every round holds at least this many")
    ap.add_argument("--tokens", type=int, default=256, help="max_tokens of each request (ignore_eos)")
    ap.add_argument("--ngl", type=int, default=0, help="GPU layers for both servers (-1 = all)")
    ap.add_argument("--threads", type=int, default=8, help="threads for both servers")
    ap.add_argument("--ctx", type=int, default=None,
                    help="context per slot (native gets -c ctx * slots); default 1024, with --defaults 4096 (the chat "
                         "workload's last turns are ~1,900 tokens)")
    ap.add_argument("--model", default=None, help="target GGUF (default: the Gemma-3-270M Q4_K_M of pydflash)")
    ap.add_argument("--drafter", default=str(SHIPPED_DRAFTER), help="the shipped DFlash drafter")
    ap.add_argument("--random-drafter", default=None,
                    help="the useless drafter of py-random (default: scripts/bench/engine.py's)")
    ap.add_argument("--cache-prompt", action="store_true",
                    help="send cache_prompt: true (default false: every request prefills its whole prompt)")
    ap.add_argument("--native-draft-max", type=int, default=15,
                    help="native --spec-draft-n-max (its default is 3; pydflash drafts the trained block - 1 = 15)")
    ap.add_argument("--interleave", action="store_true",
                    help="start every condition's server at once and interleave their rounds (one GPU, one drift)")
    ap.add_argument("--ready-timeout", type=float, default=300.0)
    ap.add_argument("--request-timeout", type=float, default=300.0)
    ap.add_argument("--out-dir", default=str(results_dir()), help="benchmarks.json/.md/.png go here")
    ap.add_argument("--stem", default="benchmarks", help="file names in --out-dir")
    ap.add_argument("--log-dir", default=None, help="server logs (default: a fresh directory under /tmp)")
    ap.add_argument("--no-render", action="store_true", help="write only the JSON (render later with --render)")
    ap.add_argument("--step-trace", default="",
                    help="DIR: each pydflash server's engine writes a JSON line per step to DIR/<condition>.<pid>")
    ap.add_argument("--synth-lens", default="1,4,8",
                    help="the synthetic acceptance lengths L of the native-synthL and py-synthL conditions")
    ap.add_argument("--prompt-vocab", type=int, default=0,
                    help="fold the held-out prompt ids into a vocabulary of this size (id mod N): for random-weight "
                         "targets of another tokenizer (0: as they are)")
    ap.add_argument("--target-set", choices=sorted(TARGET_SETS), default="issue",
                    help="the speed targets the report checks (scale4b: the 4B-scale run of docs/byo-pair.md)")
    ap.add_argument("--model-label", default=None,
                    help=f"how the report names the models (default: {DEFAULT_MODEL_LABEL})")
    ap.add_argument("--py-verbose", action="store_true",
                    help="pydflash-server -v: its log (in --log-dir) gives each adaptive-drafting pause and why")
    a = ap.parse_args(argv)
    out_dir = pathlib.Path(a.out_dir)

    if a.render:
        write_outputs(merge(a.render), out_dir, a.stem, render=True)
        print(f"bench_http: wrote {out_dir / a.stem}.md/.png/.json", file=sys.stderr)
        return 0

    a.clients = [int(c) for c in a.clients.split(",") if c.strip()]
    if a.defaults:
        return main_defaults(a, argv)
    a.ctx = a.ctx or 1024
    a.synth_lens = [int(n) for n in a.synth_lens.split(",") if n.strip()]
    conds = select(a.only, a.skip, conditions(a.synth_lens))
    if not conds or not a.clients or a.rounds < 1:
        raise SystemExit("bench_http: nothing to run (check --only/--skip, --clients, --rounds)")
    llama_server = find_llama_server(a.llama_server) if any(c.server == "native" for c in conds) else ""
    target, random_drafter = a.model, a.random_drafter
    need_random = any(c.drafter == "random" for c in conds) and not random_drafter
    if target is None or need_random:
        found_target, found_random = resolve_models(need_random)
        target, random_drafter = target or found_target, random_drafter or found_random
    drafters = {"shipped": os.path.abspath(a.drafter),
                "random": os.path.abspath(random_drafter) if random_drafter else ""}
    prompts = heldout_code_prompts()
    if a.prompt_vocab:
        prompts = fold_prompts(prompts, a.prompt_vocab)
    log_dir = pathlib.Path(a.log_dir) if a.log_dir else pathlib.Path(tempfile.mkdtemp(prefix="bench_http_"))
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"bench_http: {len(conds)} conditions, clients {a.clients}, logs in {log_dir}", file=sys.stderr)

    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
        "pydflash_commit": tree_commit(), "llama_cpp_commit": LLAMA_CPP_COMMIT,
        "vendor_stamp": read_text(REPO / "vendor" / ".stamp"),
        "patches": sorted(p.name for p in (REPO / "patches").glob("*.patch")),
        "llama_server": llama_server or None, "llama_server_patched": a.llama_server_patched, "target": target,
        "drafters": drafters,
        "params": {"clients": a.clients, "rounds": a.rounds, "requests": a.requests,
                   "requests_per_client": {str(c): requests_at(a, c) for c in a.clients}, "tokens": a.tokens,
                   "ctx": a.ctx, "threads": a.threads, "ngl": a.ngl, "native_draft_max": a.native_draft_max,
                   "prompts": "heldout_eval.npz code_tokens", "cache_prompt": a.cache_prompt,
                   "interleave": a.interleave, "warmup_requests_per_client": {
                       str(c): warmup_requests(a, requests_at(a, c)) for c in a.clients},
                   "prompt_tokens": len(prompts[0]), "synth_lens": a.synth_lens, "prompt_vocab": a.prompt_vocab,
                   "target_set": a.target_set},
        "model_label": a.model_label,
        "commands": ["python " + shlex.join(["scripts/bench/http_vs_native.py",
                                             *(sys.argv[1:] if argv is None else argv)])],
        "conditions": {},
    }
    if a.interleave:
        run_interleaved(conds, a, target, drafters, llama_server, prompts, log_dir, report)
    for cond in conds if not a.interleave else ():
        print(f"bench_http: {cond.id} ({cond.label})", file=sys.stderr, flush=True)
        report["conditions"][cond.id] = run_condition(cond, a, target, drafters, llama_server, prompts, log_dir)
        if report["conditions"][cond.id].get("error"):
            print(f"  {cond.id}: did not start: {report['conditions'][cond.id]['error']}", file=sys.stderr)
        report["machine"]["loadavg_at_end"] = os.getloadavg()
        write_outputs(report, out_dir, a.stem, render=False)
    write_outputs(report, out_dir, a.stem, render=not a.no_render)
    if not a.no_render:
        print(markdown(report))
    return 0


def _interrupted(signum, frame):
    raise KeyboardInterrupt


def main_defaults(a: argparse.Namespace, argv) -> int:
    """--defaults: the workloads over the default-flag conditions, every server up at once."""
    a.chat_clients = [int(c) for c in a.chat_clients.split(",") if c.strip()]
    a.ctx = a.ctx or 4096
    a.interleave = True
    workloads = select_workloads(a.workloads)
    if not any(w.kind == "chat" for w in workloads):
        a.chat_clients = []
    if all(w.kind == "chat" for w in workloads):
        a.clients = []
    a.slots = max(a.clients + a.chat_clients, default=0)  # one slot per client of the largest level of any workload
    if not 1 <= a.chat_turns <= 6:
        raise SystemExit("bench_http: --chat-turns is 1 to 6 (the conversations have 6)")
    table = DEFAULT_CONDITIONS + (DIAG_CONDITIONS if a.only else [])
    conds = [c for c in select(a.only, a.skip, table) if any(runs_workload(w, c.id) for w in workloads)]
    if not conds or not a.slots or a.rounds < 1:
        raise SystemExit("bench_http: nothing to run (check --only/--skip, --workloads, --clients, --rounds)")
    conds, skipped = native_or_skip(conds, a)
    target, drafters = defaults_models(conds, a)
    log_dir = pathlib.Path(a.log_dir) if a.log_dir else pathlib.Path(tempfile.mkdtemp(prefix="bench_http_"))
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"bench_http --defaults: {', '.join(c.id for c in conds)}; workloads {', '.join(w.id for w in workloads)}; "
          f"clients {a.clients}, chat {a.chat_clients}; logs in {log_dir}", file=sys.stderr)
    report = defaults_report(a, argv, target, drafters, skipped)
    # the device harness bounds a run with `timeout` (SIGTERM): the levels measured until then are still written,
    # marked partial, instead of the whole call's measurements being lost
    signal.signal(signal.SIGTERM, _interrupted)
    try:
        run_defaults(conds, workloads, a, target, drafters, a.llama_server or "", log_dir, report)
    except KeyboardInterrupt:
        report["partial"] = "interrupted before every level ran"
        print("bench_http: interrupted; writing what was measured", file=sys.stderr)
    write_outputs(report, pathlib.Path(a.out_dir), a.stem, render=not a.no_render)
    if not a.no_render:
        print(defaults_markdown(report))
    return 0


def native_or_skip(conds: list[Condition], a: argparse.Namespace) -> tuple[list[Condition], dict[str, dict]]:
    """The conditions that can run, and a record for each native one left out because no llama-server was found
    (a machine without a native build still measures the pydflash conditions)."""
    if not any(c.server == "native" for c in conds):
        return conds, {}
    try:
        a.llama_server = find_llama_server(a.llama_server)
        return conds, {}
    except SystemExit:
        why = "skipped: no llama-server binary found here (pass --llama-server PATH)"
        print(f"bench_http: {why}", file=sys.stderr)
        return ([c for c in conds if c.server != "native"],
                {c.id: {"label": c.label, "server": c.server, "skipped": why} for c in conds if c.server == "native"})


def defaults_models(conds: list[Condition], a: argparse.Namespace) -> tuple[str, dict[str, str]]:
    target, random_drafter = a.model, a.random_drafter
    need_random = any(c.drafter == "random" for c in conds) and not random_drafter
    if target is None or need_random:
        found_target, found_random = resolve_models(need_random)
        target, random_drafter = target or found_target, random_drafter or found_random
    return target, {"shipped": os.path.abspath(a.drafter),
                    "random": os.path.abspath(random_drafter) if random_drafter else ""}


def defaults_report(a: argparse.Namespace, argv, target: str, drafters: dict[str, str],
                    skipped: dict[str, dict]) -> dict:
    inputs = {}
    for key, path, count in (("prompts", FRESH_PROMPTS, len(fresh_prompts())),
                             ("conversations", FRESH_CHAT, len(fresh_chat()["conversations"]))):
        inputs[key] = {"file": str(path.relative_to(REPO)), "sha256": FROZEN_SHA256[path.name], "count": count}
    from pydflash.train import eval_fresh
    inputs["evalset"] = {"file": str(eval_fresh.PATH.relative_to(REPO)), "sha256": eval_fresh.SHA256,
                         "count": len(evalset_prompts())}
    levels = a.clients + [c for c in a.chat_clients if c not in a.clients]
    return {
        "mode": "defaults", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
        "pydflash_commit": tree_commit(), "llama_cpp_commit": LLAMA_CPP_COMMIT,
        "vendor_stamp": read_text(REPO / "vendor" / ".stamp"),
        "patches": sorted(p.name for p in (REPO / "patches").glob("*.patch")),
        "llama_server": a.llama_server or None, "target": target, "drafters": drafters, "inputs": inputs,
        "params": {"clients": a.clients, "chat_clients": a.chat_clients, "rounds": a.rounds, "requests": a.requests,
                   "requests_per_client": {str(c): requests_at(a, c) for c in levels}, "tokens": a.tokens,
                   "warmup_requests_per_client": {str(c): warmup_requests(a, requests_at(a, c)) for c in levels},
                   "chat_tokens": a.chat_tokens, "chat_turns": a.chat_turns, "ctx": a.ctx, "ngl": a.ngl,
                   "slots": a.slots,
                   "interleave": True, "workloads": a.workloads},
        "commands": ["python " + shlex.join(["scripts/bench/http_vs_native.py",
                                             *(sys.argv[1:] if argv is None else argv)])],
        "conditions": dict(skipped), "workloads": {},
    }


def read_text(path: pathlib.Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


if __name__ == "__main__":
    sys.exit(main())
