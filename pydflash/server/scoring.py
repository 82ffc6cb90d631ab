"""``logprobs`` and ``echo`` in OpenAI's two formats, computed by the engine's Scorer on the engine's thread.

The text is generated first (greedy or sampled, with speculation as usual); then prompt + completion are scored
in one pass, or, streamed, each frame's tokens as the frame is sent. lm-evaluation-harness's loglikelihood
requests (``echo=true, logprobs=N, max_tokens=1``) read the prompt's token log-probabilities from exactly this.
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

    def _score(self, tokens: list[int], top_n: int, first: int = 0):
        # a scoring context of its own, made on first use; it keeps the last call's KV, so a stream's frames
        # (each scoring the tokens it sends) decode only their new tokens
        return self.engine.call(ops.score, tokens, top_n, first)

    async def completion_logprobs(self, prompt: Sequence[int], completion: Sequence[int], top_n: int,
                                  echo: bool) -> S.CompletionLogprobs:
        return await self.completion_span(list(prompt) + list(completion), 0 if echo else len(prompt), top_n)

    async def completion_span(self, tokens: list[int], first: int, top_n: int,
                              offset: int = 0) -> S.CompletionLogprobs:
        """The legacy format for tokens[first:]; ``offset``: the text offset of tokens[first] in the choice's
        text (a stream's frames continue where the last one ended)."""
        scores, pieces = await self._score(tokens, top_n, first)
        text = {t: p.decode("utf-8", "replace") for t, p in pieces.items()}
        out = S.CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
        for s in scores:
            out.tokens.append(text[s.token])
            out.token_logprobs.append(s.logprob)
            out.top_logprobs.append(_top_dict(s, text) if s.logprob is not None else None)
            out.text_offset.append(offset)
            offset += len(text[s.token])
        return out

    async def chat_logprobs(self, prompt: Sequence[int], completion: Sequence[int], top_n: int) -> S.ChatLogprobs:
        return await self.chat_span(list(prompt) + list(completion), len(prompt), top_n)

    async def chat_span(self, tokens: list[int], first: int, top_n: int) -> S.ChatLogprobs:
        """Chat's format for tokens[first:] (the answer's tokens, or a stream frame's)."""
        scores, pieces = await self._score(tokens, top_n, first)
        content = []
        for s in scores:
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
