"""Which training rows copy their prompt: the share of each row's response tokens that continue an n-gram of it.

The shipped drafter does not copy text it has seen once (docs/drafter.md, "text seen once is not copied"), though
22-24 % of the response tokens in the data continue an 8-gram of their prompt. The trainer's ``--copy-weight``
draws the rows that mostly copy more often (``trainer.Rows``); this module finds them, once at load, in O(tokens):
each (n+1)-gram is hashed to 64 bits and looked up in its row's prompt grams by a sorted search (``np.isin``).
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

# A response token "copies" when it and the 8 tokens before it also stand, in that order, in the prompt: what an
# 8-gram lookup into the prompt would have drafted. 8 tokens are long enough that a match is a copy rather than a
# common phrase or idiom ("of the", "self.x = x" are 2-5 tokens), short enough to pick a copy up again 8 tokens
# after a changed word; docs/drafter.md's figures (22-24 % of response tokens) count with the same n.
COPY_NGRAM = 8
# A copying row: at least half of its response copies the prompt. The rows the drafter fails at (a passage, a cue,
# its opening: the target copies the rest) copy nearly all of their response; ordinary code and prose answers copy
# a few identifiers and phrases.
COPY_ROW_SHARE = 0.5
# positions hashed at a time: ~10 arrays of 8 bytes a position, so ~0.3 GB at most on data of 20 M+ tokens
CHUNK_TOKENS = 1 << 22
_MULT = np.uint64(0x9E3779B97F4A7C15)  # odd: multiplying mod 2**64 loses no bits of the hash so far


def gram_keys(tokens: np.ndarray, ends: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
    """A 64-bit hash of tokens[end - n .. end] (an n-gram and the token that continues it) per end, with the row
    folded in so that equal grams of different rows differ. Ends below n read clipped indices: the caller drops
    them. A collision (two grams, one key) is ~2**-64 a pair: at worst a token is miscounted, never an error."""
    with np.errstate(over="ignore"):  # the arithmetic is mod 2**64 on purpose
        h = np.zeros(len(ends), np.uint64)
        for back in range(n, -1, -1):
            h = h * _MULT + tokens[np.maximum(ends - back, 0)].astype(np.uint64) + np.uint64(1)
        return h * _MULT + rows.astype(np.uint64)


def copied_tokens(tokens, starts, lens, prompt_len, n: int = COPY_NGRAM) -> np.ndarray:
    """Per row (tokens[starts[r]:starts[r] + lens[r]], the first prompt_len[r] of them its prompt): how many of its
    response tokens copy the prompt (COPY_NGRAM). Only the prompt counts as a source, not the response before the
    token: the failure to fix is copying text seen once in the prompt; a target's answer that loops on its own
    output is the easy kind (recency), already most of the copies in the data (docs/drafter.md)."""
    lens, prompt_len = np.asarray(lens, np.int64), np.asarray(prompt_len, np.int64)
    rows = np.repeat(np.arange(len(lens)), lens)
    pos = np.arange(len(rows)) - np.repeat(np.cumsum(lens) - lens, lens)  # position within the row
    keys = gram_keys(tokens, np.repeat(np.asarray(starts, np.int64), lens) + pos, rows, n)
    prompt = np.repeat(prompt_len, lens)
    source = (pos >= n) & (pos < prompt)  # the whole gram and its next token lie in the prompt
    target = (pos >= n) & (pos >= prompt)  # a response token with n tokens before it
    hit = np.isin(keys[target], keys[source])
    return np.bincount(rows[target], weights=hit, minlength=len(lens)).astype(np.int64)


def row_chunks(lens: np.ndarray, limit: int) -> Iterator[tuple[int, int]]:
    """Consecutive row ranges [lo, hi) of at most ``limit`` tokens each (at least one row)."""
    ends = np.cumsum(lens)
    lo = 0
    while lo < len(lens):
        base = int(ends[lo - 1]) if lo else 0
        hi = max(lo + 1, int(np.searchsorted(ends, base + limit, side="right")))
        yield lo, hi
        lo = hi


def copy_shares(tokens, starts, lens, prompt_len, n: int = COPY_NGRAM, chunk_tokens: int = CHUNK_TOKENS):
    """Per row: the share of its response tokens that copy the prompt (``copied_tokens``); 0 without a response.
    Rows are done in chunks of ``chunk_tokens`` (grams never cross rows, so chunks do not change the result)."""
    starts, lens = np.asarray(starts, np.int64), np.asarray(lens, np.int64)
    prompt_len = np.asarray(prompt_len, np.int64)
    copied = np.zeros(len(lens), np.int64)
    for lo, hi in row_chunks(lens, chunk_tokens):
        copied[lo:hi] = copied_tokens(tokens, starts[lo:hi], lens[lo:hi], prompt_len[lo:hi], n)
    resp = np.maximum(lens - prompt_len, 0)
    return copied / np.maximum(resp, 1)
