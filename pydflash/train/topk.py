"""The target's top-k next-token log-probabilities at every response position of a shard: soft labels for the
trainer's stored distillation (``trainer.py --distill-stored``).

    python -m pydflash.train.topk --target TARGET.gguf --data DIR[,DIR...] --k 8 [--ngl -1] [--rows 16]

A second pass, not part of generation: the engine samples on the backend (``ContextParams.backend_greedy``) and
never copies a logits row to the host, so the greedy answers that ``generate.py`` / ``selfgen.py`` write carry no
probabilities. Here every row goes through the target again, ``--rows`` rows a forward, outputs only at the
positions that predict response tokens; each such logits row (the whole vocabulary, 262,144 floats for Gemma) is
reduced on the host to its k best log-probabilities. That host reduction bounds the pass (~1 ms a position);
the trainer's ``--distill-topk`` takes its teacher from the PyTorch port inside the training forward instead, at no
storage cost, but from the port (0.6-3 % off llama.cpp, docs/drafter.md) rather than the GGUF.

Adds to each shard (rewritten in place, LZMA, only once: a shard holding them is skipped):
``topk_ids`` int32 [response tokens, k] and ``topk_logp`` float16 [response tokens, k], best first, the rows'
response positions in row order (``load_shards`` aligns them: ``resp_starts``). Entry j of a row is the
distribution after its first prompt_len + j tokens, whose greedy pick is response token j.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from .generate import save_npz


def reduce_rows(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """[n, V] logits -> (ids [n, k] int32, log-probabilities [n, k] float32), best first."""
    logits = logits.astype(np.float32, copy=False)
    m = logits.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(logits - m).sum(axis=1))
    idx = np.argpartition(-logits, k - 1, axis=1)[:, :k]
    val = np.take_along_axis(logits, idx, axis=1)
    order = np.argsort(-val, axis=1, kind="stable")
    idx, val = np.take_along_axis(idx, order, axis=1), np.take_along_axis(val, order, axis=1)
    return idx.astype(np.int32), val - lse[:, None]


class TopK:
    """A scoring context over the target: ``rows(list of (tokens, prompt_len))`` -> one (ids, logp) per row."""

    def __init__(self, target: str, k: int, n_rows: int, max_len: int, ngl: int = 0, threads: int = 0):
        from ..native import Context, ContextParams, Model, ModelParams, TokenBatch

        self.k, self.n_rows = k, n_rows
        self.model = Model(target, ModelParams(n_gpu_layers=ngl))
        n_batch = n_rows * max_len
        self.ctx = Context(self.model, ContextParams(n_ctx=n_batch, n_batch=n_batch, n_ubatch=min(n_batch, 512),
                                                     n_seq_max=n_rows, backend_greedy=False, n_threads=threads))
        self.batch = TokenBatch(n_batch)

    def rows(self, rows: list[tuple[np.ndarray, int]]) -> list[tuple[np.ndarray, np.ndarray]]:
        if len(rows) > self.n_rows:
            raise ValueError(f"{len(rows)} rows in one forward, at most {self.n_rows}")
        self.ctx.clear()
        self.batch.clear()
        spans = []
        for seq, (tokens, p) in enumerate(rows):
            # positions p-1 .. n-2 predict response tokens p .. n-1; the last token predicts nothing stored
            flags = np.zeros(len(tokens) - 1, dtype=bool)
            flags[p - 1:] = True
            start = self.batch.add([int(t) for t in tokens[:-1]], 0, seq, flags)
            spans.append((start + p - 1, len(tokens) - p))
        self.ctx.decode(self.batch)
        out = []
        for start, n in spans:
            logits = np.stack([self.ctx.logits(start + j) for j in range(n)])
            ids, logp = reduce_rows(logits, self.k)
            out.append((ids, logp.astype(np.float16)))
        return out

    def close(self) -> None:
        self.batch.close()
        self.ctx.close()
        self.model.close()


def score_shard(path: str, scorer: TopK) -> int:
    """Add topk_ids / topk_logp to one shard; returns the response positions scored (0: it had them already)."""
    with np.load(path) as z:
        arrays = {name: z[name] for name in z.files}
    if "topk_ids" in arrays and arrays["topk_ids"].shape[1] == scorer.k:
        return 0
    tokens, offsets, plen = arrays["tokens"], arrays["offsets"], arrays["prompt_len"]
    ids, logp = [], []
    rows = [(tokens[offsets[i]:offsets[i + 1]], int(plen[i])) for i in range(len(plen))]
    for s in range(0, len(rows), scorer.n_rows):
        for i, lp in scorer.rows(rows[s:s + scorer.n_rows]):
            ids.append(i)
            logp.append(lp)
    arrays["topk_ids"] = np.concatenate(ids) if ids else np.zeros((0, scorer.k), np.int32)
    arrays["topk_logp"] = np.concatenate(logp) if logp else np.zeros((0, scorer.k), np.float16)
    tmp = path + ".tmp"
    save_npz(tmp, **arrays)
    os.replace(tmp, path)
    return len(arrays["topk_ids"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--data", required=True, help="shard folders, comma-separated")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--rows", type=int, default=8, help="rows a forward")
    ap.add_argument("--max-len", type=int, default=1280, help="the longest row (prompt + response) in the shards")
    ap.add_argument("--ngl", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args(argv)
    if a.k < 1 or a.rows < 1:
        ap.error("--k and --rows must be at least 1")
    scorer = TopK(a.target, a.k, a.rows, a.max_len, a.ngl, a.threads)
    t0, total = time.perf_counter(), 0
    try:
        for d in a.data.split(","):
            for name in sorted(os.listdir(d)):
                if name.startswith("shard-") and name.endswith(".npz"):
                    total += score_shard(os.path.join(d, name), scorer)
    finally:
        scorer.close()
    el = time.perf_counter() - t0
    print(json.dumps({"positions": total, "seconds": round(el, 1), "positions_per_s": round(total / max(el, 1e-9), 1),
                      "k": a.k}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
