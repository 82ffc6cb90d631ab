"""Log-probabilities of a token sequence under the target: the server's ``logprobs`` and ``echo``.

The decoding contexts sample on the backend and never copy logits to the host. Scoring needs them, so it runs
on a context of its own over the same target weights: the tokens go through in chunks with every position an
output, and each chunk's logits are reduced to what the answer needs (the chosen token's log-probability and the
top-N) before the next chunk, so host memory stays at ``chunk x n_vocab`` floats however long the text.

These are the raw model's log-probabilities (temperature 1, no top-k/top-p), as OpenAI reports them.

The context keeps what it last scored: a call that extends it (a stream's next tokens, scored as they are sent)
decodes only from the last shared token on, so a stream costs its new tokens per frame, not its whole prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ..native import Context, ContextParams, Model, TokenBatch, state

CHUNK = 32


@dataclass
class TokenScore:
    token: int
    logprob: Optional[float]  # None for the first token: nothing precedes it
    top: list[tuple[int, float]]  # the top-N (token, logprob) at this position, best first


class Scorer:
    def __init__(self, model: Model, n_ctx: int, n_threads: int = 0):
        self.model = model
        self.n_ctx = n_ctx
        self.n_swa = state.n_swa(model)
        self.ctx = Context(model, ContextParams(n_ctx=n_ctx, n_batch=CHUNK, n_ubatch=CHUNK, backend_greedy=False,
                                                n_threads=n_threads))
        self.batch = TokenBatch(CHUNK)
        self.kept: list[int] = []  # the tokens in the context's KV (sequence 0), a prefix of the last call's

    def score(self, tokens: Sequence[int], top_n: int, first: int = 0) -> list[TokenScore]:
        """One TokenScore per token from position ``first`` on: position i is scored by the logits after
        tokens[:i] (position 0 by nothing: its logprob is None)."""
        tokens = [int(t) for t in tokens]
        if len(tokens) > self.n_ctx:
            raise ValueError(f"{len(tokens)} tokens exceed the scoring context ({self.n_ctx})")
        out = [TokenScore(tokens[0], None, [])] if tokens and first == 0 else []
        # position i needs the logits of position i - 1, so decoding starts at max(first, 1) - 1 at the latest
        start = self._keep(tokens, max(first, 1) - 1)
        try:
            for i in range(start, len(tokens) - 1, CHUNK):
                chunk = tokens[i : min(i + CHUNK, len(tokens) - 1)]
                self.batch.clear()
                self.batch.add(chunk, i, 0, True)
                self.ctx.decode(self.batch)
                self.kept += chunk
                for j in range(len(chunk)):
                    if i + j + 1 >= first:
                        out.append(self._reduce(self.ctx.logits(j), tokens[i + j + 1], top_n))
        except BaseException:
            self.kept = []  # the KV is in an unknown state: the next call starts afresh
            raise
        return out

    def _keep(self, tokens: list[int], limit: int) -> int:
        """Trim the kept KV to what ``tokens`` shares with it, at most ``limit`` tokens, and return where decoding
        starts. Everything goes when an SWA layer no longer holds the keys the first decoded token attends to."""
        n = 0
        for a, b in zip(self.kept, tokens[:limit]):
            if a != b:
                break
            n += 1
        # llama.cpp's contexts keep the whole sliding window by default (swa_full), so this holds today; it keeps
        # a context that prunes from attending over evicted keys
        if n and self.n_swa and self.ctx.seq_pos_min(0) > max(0, n - self.n_swa + 1):
            n = 0
        if n == 0:
            self.ctx.clear()
        elif n < len(self.kept):
            self.ctx.seq_rm(0, n)
        self.kept = tokens[:n]
        return n

    @staticmethod
    def _reduce(logits: np.ndarray, token: int, top_n: int) -> TokenScore:
        shifted = logits - logits.max()
        logp = shifted - np.log(np.exp(shifted).sum())  # log_softmax over the vocabulary
        top: list[tuple[int, float]] = []
        if top_n > 0:
            idx = np.argpartition(-logp, top_n)[:top_n]
            idx = idx[np.argsort(-logp[idx])]
            top = [(int(t), float(logp[t])) for t in idx]
        return TokenScore(token, float(logp[token]), top)

    def close(self) -> None:
        self.batch.close()
        self.ctx.close()
