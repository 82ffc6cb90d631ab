"""Training rows from the target's own distribution: sampled documents, cut into prompts, answered greedily.

    python -m pydflash.train.selfgen --target TARGET.gguf --out DIR --ngl -1 --slots 128 --seconds 540 \
        [--skip N] [--stop M] [--cuts 4] [--n-new 128] [--kv-streams]

A drafter must guess what the target says next on prompts nobody wrote for it, so its data should cover the
target's output distribution rather than one corpus. Each document i (a seed from ``selfgen_seeds.py``, then up to
512 tokens the target samples at temperature 0.7-1.0, its end-of-text tokens ignored so text past a natural end is
kept) is cut at ``--cuts`` random points into prompts of 3-512 tokens (log-uniform, so short prompts are common, as
users' are; a chat document is also cut right after each model turn it opens; some send follow-up user turns, each
after the target's answer to the last ends its turn: ``selfgen_seeds.followups``). Each prompt's continuation is the
target's **greedy** output (``--n-new`` tokens, end-of-text ignored): greedy is what speculation verifies. Both kinds
of request go through pydflash's engine with plain decoding (no drafter), many slots at once.

Everything about document i (seed, temperature, sampling seed, cut points) comes from ``(--seed, i)``, so
``--skip N --stop M`` split the documents between processes, and a later session continues at ``next_skip``
(generate.json). Prompts that contain an evaluation or benchmark prompt are dropped (``holdout.py``); a prompt
already written in this run (two documents of the same seed cut inside it) is not answered twice.

Output: DIR/shard-XXXX.npz in ``generate.py``'s format (its ShardWriter), which ``trainer.py`` reads unchanged
(``index`` is the document number, shared by its cuts), and DIR/generate.json (counts, throughput, the command).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import sys
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from . import holdout
from .generate import KINDS, ShardWriter
from .selfgen_seeds import KIND_OF, followups, seed

MAX_PROMPT = 512
MIN_PROMPT = 3


@dataclass
class Doc:
    """One document's plan, all drawn from (seed, index)."""
    index: int
    family: str
    seed_text: str
    temperature: float
    sample_seed: int
    cuts: list[int]  # prompt lengths in tokens, BOS included (the document's own length caps them)
    # user turns sent after the target's answers (``selfgen_seeds.followups``), each answer sampled until it ends
    # its turn
    turns: list[str] = field(default_factory=list)


def plan(index: int, base_seed: int, n_cuts: int, max_prompt: int = MAX_PROMPT) -> Doc:
    rng = random.Random(f"{base_seed}:{index}")
    family, text = seed(rng)
    # log-uniform lengths: as many prompts of 3-20 tokens as of 20-130 or 130-512
    cuts = sorted({int(round(math.exp(rng.uniform(math.log(MIN_PROMPT), math.log(max_prompt)))))
                   for _ in range(n_cuts)})
    temperature, sample_seed = rng.uniform(0.7, 1.0), rng.getrandbits(31)
    return Doc(index, family, text, temperature, sample_seed, cuts, followups(rng, family, index))


def turn_ends(tokens: list[int], start_of_turn: int, model_ids: list[int]) -> list[int]:
    """Prompt lengths that end right after an opened model turn (``<start_of_turn>model\\n``): what a chat server
    sends, one per turn of the conversation so far."""
    n = len(model_ids)
    return [i + 1 + n for i, t in enumerate(tokens) if t == start_of_turn and tokens[i + 1:i + 1 + n] == model_ids]


def cut_points(doc: Doc, tokens: list[int], turns: list[int], max_prompt: int = MAX_PROMPT) -> list[int]:
    """The document's prompt lengths: the planned cuts that fit it, and for chat documents their turn ends (up to
    two, or each turn of a document with follow-up user turns)."""
    out = {c for c in doc.cuts if c <= len(tokens) - 1}
    if KIND_OF[doc.family] == "chat":  # a conversation's every turn end (up to 3): what a chat server sends
        out.update(t for t in turns[:max(2, 1 + len(doc.turns))] if MIN_PROMPT <= t <= min(max_prompt, len(tokens) - 1))
    return sorted(out)


