"""Log-probabilities of a token sequence under the target: the server's ``logprobs`` and ``echo``.

The decoding contexts sample on the backend and never copy logits to the host. Scoring needs them, so it runs
on a context of its own over the same target weights: the tokens go through in chunks with every position an
output, and each chunk's logits are reduced to what the answer needs (the chosen token's log-probability and the
top-N) before the next chunk, so host memory stays at ``chunk x n_vocab`` floats however long the text.

These are the raw model's log-probabilities (temperature 1, no top-k/top-p), as OpenAI reports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ..native import Context, ContextParams, Model, TokenBatch

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
        self.ctx = Context(model, ContextParams(n_ctx=n_ctx, n_batch=CHUNK, n_ubatch=CHUNK, backend_greedy=False,
                                                n_threads=n_threads))
        self.batch = TokenBatch(CHUNK)

    def score(self, tokens: Sequence[int], top_n: int) -> list[TokenScore]:
        """One TokenScore per token: position i is scored by the logits after tokens[:i]."""
        tokens = [int(t) for t in tokens]
        if len(tokens) > self.n_ctx:
            raise ValueError(f"{len(tokens)} tokens exceed the scoring context ({self.n_ctx})")
        self.ctx.clear()
        out = [TokenScore(tokens[0], None, [])] if tokens else []
        for i in range(0, len(tokens) - 1, CHUNK):
            chunk = tokens[i : i + CHUNK]
            self.batch.clear()
            self.batch.add(chunk, i, 0, True)
            self.ctx.decode(self.batch)
            for j in range(len(chunk)):
                nxt = i + j + 1
                if nxt >= len(tokens):
                    break
                out.append(self._reduce(self.ctx.logits(j), tokens[nxt], top_n))
        return out

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
