"""Training responses from the real target: batched plain greedy decoding of the GGUF through pydflash.

    python -m pydflash.train.generate --target TARGET.gguf --prompts prompts.jsonl.gz --out DIR \
        --ngl -1 --slots 128 --n-new 256 --seconds 400 [--skip N] [--stop M] [--kv-streams]

The PyTorch port of the target agrees with llama.cpp on only 74.5 % of whole greedy continuations
(docs/drafter.md), so responses come from the GGUF itself, through the same engine that serves it: a drafter
trained on them learns what the deployed target says. Prompts are the corpus of ``corpus.py`` (gzip JSONL, one
``{"kind", "source", "text"}`` per line); chat prompts are tokenized with special tokens parsed, as the server does.

The engine is kept full: requests are queued a few batches ahead and every finished one is written out, so
the time budget ends the run cleanly at any point. Output: DIR/shard-XXXX.npz (LZMA inside: see save_npz), each with
``tokens`` (int32, rows concatenated: BOS + prompt + response), ``offsets`` (row starts, n_rows + 1),
``prompt_len``, ``kind`` (index into KINDS), ``index`` (line number in the prompt file), and DIR/generate.json
(counts, throughput, the command). Prompts containing an evaluation or benchmark prompt are skipped (holdout.py).
``--skip N`` starts at line N, so later sessions continue with new prompts;
``--stop M`` ends before line M, so several processes can share one GPU on disjoint parts of the file (one
process leaves the GPU idle while Python books a step of 128 slots).

    python -m pydflash.train.generate --repack DIR [DIR ...]     # rewrite older zlib shards with LZMA
"""
from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import sys
import time
import zipfile
from typing import Iterator

import numpy as np

from . import holdout

KINDS = ("code", "prose", "chat", "repetition")


def read_prompts(path: str, skip: int = 0, stop: int = 0) -> Iterator[tuple[int, dict]]:
    """(line number, prompt) for lines skip .. stop - 1 (stop 0: to the end)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            if stop and i >= stop:
                return
            if i >= skip:
                yield i, json.loads(line)


def prompt_tokens(model, prompt: dict) -> list[int]:
    """A corpus prompt's token ids as the target gets them: BOS, and chat turns' special tokens parsed (as the server
    does). ``dedup.py`` matches committed rows by these ids, so both tokenize through here."""
    return model.tokenize(prompt["text"], add_special=True, parse_special=prompt["kind"] == "chat")


def save_npz(path: str, **arrays: np.ndarray) -> None:
    """``np.savez_compressed`` with LZMA instead of zlib; ``np.load`` reads it unchanged (zipfile decompresses
    either). The committed data travels with every device call, whose 64 MiB also hold the rest of the tree: token
    rows take 35 % less room this way (a shard of 775 k tokens: 443 -> 287 kB)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_LZMA) as z:
        for name, value in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.asanyarray(value), allow_pickle=False)
            z.writestr(name + ".npy", buf.getvalue())


def repack(folders: list[str]) -> dict[str, int]:
    """Rewrite every shard of these folders with LZMA (save_npz), each checked equal to its original before it
    replaces it; shards already in LZMA are left as they are. Returns the bytes before and after."""
    before = after = 0
    for d in folders:
        for name in sorted(os.listdir(d)):
            if not (name.startswith("shard-") and name.endswith(".npz")):
                continue
            path = os.path.join(d, name)
            before += os.path.getsize(path)
            with zipfile.ZipFile(path) as z:
                done = all(i.compress_type == zipfile.ZIP_LZMA for i in z.infolist())
            if not done:
                with np.load(path) as z:
                    arrays = {k: z[k] for k in z.files}
                tmp = path + ".tmp"
                save_npz(tmp, **arrays)
                with np.load(tmp) as z:
                    if sorted(z.files) != sorted(arrays) or not all(np.array_equal(z[k], arrays[k]) for k in arrays):
                        raise RuntimeError(f"{path}: the LZMA copy differs from the shard")
                os.replace(tmp, path)
            after += os.path.getsize(path)
    return {"bytes_before": before, "bytes_after": after}