# an answer before a document's next user turn: at most this many tokens (three turns fit the 512-token prompts),
# fewer where its turn ends first
TURN_TOKENS = 140


def run(args) -> dict:
    from ..api import load
    from ..cache.config import CacheConfig
    from ..config import EngineConfig
    from ..engine.request import Request

    os.makedirs(args.out, exist_ok=True)
    cfg = EngineConfig(n_slots=args.slots, n_ctx_slot=args.max_prompt + args.n_new + 8, n_batch=args.n_batch,
                       n_ubatch=min(args.n_batch, 512), n_gpu_layers=args.ngl, n_threads=args.threads,
                       check_invariants=False, kv_unified=not args.kv_streams, draft_max=0)
    # no prompt cache: a cache would have to be proven free of stale KV under --kv-streams first (docs/drafter.md)
    llm = load(args.target, None, cfg, cache=CacheConfig(reuse=False, ram_mib=0, checkpoint_every=0))
    engine, model = llm.engine, llm.engine.model
    sot = model.tokenize("<start_of_turn>", add_special=False, parse_special=True)
    model_ids = model.tokenize("model\n", add_special=False, parse_special=True)
    keep_out = holdout.default()
    writer = ShardWriter(args.out, args.shard_rows)
    docs: dict[int, tuple[Doc, list[int], int]] = {}  # request id -> (its document, the tokens so far, turns sent)
    cuts: dict[int, tuple[list[int], Doc]] = {}  # request id -> (prompt, its document)
    waiting: deque = deque()  # (prompt, doc): cut prompts not yet submitted
    seen: set[bytes] = set()
    counts = {"docs": 0, "doc_tokens": 0, "rows": 0, "prompt_tokens": 0, "response_tokens": 0, "held_out": 0,
              "repeated_prompts": 0, "multi_turn_prompts": 0, "turns_sent": 0, "by_kind": {k: 0 for k in KINDS},
              "by_family": {}}
    next_doc = args.skip
    t0 = time.perf_counter()
    deadline = t0 + args.seconds

    def refill():
        nonlocal next_doc
        while len(engine.queue) < args.slots and time.perf_counter() < deadline:
            if waiting:  # answers first: they are the rows; documents only feed them
                prompt, doc = waiting.popleft()
                req = Request(prompt, max_tokens=args.n_new, ignore_eos=True, cache_prompt=False)
                engine.submit(req)
                cuts[req.id] = (prompt, doc)
            elif len(docs) < args.slots // 2 and (not args.stop or next_doc < args.stop):
                doc = plan(next_doc, args.seed, args.cuts, args.max_prompt)
                next_doc += 1
                toks = model.tokenize(doc.seed_text, add_special=True, parse_special=True) if doc.seed_text \
                    else [model.bos]
                sample(doc, toks, 0)
            else:
                return

    def sample(doc: Doc, toks: list[int], sent: int) -> None:
        """The document's next part: the rest of it (end of text ignored, so text past a natural end is kept), or
        for a document with user turns still to send, the answer until it ends its turn."""
        answer = sent < len(doc.turns)
        n = min(TURN_TOKENS, args.max_prompt - len(toks)) if answer else max(doc.cuts) - len(toks) + 1
        req = Request(toks, max_tokens=max(1, n), temperature=doc.temperature, seed=doc.sample_seed + sent,
                      ignore_eos=not answer, cache_prompt=False)
        engine.submit(req)
        docs[req.id] = (doc, toks, sent)

    def on_doc(doc: Doc, tokens: list[int]):
        counts["docs"] += 1
        counts["doc_tokens"] += len(tokens)
        counts["by_family"][doc.family] = counts["by_family"].get(doc.family, 0) + 1
        turns = turn_ends(tokens, sot[0], model_ids) if len(sot) == 1 else []
        for n in cut_points(doc, tokens, turns, args.max_prompt):
            prompt = tokens[:n]
            key = hashlib.blake2b(np.asarray(prompt, dtype=np.int32).tobytes(), digest_size=16).digest()
            if key in seen:
                counts["repeated_prompts"] += 1
                continue
            seen.add(key)
            if keep_out.hits(model.detokenize(prompt, special=True).decode("utf-8", "replace")):
                counts["held_out"] += 1
                continue
            counts["multi_turn_prompts"] += n in turns and turns.index(n) > 0
            waiting.append((prompt, doc))

    refill()
    last_log = t0
    while engine.has_work:
        for ev in engine.step():
            if not ev.finished:
                continue
            if ev.request_id in docs:
                doc, toks, sent = docs.pop(ev.request_id)
                toks = toks + list(ev.result.tokens)
                turn = model.tokenize(doc.turns[sent], add_special=False, parse_special=True) \
                    if sent < len(doc.turns) else []
                if turn and len(toks) + len(turn) < args.max_prompt:  # the next user turn, then its answer
                    counts["turns_sent"] += 1
                    sample(doc, toks + turn, sent + 1)
                else:
                    on_doc(doc, toks)
                continue
            prompt, doc = cuts.pop(ev.request_id)
            kind = KINDS.index(KIND_OF[doc.family])
            writer.add(prompt + list(ev.result.tokens), len(prompt), kind, doc.index)
            counts["rows"] += 1
            counts["prompt_tokens"] += len(prompt)
            counts["response_tokens"] += len(ev.result.tokens)
            counts["by_kind"][KINDS[kind]] += 1
        now = time.perf_counter()
        if now >= deadline:  # unfinished requests are dropped; the next session starts after the last document
            for rid in list(docs) + list(cuts):
                engine.cancel(rid)
            break
        refill()
        if now - last_log > args.log_every:
            last_log = now
            el = now - t0
            print(f"[{el:6.0f}s] docs {counts['docs']} rows {counts['rows']} response tokens "
                  f"{counts['response_tokens']} ({counts['response_tokens'] / el:.0f} tok/s)", flush=True)
    writer.flush()
    llm.close()
    el = time.perf_counter() - t0
    summary = {**counts, "seconds": round(el, 1), "response_tok_per_s": round(counts["response_tokens"] / el, 1),
               "next_skip": next_doc, "shards": writer.n_shards, "args": vars(args), "command": " ".join(sys.argv)}
    with open(os.path.join(args.out, "generate.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps({k: v for k, v in summary.items() if k != "args"}), flush=True)
    return summary


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ngl", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--n-new", type=int, default=128, help="greedy tokens answered per prompt")
    ap.add_argument("--cuts", type=int, default=4, help="prompts cut from each document")
    ap.add_argument("--max-prompt", type=int, default=MAX_PROMPT,
                    help="longest prompt cut (documents are sampled as far as their longest cut)")
    ap.add_argument("--n-batch", type=int, default=2048)
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--skip", type=int, default=0, help="start at this document")
    ap.add_argument("--stop", type=int, default=0, help="end before this document (0: no end)")
    ap.add_argument("--seed", type=int, default=0, help="documents are planned from (seed, index)")
    ap.add_argument("--shard-rows", type=int, default=4096)
    ap.add_argument("--kv-streams", action="store_true",
                    help="a KV stream per slot instead of one pool: attention over a slot's own cells only")
    ap.add_argument("--log-every", type=float, default=20)
    args = ap.parse_args(argv)
    if args.cuts < 1 or args.n_new < 1 or not MIN_PROMPT < args.max_prompt <= MAX_PROMPT:
        ap.error(f"--cuts and --n-new must be at least 1, --max-prompt in {MIN_PROMPT + 1}..{MAX_PROMPT}")
    run(args)


if __name__ == "__main__":
    main()
