"""Prompt lookup: a draft chain copied from the slot's own text, where its last tokens stood before.

Why: the DFlash drafter sees the target's features, and at this size it does not copy text it has seen once
(docs/drafter.md: a summary that repeats the notes verbatim runs at tau 1.8 with version 4, a passage copied once at
1.5-1.9). The text being copied is already in the slot's history: where its last NGRAM tokens occurred before, what
followed them then is a free guess at what follows now (prompt lookup decoding; llama.cpp's n-gram drafts).

The lookup does not replace the drafter. Per slot and step, a copy is a candidate when its match runs to LONG_MATCH
tokens or more (the text is being copied), or when it starts with the drafter's own first draft (right 50-98 % of
the time: when they agree, a copy tends to go on longer than a block). Failing both, a copy spliced after the
drafter's first j drafts is one (``splice``): keyed on the text those drafts extend, and starting with the drafter's
own next draft. A table row or a list item repeats its template around the new words, which a copy keyed on the
history's end gets wrong at once (the previous row's time) and the drafter guesses; past them the copy carries the
template further than the drafter's later drafts (the frozen evaluation set, fixed blocks, on a CPU: code 3.52 ->
3.69, prose 2.88 -> 2.94, chat 6.69 -> 6.96, repetition 6.11 -> 6.27). A candidate is verified unless the slot's
copies have been earning less than its blocks: after each step with a candidate, whichever chain went unverified is
scored on the target's picks (``would_accept``) and the slot keeps a running difference (``Edge``). On version 5's
suite, copies chosen by the rule alone lost in JSON records, CSV rows, markdown tables and log lines (14.2 -> 9.5 in
one): a 3-token match there copies the previous record, where the drafter knew the next one.
Verification is unchanged, so committed text is the target's whichever chain went in (greedy picks and
sample-and-match both keep only the target's own tokens). Rejection sampling needs the drafter's q for every draft,
so it never uses a copy (``Engine._admit`` gives such slots no history).
"""

from __future__ import annotations

from typing import Sequence

NGRAM = 3  # tokens of the history's end to look up: 2 matches too often by chance, 4+ misses short repeats
LONG_MATCH = 8  # a match this long says the text is being copied: a candidate even against the first draft


class History:
    """A slot's tokens (prompt, then what it committed), indexed by each NGRAM-gram's last occurrence that has a
    token after it. Appending costs O(1) a token; a lookup O(LONG_MATCH + k), plus indexing what was appended since
    the last one.

    The index is brought up to date by a lookup, not by each append: a slot whose engine has drafting paused (a
    useless drafter's every step but a probe) only appends, and indexing each committed token there cost ~2 us of
    a slot's step (such an engine must stay within 3 % of plain decoding: docs/benchmarks.md)."""

    def __init__(self, tokens: Sequence[int]):
        self.tokens: list[int] = [int(t) for t in tokens]
        self.last: dict[tuple[int, ...], int] = {}  # gram -> the position of its last token
        self._indexed = NGRAM - 1  # grams ending before this position are in ``last``

    def extend(self, tokens: Sequence[int]) -> None:
        self.tokens.extend(tokens)  # committed ids: Python ints already

    def _index(self) -> None:
        toks, last = self.tokens, self.last
        for i in range(self._indexed, len(toks) - 1):  # a gram is indexed once a token follows it
            last[tuple(toks[i - NGRAM + 1:i + 1])] = i
        self._indexed = max(self._indexed, len(toks) - 1)

    def continuation(self, k: int, min_match: int = NGRAM, extra: Sequence[int] = ()) -> tuple[list[int], int]:
        """The k tokens that followed the last earlier occurrence of the history's final NGRAM tokens, and how many
        tokens that match spans (NGRAM..LONG_MATCH); ([], 0) if they never occurred before, ([], n) if the match
        spans fewer than min_match. A match that runs into the present (a loop shorter than k) continues the loop.
        ``extra``: tokens taken to follow the history (drafts not yet verified): the lookup is keyed on the
        history's end followed by them, and finds its occurrence in the history itself."""
        toks = self.tokens
        total = len(toks) + len(extra)
        if k <= 0 or total < NGRAM:
            return [], 0
        self._index()
        # the sequence's last tokens, the drafts' included: a match is counted back at most LONG_MATCH of them
        end = toks[-LONG_MATCH:] + list(extra) if extra else toks
        j = self.last.get(tuple(end[-NGRAM:]))
        if j is None:
            return [], 0
        n = NGRAM
        while n < LONG_MATCH and j - n >= 0 and toks[j - n] == end[-1 - n]:
            n += 1
        if n < min_match:  # copies.py asks every slot in every step: no chain built for nothing
            return [], n
        period = total - 1 - j
        out = toks[j + 1:j + 1 + min(k, period)]
        if extra:  # past the history, the copy reads the drafts
            out += extra[:min(k, period) - len(out)]
        while len(out) < k:  # the copy reached the end of the history: what it copied since repeats
            out.append(out[len(out) - period])
        return out, n