class ShardWriter:
    """Finished rows, flushed to numbered npz files so an interrupted run keeps what it made."""

    def __init__(self, out: str, rows_per_shard: int):
        self.out, self.rows_per_shard = out, rows_per_shard
        self.rows: list[tuple[list[int], int, int, int]] = []
        self.n_shards = 0

    def add(self, tokens: list[int], prompt_len: int, kind: int, index: int) -> None:
        self.rows.append((tokens, prompt_len, kind, index))
        if len(self.rows) >= self.rows_per_shard:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        lens = [len(r[0]) for r in self.rows]
        save_npz(
            os.path.join(self.out, f"shard-{self.n_shards:04d}.npz"),
            tokens=np.concatenate([np.asarray(r[0], dtype=np.int32) for r in self.rows]),
            offsets=np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
            prompt_len=np.asarray([r[1] for r in self.rows], dtype=np.int32),
            kind=np.asarray([r[2] for r in self.rows], dtype=np.int8),
            index=np.asarray([r[3] for r in self.rows], dtype=np.int64),
        )
        self.n_shards += 1
        self.rows = []


def load_shards(folder: str) -> dict[str, np.ndarray]:
    """Every shard of a folder (or of several, comma-separated) as one ragged set of rows; with topk.py's soft
    labels when every shard has them (``resp_starts``: where each row's response positions start in them).
    ``source`` is each row's folder, its place in the list: ``index`` counts documents within one run only."""
    parts = []
    for n_folder, d in enumerate(folder.split(",")):
        for name in sorted(os.listdir(d)):
            if name.startswith("shard-") and name.endswith(".npz"):
                z = np.load(os.path.join(d, name))
                rows = {k: z[k] for k in z.files}
                parts.append({**rows, "source": np.full(len(rows["prompt_len"]), n_folder, np.int32)})
    if not parts:
        raise FileNotFoundError(f"no shard-*.npz in {folder}")
    tokens = np.concatenate([p["tokens"] for p in parts])
    bases = np.cumsum([0] + [len(p["tokens"]) for p in parts[:-1]])  # where each shard's tokens start in `tokens`
    starts = np.concatenate([p["offsets"][:-1] + base for p, base in zip(parts, bases)])
    lens = np.concatenate([np.diff(p["offsets"]) for p in parts])
    out = {"tokens": tokens, "starts": starts.astype(np.int64), "lens": lens.astype(np.int64),
           **{k: np.concatenate([p[k] for p in parts]) for k in ("prompt_len", "kind", "index", "source")}}
    if all("topk_ids" in p for p in parts):  # topk.py's soft labels, one row per response position
        resp = (lens - out["prompt_len"]).astype(np.int64)
        if sum(len(p["topk_ids"]) for p in parts) != int(resp.sum()):
            raise ValueError(f"{folder}: topk arrays do not cover the response positions")
        out["resp_starts"] = np.concatenate([[0], np.cumsum(resp)[:-1]]).astype(np.int64)
        out["topk_ids"] = np.concatenate([p["topk_ids"] for p in parts])
        out["topk_logp"] = np.concatenate([p["topk_logp"] for p in parts])
    return out


