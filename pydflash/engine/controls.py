"""The sampling controls a request adds to temperature / top-k / top-p: validation, and the transforms as pure
functions over one row of logits (tested directly).

One row's transformed logits, in this order (llama.cpp's sampler order, docs/sampling.md):
  logit_bias (added; a ban is -inf) -> penalties over the history window -> grammar mask (-inf where the grammar
  forbids the token) -> [greedy: argmax] or [top-k -> top-p -> min-p -> temperature -> softmax].

Penalties follow ``llama_sampler_penalties_apply``: for each token with count c > 0 among the last
``repeat_last_n`` tokens of the history (prompt and generated, as llama-server feeds its sampler; -1 = all of
it), a logit z becomes z / repeat (z > 0) or z * repeat (z <= 0), then z - c * frequency - presence.
"""

from __future__ import annotations

import math
import numbers
from collections import Counter, deque
from dataclasses import dataclass
from typing import Mapping, Optional

import numpy as np

from ..errors import InvalidRequest

BAN = -100.0  # a bias at or below this bans the token (OpenAI's -100), stored as -inf


def _real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def check_logit_bias(raw) -> tuple[tuple[int, float], ...]:
    """{token id: bias} (ids as ints or decimal strings, as JSON objects carry them) -> sorted (id, bias) pairs;
    a bias <= -100 (or -inf) becomes -inf. Ids are checked against the vocabulary at submission."""
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise InvalidRequest(f"logit_bias must be a mapping of token id to bias, got {type(raw).__name__}")
    out = {}
    for key, bias in raw.items():
        tok = int(key) if isinstance(key, str) and key.strip().lstrip("-").isdigit() else key
        if not isinstance(tok, numbers.Integral) or isinstance(tok, bool) or tok < 0:
            raise InvalidRequest(f"logit_bias: {key!r} is not a token id (an integer >= 0)")
        if not _real(bias) or math.isnan(bias) or bias > 100 or (bias < BAN and bias != -math.inf):
            raise InvalidRequest(f"logit_bias[{key}]: the bias must be a number in [-100, 100] or -inf, got {bias!r}")
        out[int(tok)] = -math.inf if bias <= BAN else float(bias)
    return tuple(sorted(out.items()))


def check_range(name: str, x, lo: float, hi: float, *, lo_open: bool = False) -> float:
    if not _real(x) or not (lo < x <= hi if lo_open else lo <= x <= hi):  # also rejects NaN
        raise InvalidRequest(f"{name} must be a number in {'(' if lo_open else '['}{lo}, {hi}], got {x!r}")
    return float(x)


@dataclass(frozen=True)
class Penalties:
    repeat: float = 1.0
    frequency: float = 0.0
    presence: float = 0.0
    last_n: int = 64  # -1: the whole history; 0: off

    @property
    def on(self) -> bool:
        return self.last_n != 0 and (self.repeat != 1.0 or self.frequency != 0.0 or self.presence != 0.0)

    def apply(self, z: np.ndarray, counts: Mapping[int, int]) -> None:
        """In place on one row [V] (``llama_sampler_penalties_apply``)."""
        if not counts:
            return
        ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
        c = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
        zi = z[ids]
        zi = np.where(zi <= 0, zi * np.float32(self.repeat), zi / np.float32(self.repeat))
        z[ids] = zi - c * np.float32(self.frequency) - np.float32(self.presence)


class Window:
    """Token counts over the last ``last_n`` tokens of a history (-1: all), updated one token at a time; ``copy``
    for a draft path that may be abandoned."""

    def __init__(self, tokens=(), last_n: int = -1):
        self.last_n = last_n
        kept = list(tokens) if last_n < 0 else list(tokens)[-last_n:] if last_n else []
        self.tokens = deque(kept)
        self.counts = Counter(kept)

    def push(self, tok: int) -> None:
        if self.last_n == 0:
            return
        self.tokens.append(tok)
        self.counts[tok] += 1
        if 0 < self.last_n < len(self.tokens):
            old = self.tokens.popleft()
            self.counts[old] -= 1
            if not self.counts[old]:
                del self.counts[old]

    def copy(self) -> "Window":
        w = Window.__new__(Window)
        w.last_n, w.tokens, w.counts = self.last_n, deque(self.tokens), Counter(self.counts)
        return w


def add_bias(z: np.ndarray, bias: tuple[tuple[int, float], ...]) -> None:
    for tok, b in bias:
        z[tok] += b


def distribution(z: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0,
                 min_p: float = 0.0) -> np.ndarray:
    """[V] float64 probabilities from transformed logits: top-k, then top-p and min-p on the untempered
    distribution, then temperature (the backend chain's order, ``Context.set_sampling``). Tokens at -inf (banned,
    forbidden, outside a reduced head) get 0. At least one token must be finite."""
    z = z.astype(np.float64)
    finite = np.isfinite(z)
    if 0 < top_k < int(finite.sum()):
        cut = np.partition(z, -top_k)[-top_k]
        z[z < cut] = -np.inf  # ties at the cut are kept, as an exact k would keep an arbitrary one of them
    if top_p < 1.0:
        p = _softmax(z)
        order = np.argsort(-p, kind="stable")
        keep = int(np.searchsorted(np.cumsum(p[order]), top_p)) + 1  # the smallest prefix reaching top_p
        z[order[keep:]] = -np.inf
    if min_p > 0.0:
        z[z < z.max() + math.log(min_p)] = -np.inf
    return _softmax(z / temperature)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def argmax(z: np.ndarray) -> Optional[int]:
    """The likeliest token, or None where every token is at -inf (the grammar and the bans left nothing)."""
    t = int(np.argmax(z))
    return t if z[t] > -np.inf else None