EDGE_DECAY = 0.8  # a slot's edge follows its last ~5 steps with a candidate copy: the text changes kind quickly


def would_accept(other: list[int], chain: list[int], picks: list[int], m: int) -> int:
    """How many of ``other``'s drafts the target would have accepted in a step that verified ``chain`` (m of it
    accepted; picks: the target's pick after each prefix of chain). Exact where other leaves chain inside its
    accepted part; m + 1 (a lower bound) where other also holds the bonus, since the target's picks past it are not
    known.

    Adaptive drafting learns from what the drafter's block would have earned, not from a copy's m: copies cost no
    drafter forward and come only where text repeats, so counting them as the drafter's made a useless drafter look
    useful (the H200, 8 clients: 0.84x of plain; 0.98x with this)."""
    i = 0
    while i < m and i < len(other) and other[i] == chain[i]:
        i += 1
    if i < m:  # other parts from the accepted chain at i, where the target picked chain's token
        return i
    return m + 1 if m < len(other) and other[m] == picks[m] else m


class Edge:
    """A slot's running difference between what its candidate copies and its drafter's blocks earn (accepted drafts
    a step): the copy is verified while it is >= 0. It starts at 0, so the rule alone decides until a slot has
    evidence."""

    def __init__(self):
        self.value = 0.0

    def observe(self, m_copy: int, m_block: int) -> None:
        self.value = EDGE_DECAY * self.value + (1 - EDGE_DECAY) * (m_copy - m_block)


def choose(drafts: list[int], history: History, k: int, edge: Edge) -> tuple[list[int], list[int] | None, bool]:
    """The chain to verify for one slot, the other chain where there was a candidate copy (to be scored after the
    verify; None: no candidate), and whether the verified chain is the copy (see the module docstring)."""
    copy, n = history.continuation(k)
    if not copy or not (n >= LONG_MATCH or (drafts and copy[0] == drafts[0])):
        copy = splice(drafts, history, k)
        if copy is None:
            return drafts, None, False
    if edge.value >= 0.0:
        return copy, drafts, True
    return drafts, copy, False


def splice(drafts: list[int], history: History, k: int) -> list[int] | None:
    """The drafter's first j drafts, then a copy keyed on the text they extend, where that copy starts with the
    drafter's own next draft: a table row or a list item repeats its template around the words the drafter has to
    guess (the next time in a timetable, the next item), so the copy takes over where the drafter's guess ends.
    None where no such copy parts from the drafts.

    Every drafting slot without a copy asks this on every step, so each j costs one slice and one dict lookup; the
    copy itself is built only where one starts with the drafter's next draft."""
    n = min(len(drafts), k)
    toks = history.tokens
    if n < NGRAM or len(toks) < NGRAM - 1:
        return None
    history._index()
    last, tail = history.last, toks[len(toks) - (NGRAM - 1):] + drafts[:n]
    for j in range(1, n - 1):  # the gram ending at draft j - 1 is tail[j - 1:j + NGRAM - 1]
        i = last.get(tuple(tail[j - 1:j + NGRAM - 1]))
        if i is not None and toks[i + 1] == drafts[j]:
            chain = drafts[:j] + history.continuation(k - j, extra=drafts[:j])[0]
            return chain if chain != drafts[:k] else None
    return None