def run(args) -> dict:
    from ..api import load
    from ..cache.config import CacheConfig
    from ..config import EngineConfig
    from ..engine.request import Request

    os.makedirs(args.out, exist_ok=True)
    # no prompt cache: prompts rarely share prefixes here, and a cache would only hold memory and copy KV
    cfg = EngineConfig(n_slots=args.slots, n_ctx_slot=args.max_prompt + args.n_new + 8, n_batch=args.n_batch,
                       n_ubatch=min(args.n_batch, 512), n_gpu_layers=args.ngl, n_threads=args.threads,
                       check_invariants=False, kv_unified=not args.kv_streams)
    llm = load(args.target, None, cfg, cache=CacheConfig(reuse=False, ram_mib=0, checkpoint_every=0))
    engine = llm.engine
    model = engine.model
    writer = ShardWriter(args.out, args.shard_rows)
    prompts = read_prompts(args.prompts, args.skip, args.stop)
    pending: dict[int, tuple[list[int], int, int]] = {}  # request id -> (prompt tokens, kind, line)
    counts = {"rows": 0, "prompt_tokens": 0, "response_tokens": 0, "too_long": 0, "stopped": 0, "held_out": 0,
              "by_kind": {k: 0 for k in KINDS}}
    keep_out = holdout.default()
    last_line = args.skip - 1
    t0 = time.perf_counter()
    deadline = t0 + args.seconds
    exhausted = False

    def refill():
        nonlocal exhausted, last_line
        while not exhausted and len(engine.queue) < args.slots and time.perf_counter() < deadline:
            nxt = next(prompts, None)
            if nxt is None or (args.max_rows and counts["rows"] + len(pending) >= args.max_rows):
                exhausted = True
                return
            line, p = nxt
            last_line = line
            if keep_out.hits(p["text"]):  # an evaluation or benchmark prompt: never trained on
                counts["held_out"] += 1
                continue
            kind = KINDS.index(p["kind"])
            toks = prompt_tokens(model, p)
            if len(toks) > args.max_prompt:
                counts["too_long"] += 1
                continue
            req = Request(toks, max_tokens=args.n_new, cache_prompt=False)
            engine.submit(req)
            pending[req.id] = (toks, kind, line)

    refill()
    last_log = t0
    steps = 0
    while engine.has_work:
        steps += 1
        for ev in engine.step():
            if not ev.finished:
                continue
            toks, kind, line = pending.pop(ev.request_id)
            res = ev.result
            writer.add(toks + list(res.tokens), len(toks), kind, line)
            counts["rows"] += 1
            counts["prompt_tokens"] += len(toks)
            counts["response_tokens"] += len(res.tokens)
            counts["stopped"] += res.finish_reason == "stop"
            counts["by_kind"][KINDS[kind]] += 1
        now = time.perf_counter()
        if now >= deadline:  # what is still running is dropped: only finished results carry their tokens here
            for rid in list(pending):
                engine.cancel(rid)
            pending.clear()
            break
        refill()
        if now - last_log > args.log_every:
            last_log = now
            el = now - t0
            print(f"[{el:6.0f}s] rows {counts['rows']} response tokens {counts['response_tokens']} "
                  f"({counts['response_tokens'] / el:.0f} tok/s)", flush=True)
    writer.flush()
    st = engine.stats
    # where a step's time went (target forward vs Python), to size --slots and the number of processes
    split = {"steps": steps, "ms_per_step": round(1e3 * (time.perf_counter() - t0) / max(steps, 1), 2),
             **{f"ms_{k}_per_step": round(1e3 * getattr(st, f"t_{k}") / max(steps, 1), 2)
                for k in ("verify", "commit", "host")}}
    llm.close()
    el = time.perf_counter() - t0
    summary = {**counts, **split, "seconds": round(el, 1),
               "response_tok_per_s": round(counts["response_tokens"] / el, 1),
               # prompts cut by the deadline are not written; the next session starts after the last line
               # read, so they are skipped rather than generated twice
               "next_skip": last_line + 1, "prompts_exhausted": exhausted, "shards": writer.n_shards,
               "args": vars(args), "command": " ".join(sys.argv)}
    with open(os.path.join(args.out, "generate.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps({k: v for k, v in summary.items() if k not in ("args",)}), flush=True)
    return summary


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--repack"]:
        print(json.dumps(repack(argv[1:])))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--prompts", required=True, help="gzip JSONL from pydflash.train.corpus")
    ap.add_argument("--out", required=True)
    ap.add_argument("--ngl", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--n-new", type=int, default=256)
    ap.add_argument("--max-prompt", type=int, default=1024, help="longer prompts are skipped")
    ap.add_argument("--n-batch", type=int, default=2048)
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--max-rows", type=int, default=0, help="0: until the prompts or the time run out")
    ap.add_argument("--skip", type=int, default=0, help="start at this prompt line")
    ap.add_argument("--stop", type=int, default=0,
                    help="end before this prompt line (0: the end), so that processes sharing a GPU split the file")
    ap.add_argument("--shard-rows", type=int, default=4096)
    ap.add_argument("--kv-streams", action="store_true",
                    help="a KV stream per slot instead of one pool: attention over a slot's own cells only")
    ap.add_argument("--log-every", type=float, default=20)
    run(ap.parse_args(argv))


if __name__ == "__main__":
    main()
