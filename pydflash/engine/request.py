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
    id: int = field(default_factory=lambda: next(_ids))

    def __post_init__(self):
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError("max_tokens must be an integer >= 1")
        if self.draft_max is not None and self.draft_max < 0:
            raise ValueError("draft_max must be >= 0")
        if isinstance(self.stop, str):
            self.stop = [self.stop]


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
