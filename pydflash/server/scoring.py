"""``logprobs`` and ``echo`` in OpenAI's two formats, computed by the engine's Scorer on the engine's thread.

The text is generated first (greedy or sampled, with speculation as usual); then prompt + completion are scored
in one pass. lm-evaluation-harness's loglikelihood requests (``echo=true, logprobs=N, max_tokens=1``) read the
prompt's token log-probabilities from exactly this.
"""

from __future__ import annotations

from typing import Sequence

from ..engine.scorer import TokenScore
from . import ops
from . import schemas as S
from .engine_client import EngineClient


class ScoreService:
    def __init__(self, engine: EngineClient):
        self.engine = engine

    def _score(self, tokens: list[int], top_n: int):
        return self.engine.call(ops.score, tokens, top_n)  # a scoring context of its own, made on first use

    async def completion_logprobs(self, prompt: Sequence[int], completion: Sequence[int], top_n: int,
                                  echo: bool) -> S.CompletionLogprobs:
        scores, pieces = await self._score(list(prompt) + list(completion), top_n)
        if not echo:
            scores = scores[len(prompt):]
        text = {t: p.decode("utf-8", "replace") for t, p in pieces.items()}
        tokens, token_logprobs, top, offsets = [], [], [], []
        offset = 0
        for s in scores:
            tokens.append(text[s.token])
            token_logprobs.append(s.logprob)
            top.append(_top_dict(s, text) if s.logprob is not None else None)
            offsets.append(offset)
            offset += len(text[s.token])
        return S.CompletionLogprobs(tokens=tokens, token_logprobs=token_logprobs, top_logprobs=top, text_offset=offsets)

    async def chat_logprobs(self, prompt: Sequence[int], completion: Sequence[int], top_n: int) -> S.ChatLogprobs:
        scores, pieces = await self._score(list(prompt) + list(completion), top_n)
        content = []
        for s in scores[len(prompt):]:
            raw = pieces[s.token]
            content.append(S.TokenLogprob(
                token=raw.decode("utf-8", "replace"), logprob=s.logprob, bytes=list(raw),
                top_logprobs=[S.TopLogprob(token=pieces[t].decode("utf-8", "replace"), logprob=lp,
                                               bytes=list(pieces[t])) for t, lp in s.top],
            ))
        return S.ChatLogprobs(content=content)


def _top_dict(s: TokenScore, text: dict[int, str]) -> dict[str, float]:
    """OpenAI's legacy top_logprobs: {token text: logprob}; the chosen token is always listed."""
    out: dict[str, float] = {}
    for t, lp in s.top:
        out.setdefault(text[t], lp)
    out.setdefault(text[s.token], s.logprob)
    return out
