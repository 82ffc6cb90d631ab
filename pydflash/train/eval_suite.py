"""The drafter's held-out evaluation suite (docs/drafter.md): what users send, bucketed, plus a repetition suite.

Buckets are (kind, prompt length): kind is code, prose or chat; length is short (under 16 tokens), medium (16 to
128) or long (over 128). Code and prose prompts are prefixes of the rows of ``heldout_eval.npz`` (never trained
on), cut to each length, so one source row gives a prompt per length. Chat prompts are Gemma turns
(``<start_of_turn>user ... <start_of_turn>model``) written here, which the server sends for chat requests; their
lengths come from how much context precedes the question.

The repetition suite holds texts that literally repeat themselves: the easiest case a drafter that sees the
target's hidden states will ever get (five cases an earlier drafter was weak on, and more). Every prompt here must
stay out of any training set: ``texts()`` lists them for the data pipeline to exclude.

Targets (docs/drafter.md; engine, greedy, 15 drafts per step, 256 new tokens): tau >= 4.5 for code in every length
bucket, >= 3.5 for prose and chat, >= 8 on the repetition suite.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import Union

import numpy as np

from .corpus_synth import turn

HELDOUT = pathlib.Path(__file__).resolve().parent / "heldout_eval.npz"
LENGTHS = {"short": 12, "medium": 96, "long": 200}  # tokens kept of a held-out row (BOS included)
TARGETS = {"code": 4.5, "prose": 3.5, "chat": 3.5, "repetition": 8.0}


@dataclass(frozen=True)
class Prompt:
    kind: str  # "code", "prose", "chat" or "repetition"
    name: str
    prompt: Union[str, list[int]]  # text (tokenized by the target, with BOS) or token ids (BOS included)


def length_class(n_tokens: int) -> str:
    """The issue's length buckets, by the prompt's token count as the target tokenizes it."""
    return "short" if n_tokens < 16 else "medium" if n_tokens <= 128 else "long"


def bucket(kind: str, n_tokens: int) -> str:
    """ "code/short" .. "chat/long"; the repetition suite is one bucket whatever its lengths."""
    return kind if kind == "repetition" else f"{kind}/{length_class(n_tokens)}"


def _turn(user: str, context: str = "") -> str:
    return turn(context + user)  # the server's Gemma template, as the corpus renders its chat prompts


CHAT_SHORT = [
    "What is a prime number?",
    "Name three primary colors.",
    "Translate 'good morning' to French.",
    "What does HTTP stand for?",
    "Write a haiku about rain.",
    "How many legs does a spider have?",
]
_CONTEXT = (
    "Here is a short Python function from our code base:\n\n"
    "def mean(values):\n    total = 0\n    for v in values:\n        total += v\n    return total / len(values)\n\n"
)
CHAT_MEDIUM = [
    _CONTEXT + "What happens when values is empty, and how would you fix it?",
    _CONTEXT + "Rewrite it with the built-in sum and add a docstring.",
    "I am planning a three-day trip to Lisbon in spring. I like museums, long walks and seafood, and I do not "
    "want to rent a car. Suggest a plan for each day.",
    "Summarise the difference between a list and a tuple in Python for someone who knows JavaScript arrays.",
]
_LONG_CONTEXT = (
    "Meeting notes, platform team, Tuesday.\n"
    "- The deploy pipeline now takes 14 minutes; most of it is the integration test stage.\n"
    "- Two flaky tests were quarantined: test_upload_resume and test_cache_eviction.\n"
    "- The on-call rotation moves to weekly shifts starting next month.\n"
    "- Storage costs rose 18% since March, mostly from build artifacts kept for 90 days.\n"
    "- Decision: keep artifacts for 30 days, except release builds, which are kept forever.\n"
    "- Open question: whether to split the monorepo CI into per-service pipelines.\n"
    "- Action items: Ana drafts the artifact policy, Ben profiles the integration stage, Chen writes the on-call "
    "handbook update, and Dana collects numbers on per-service pipeline costs.\n\n"
)
CHAT_LONG = [
    _LONG_CONTEXT + "Write a short summary of these notes for people who missed the meeting.",
    _LONG_CONTEXT + "List the action items as a table with owner and task.",
    _LONG_CONTEXT + "Draft an email to the team announcing the new artifact retention policy.",
]

_FUNCS = (
    "def add(a, b):\n    return a + b\n\n\n"
    "def sub(a, b):\n    return a - b\n\n\n"
    "def mul(a, b):\n    return a * b\n\n\n"
)
_COPY_FUNC = (
    "def parse_range(text, default_step=1):\n"
    "    \"\"\"Parse 'a-b' or 'a-b:s' into a list of integers.\"\"\"\n"
    "    span, _, step = text.partition(':')\n"
    "    lo, _, hi = span.partition('-')\n"
    "    step = int(step) if step else default_step\n"
    "    if step <= 0:\n"
    "        raise ValueError(f'bad step in {text!r}')\n"
    "    return list(range(int(lo), int(hi) + 1, step))\n"
)
_SENTENCE = "The quick brown fox jumps over the lazy dog near the quiet river bank. "
REPETITION = {
    # the five cases an earlier drafter was weak on
    "prose openers": "In economics, inflation refers to",
    "a b c repeated": "a b c " * 12,
    "sentence x3": _SENTENCE * 3,
    "three functions": _FUNCS,
    "counting": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,",
    # more of the same kind
    "csv rows": "id,name,city,score\n" + "".join(f"{i},user{i},Paris,{50 + i}\n" for i in range(1, 9)),
    "json records": "[\n" + "".join(f'  {{"id": {i}, "name": "item{i}", "active": true}},\n' for i in range(1, 7)),
    "markdown table": "| day | high | low |\n|---|---|---|\n" + "".join(
        f"| day {i} | {20 + i} | {10 + i} |\n" for i in range(1, 7)),
    "log lines": "".join(f"2026-01-0{i} 12:00:0{i} INFO worker-{i} heartbeat ok\n" for i in range(1, 8)),
    "bullet pattern": "".join(f"- Step {i}: check the input, then write the output.\n" for i in range(1, 6)),
    "alphabet": "A B C D E F G H I J K L M",
    "repeated call": "print('hello')\n" * 8,
    # text seen once, then copied: the target copies it verbatim, and version 4 of the drafter does not follow
    # (tau ~1.6-2.4 on CPU, the same in the PyTorch simulation: its weights, not the engine; docs/drafter.md)
    "passage copied once": _LONG_CONTEXT + "The same notes again, word for word:\n\n" + _LONG_CONTEXT[:60],
    "function copied once": _COPY_FUNC + "\n\n# the same function again, unchanged\n" + _COPY_FUNC[:40],
}


def _heldout_prompts() -> list[Prompt]:
    data = np.load(HELDOUT)
    out = []
    for kind in ("code", "prose"):
        rows = data[f"{kind}_tokens"]
        for length, n in LENGTHS.items():
            for i, row in enumerate(rows):
                out.append(Prompt(kind, f"{kind} {length} {i}", [int(t) for t in row[:n]]))
    return out


def prompts(per_group: int = 0) -> list[Prompt]:
    """Every prompt of the suite (at most per_group of each kind and written length; 0 = all; the repetition suite
    always whole)."""
    chat = ([Prompt("chat", f"chat short {i}", _turn(u)) for i, u in enumerate(CHAT_SHORT)]
            + [Prompt("chat", f"chat medium {i}", _turn(u)) for i, u in enumerate(CHAT_MEDIUM)]
            + [Prompt("chat", f"chat long {i}", _turn(u)) for i, u in enumerate(CHAT_LONG)])
    rep = [Prompt("repetition", name, text) for name, text in REPETITION.items()]
    out, seen = [], {}
    for p in _heldout_prompts() + chat + rep:
        group = p.name.rsplit(" ", 1)[0]  # "code short", "chat long", ...
        seen[group] = seen.get(group, 0) + 1
        if not per_group or p.kind == "repetition" or seen[group] <= per_group:
            out.append(p)
    return out


def target_for(bucket_name: str) -> float:
    return TARGETS[bucket_name.split("/")[0]]


def texts() -> list[str]:
    """The suite's own texts (chat and repetition), for a data pipeline to keep out of training."""
    return CHAT_SHORT + CHAT_MEDIUM + CHAT_LONG + list(REPETITION.values())
