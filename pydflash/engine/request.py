"""What a caller submits, and what comes back."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

from .stats import Stats

_ids = itertools.count()


@dataclass
class Request:
    prompt: Union[str, Sequence[int]]
    max_tokens: int = 128
    stop: Sequence[str] = ()
    draft_max: Optional[int] = None  # None: the engine default (the trained block - 1); 0: no drafting
    ignore_eos: bool = False
    add_special: bool = True  # tokenizer BOS handling for string prompts
    # Sampling (temperature 0 = greedy). Drafts stay the drafter's argmax; the target samples every verified
    # position on the backend and a draft is accepted iff it equals the target's sample there. For a
    # deterministic drafter that is exactly speculative sampling: draft d is kept with probability p(d), and on
    # a rejection the committed sample is distributed as p with d removed, renormalised.
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: Optional[int] = None
    cache_prompt: bool = True  # reuse a cached prefix of the prompt (and keep this one for later requests)
    id: int = field(default_factory=lambda: next(_ids))

    def __post_init__(self):
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError("max_tokens must be an integer >= 1")
        if self.draft_max is not None and self.draft_max < 0:
            raise ValueError("draft_max must be >= 0")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not self.temperature >= 0.0:  # also rejects NaN
            raise ValueError("temperature must be >= 0")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")

    @property
    def sampling(self) -> tuple:
        """What the backend sampler chain of this request's sequence must be (hashable, for reuse)."""
        if self.temperature == 0.0:
            return ("greedy",)
        seed = self.seed if self.seed is not None else self.id
        return ("dist", self.temperature, self.top_k, self.top_p, seed & 0xFFFFFFFF)


@dataclass
class Result:
    request_id: int
    text: str
    tokens: list[int]
    finish_reason: str  # "stop" (EOS or stop string) or "length"
    stats: Stats
    synthetic: bool = False  # synthetic acceptance: the text is NOT valid model output


@dataclass
class Event:
    """One step's output for one request (streaming)."""

    request_id: int
    text: str
    tokens: list[int]
    finished: bool = False
    result: Optional[Result] = None
