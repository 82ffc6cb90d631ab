"""``logprobs`` and ``echo`` in OpenAI's two formats, computed by the engine's Scorer on the loop thread.

The text is generated first (greedy or sampled, with speculation as usual); then prompt + completion are scored
in one pass. lm-evaluation-harness's loglikelihood requests (``echo=true, logprobs=N, max_tokens=1``) read the
prompt's token log-probabilities from exactly this.
"""

from __future__ import annotations

from typing import Optional, Sequence

from ..engine.scorer import Scorer, TokenScore
from . import schemas as S
from .loop import EngineLoop


class ScoreService:
    def __init__(self, loop: EngineLoop):
        self.loop = loop
        self._scorer: Optional[Scorer] = None  # made on first use, on the loop thread (a context of its own)

    def _score(self, tokens: list[int], top_n: int):
        def run(engine):
            if self._scorer is None:
                self._scorer = Scorer(engine.model, engine.config.n_ctx_slot, engine.config.n_threads)
            scores = self._scorer.score(tokens, top_n)
            pieces = {t: engine.model.token_to_piece(t) for s in scores for t in [s.token, *(x for x, _ in s.top)]}
            return scores, pieces

        return self.loop.call(run)

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
