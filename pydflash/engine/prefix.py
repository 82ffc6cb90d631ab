"""Prompt reuse for the engine: which slot a request goes to, and how both KV caches get to its cached prefix.

Three paths, all keeping the target and the drafter consistent (docs/architecture.md, failure classes):
- **resident**: a released slot keeps its tokens and both caches; a new request sharing a prefix trims both at the
  same position p (and the feature bookkeeping with them) and prefills only the rest. Residents are kept cells too:
  with the device tier's entries they are held to what the load allows (``_hold_to_budget``), answers cut first;
- **device** (the default second tier): a resident about to be overwritten keeps its cells under a spare sequence id
  of both contexts (``cache/device.py``: a ``seq_cp``, no copy); a request whose longest prefix lives there gets
  those cells shared into its slot. Only residents whose prompt recurs are kept (second sight: the prompt's first
  block was seen in an earlier request); every step's attention spans the kept cells, so they are held to a share
  of what the running requests hold, an entry not hit soon leaves, and all are given up before any admission
  would leave a running request short of KV (``_make_room``);
- **RAM** (opt-in): what the device tier evicts (or, without one, a resident about to be overwritten) is copied
  (both states + bookkeeping) into the RAM cache; a request whose longest prefix lives there restores both states
  into its slot, all or nothing;
- **checkpoint**: an SWA target (Gemma-3) keeps only the last n_swa positions in its sliding-window layers, so a
  sequence that ran past the window cannot simply be trimmed back: the nearest checkpoint at or before p is
  restored instead (partial state), or the request re-prefills. With a device tier the checkpoint at the end of a
  recurring prompt is a device entry of the prompt (the SWA layers' window at that point comes with it).

The reuse point p is at most len(prompt) - 1 (the last prompt token is the first anchor and never prefilled). Past
the positions whose features the drafter holds or has pending (decoded while adaptive drafting had extraction
paused, or before its context restarted after a pause), the target's KV is still reused and the drafter's context
restarts at p, as after any pause. Every fallback is logged with its reason.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from typing import Callable, NamedTuple, Optional

import numpy as np

from ..cache import blocks, slotfile
from ..cache.config import USEFUL_DECAY, CacheConfig
from ..cache.device import DeviceCache
from ..cache.digest import model_digest
from ..cache.lru import PrefixLRU
from ..cache.ram import RamCache
from ..cache.snapshot import Checkpoint, Features, Snapshot
from ..errors import CacheFileError, InvalidRequest, PydflashError
from ..config import EngineConfig
from ..native import Context, state
from ..native.handles import LLAMA_MAX_SEQ
from ..pair import Pair
from .slot import FeatureRows, Slot


log = logging.getLogger(__name__)
SEEN_PROMPTS = 4096  # first-block hashes of recent prompts remembered for the second-sight rule


class Found(NamedTuple):
    """The longest usable cached prefix of a prompt in one tier: where, which entry, how much, after what."""

    tier: PrefixLRU
    key: int
    entry: Snapshot
    p: int  # positions reused
    ckpt: Optional[Checkpoint]


def supported(pair) -> bool:
    """Whether the prompt cache can run for this pair (the engine sizes its contexts' spare ids by it)."""
    # a drafter with its own sliding window would need drafter checkpoints too, and the engine's drafter invariant
    # assumes a contiguous KV from drafter_base: not supported yet
    return pair.drafter is None or state.n_swa(pair.drafter) == 0


def spare_ids(pair, config, cfg: CacheConfig) -> int:
    """Spare sequence ids the engine's contexts need for the device tier (0: no device tier). KV streams would copy
    whole buffers on seq_cp, so the device tier needs the one unified KV."""
    if not (config.kv_unified and supported(pair)):
        return 0
    return min(cfg.spare_ids(config.n_slots), LLAMA_MAX_SEQ - config.n_slots)


class PromptCache:
    """The engine's prompt reuse. It sees the engine through a narrow interface: both contexts, the pair, the
    configuration, whether a slot is busy, and the slot invariant to check after a reuse (None: unchecked)."""

    def __init__(self, target: Context, drafter: Optional[Context], pair: Pair, config: EngineConfig,
                 cfg: CacheConfig, n_spare: int = 0, block_size: int = 0, busy: Callable[[int], bool] = lambda s: False,
                 check: Optional[Callable[[Slot], None]] = None):
        self.cfg = cfg
        self.config = config
        self.block_size = block_size
        self.busy = busy
        self.check = check
        self.target = target
        self.dctx = drafter
        self.n_swa = state.n_swa(pair.target)
        self.enabled = cfg.reuse or cfg.ram_bytes > 0
        if not supported(pair):
            log.warning("prompt cache off: the drafter has sliding-window layers")
            self.enabled = False
        self.digests = (model_digest(pair.target), model_digest(pair.drafter) if self.dctx else "")
        salt = blocks.salt(*self.digests)
        self.ram = RamCache(cfg.ram_bytes, salt, cfg.block) if cfg.ram_bytes and self.enabled else None
        n = config.n_slots
        self.n_ctx = n * config.n_ctx_slot  # KV cells of the target (and of the drafter)
        cap = cfg.device_cap(self.n_ctx, config.n_ctx_slot)
        self.device = None
        if self.enabled and n_spare and cap > 0:
            contexts = [self.target] + ([self.dctx] if self.dctx is not None else [])
            self.device = DeviceCache(contexts, range(n, n + n_spare), cap, salt, cfg.block, on_evict=self._spill)
        self.seen: "OrderedDict[bytes, None]" = OrderedDict()  # recent prompts' first blocks (second sight)
        self.salt = salt
        self.resident: list[Optional[Snapshot]] = [None] * n  # released slots' sequences (states live in the KV)
        self.steps = 0  # engine steps that ran a request (``tick``)
        self.graced: set[int] = set()  # slots whose resident is a conversation's turn released into its grace
        self.released_at = [0] * n  # the step when each resident was released (the oldest give way; the grace)
        self.released_time = [0.0] * n  # and the time (the grace)
        self.clock: Callable[[], float] = time.monotonic  # the grace's seconds (a test steps a clock of its own)
        # the last released sequences (slot, tokens, prompt length), whatever became of them: a prompt that continues
        # one past its prompt is a conversation's next turn even where its transcript was given up (``_answers_back``)
        self.recent: deque[tuple[int, np.ndarray, int]] = deque(maxlen=2 * n)
        # device entries whose cells [0, n) each slot's sequence holds too (kept from it, or restored into it): while
        # the slot runs or keeps its sequence they cost no cell of their own (``_kept_cells``)
        self.cover: list[set[Snapshot]] = [set() for _ in range(n)]
        self.residents_cut = 0  # residents cut back to their prompt to hold kept cells to the budget
        self.residents_dropped = 0  # residents given up for the budget
        self.live_ckpts: list[list[Checkpoint]] = [[] for _ in range(n)]  # checkpoints of the running requests
        self.recurs = [False] * n  # whether each running request's prompt recurs (kept with its resident)
        self.talks = [False] * n  # whether each running request's reuse reached into an earlier answer
        self.reserved = [0] * n  # KV cells each running request may come to hold, 0 for a free slot (_make_room)
        self.branch = [0] * n  # where each prefilling prompt leaves what earlier traffic shared (``_branch_at``)
        self.n_reused = 0  # prompt tokens not prefilled thanks to the cache, all requests
        self.admissions = 0  # requests admitted so far (device entries' probation counts them)
        self.fallbacks = 0  # cached prefixes found but not used (logged with the reason)
        self.drafter_restarts = 0  # reuses past the cached features: the drafter's context started at the reuse point
        self.context_trims = 0  # reuses stopped short of the cached prefix to give the drafter a context
        # the share of recent admissions that reused a kept prefix, decayed (CacheConfig.kept_useful). A fresh
        # server starts at the threshold: its whole budget, for what its first requests may come back to, that the
        # first admissions that reuse nothing start to shrink. Starting at 1 held the whole budget for ~45
        # admissions of traffic that never reuses: a closed loop of 8 clients over 16 slots on a CPU kept ~300
        # cells of one-off prompts beside the running requests and widened the KV span (llama.cpp's n_kv) 42 %.
        self.reuse_rate = cfg.kept_useful

    # --- admission ------------------------------------------------------------------------------------
    def pick_slot(self, tokens: list[int], free: list[int], cache_prompt: bool = True) -> int:
        """The free slot whose resident sequence gives the longest reuse; ties go to the one with least to lose.
        When the device or RAM tier holds a longer prefix, the slot with least to lose (it is restored there)."""

        def least_to_lose(seq):
            # a resident whose prompt never recurred is worth least: traffic that moved on left it
            res = self.resident[seq]
            return (0, 0, seq) if res is None else (int(res.recurs), res.n, seq)

        if not (self.enabled and cache_prompt):
            return min(free, key=least_to_lose)  # keep the most valuable residents

        def reuse(seq):
            res = self.resident[seq]
            if res is None or not self.cfg.reuse:
                return 0
            n_common = blocks.common_prefix(res.tokens, tokens[:-1])
            return self._plan(res, self._swa_min(seq, res.n), n_common, quiet=True)[0]

        best = max(free, key=lambda seq: (reuse(seq), tuple(-x for x in least_to_lose(seq))))
        found = self._lookup(tokens, len(tokens) - 1, quiet=True)
        if found is not None and found.p > reuse(best):
            return min(free, key=least_to_lose)
        return best

    def admit(self, slot: Slot, tokens: list[int], cache_prompt: bool = True, lead: int = 0) -> int:
        """Bring both caches of ``slot.seq`` to the longest usable cached prefix of ``tokens`` (its feature
        bookkeeping with them); returns that length, the positions the caller does not prefill. ``lead``: for a
        request about to draft, how many positions before the reuse point the drafter should have features of
        (``_with_context``)."""
        seq, limit = slot.seq, len(tokens) - 1
        self.admissions += 1
        res, self.resident[seq] = self.resident[seq], None
        self.live_ckpts[seq] = []
        self.reserved[seq] = min(self.config.n_ctx_slot, len(tokens) + slot.request.max_tokens + self.block_size)
        if not (self.enabled and cache_prompt) or limit <= 0:
            self._note_reuse(False)
            self.recurs[seq] = self.talks[seq] = False
            self._save(seq, res, 0)
            self._clear(seq)
            self._make_room()
            return 0
        src, p, ckpt, tier = None, 0, None, "slot"
        if res is not None and self.cfg.reuse:
            src = res
            p, ckpt = self._plan(res, self._swa_min(seq, res.n), blocks.common_prefix(res.tokens, tokens[:limit]))
        found = self._lookup(tokens, limit, touch=True)
        if found is not None and found.p > p:
            # the hit first: as the most recent entry it is not the one evicted when keeping the resident makes
            # room (it was: KeyError in hit() with a full cache), and the device tier never evicts it for that
            found.tier.hit(found.key)
            self._save(seq, res, 0, protect=found.entry)
            if self._restore(seq, found.entry):
                src, p, ckpt = found.entry, found.p, found.ckpt
                tier = "device" if found.tier is self.device else "RAM"
            else:
                src, p, ckpt = None, 0, None
        if tier == "slot":
            for t in (self.device, self.ram):
                if t is not None:
                    t.miss()
            self._save(seq, res, p)
        if src is not None and p > 0 and lead and self.dctx is not None:
            p, ckpt = self._with_context(seq, src, p, ckpt, lead)
        n = self._trim(slot, src, p, ckpt) if src is not None and p > 0 else 0
        if n == 0:
            self._clear(seq)
        seen = self._seen_before(tokens)  # (remembered whatever the reuse)
        self.recurs[seq] = seen or n >= self.cfg.block
        # the client sent an answer back: a conversation (its release gets the grace)
        self.talks[seq] = (src is not None and 0 < src.n_prompt < n) or self._answers_back(tokens)
        self.branch[seq] = self._branch_at(slot, tokens[:limit], n, res)
        self.n_reused += n
        self._note_reuse(n > 0)
        if n:
            log.debug("slot %d: reusing %d of %d prompt tokens (%s)", seq, n, len(tokens), tier)
        self._make_room()
        if self.check is not None:
            self.check(slot)
        return n

    def _answers_back(self, tokens: list[int]) -> bool:
        """Whether ``tokens`` continue a recently released sequence past its prompt, reused or not: a
        conversation whose transcript was given up before its next turn came (a first turn has no grace: nothing
        tells it from one-off traffic yet). Without this, a turnaround longer than the budget's patience lost
        every later turn of the conversation too, each one's release looking like a first turn's."""
        # it continues one past its prompt: their first n_prompt + 1 tokens agree, and the prompt goes on after
        # that (as the reuse rule above: at least a block reused, not the whole prompt). Short prompts ("Once upon a
        # time") do not count: one-off texts share them and a first answer token.
        tried = [(seq_tokens, m) for _, seq_tokens, n_prompt in self.recent
                 if self.cfg.block <= (m := n_prompt + 1) < len(tokens) and m <= len(seq_tokens)
                 and int(seq_tokens[m - 1]) == tokens[m - 1]]
        if not tried:
            return False  # most admissions: no array made
        arr = np.asarray(tokens[:max(m for _, m in tried)], dtype=np.int32)
        return any(np.array_equal(seq_tokens[:m], arr[:m]) for seq_tokens, m in tried)

    def _note_reuse(self, reused: bool) -> None:
        self.reuse_rate = USEFUL_DECAY * self.reuse_rate + (1 - USEFUL_DECAY) * reused

    def _lookup(self, tokens: list[int], limit: int, quiet: bool = False, touch: bool = False) -> Optional[Found]:
        """The longest usable prefix in the device tier, or in RAM where that one is longer (a RAM restore copies
        the state in: the device's is free). ``touch``: device entries the prompt holds whole count as used
        (``DeviceCache.touch``), whichever serves it."""
        best, unusable = None, None
        for tier in (self.device, self.ram):
            # every entry sharing a block, longest shared prefix first: past an SWA window the longest may serve
            # nothing while a shorter one serves its whole length
            candidates = tier.candidates(tokens, limit) if tier is not None else []
            if touch and tier is self.device:
                for key, entry, n_common in candidates:
                    if n_common == entry.n:
                        tier.touch(key)
            for key, entry, n_common in candidates:
                if n_common <= (best.p if best is not None else 0):
                    break
                swa_min = self._swa_min(entry.seq, entry.n) if entry.seq >= 0 else entry.swa_min
                p, ckpt = self._plan(entry, swa_min, n_common, quiet=True)
                if p > (best.p if best is not None else 0):
                    best = Found(tier, key, entry, p, ckpt)
                elif unusable is None:
                    unusable = (entry, swa_min, n_common)
        if best is None and unusable is not None and not quiet:
            self._plan(*unusable)  # logged and counted: a cached prefix found but not used
        return best

    def _seen_before(self, tokens: list[int]) -> bool:
        """Second sight: whether a recent prompt started with the same first block (then remember this one)."""
        if len(tokens) < self.cfg.block:
            return False
        h = blocks.block_hash(self.salt, tokens[: self.cfg.block])
        seen = h in self.seen
        self.seen[h] = None
        self.seen.move_to_end(h)
        while len(self.seen) > SEEN_PROMPTS:
            self.seen.popitem(last=False)
        return seen

    def _branch_at(self, slot: Slot, prompt: list[int], n: int, was: Optional[Snapshot]) -> int:
        """Where this prompt parts from the longest prefix it shares with a kept sequence, when that prefix could
        not be reused: an SWA target's kept sequence past the window serves only its whole length (``_swa_min``),
        so a system prompt shared by every new conversation would be prefilled again each time. The slot keeps a
        device entry when its prefill reaches that point (``chunk_end`` stops a chunk there), and the next prompt
        that parts at the same place reuses it. ``was``: the slot's own kept sequence, just replaced. 0: none."""
        if self.device is None or not self.n_swa or not self._outgrows_window(slot):
            return 0
        kept = [r for r in self.resident + [was] if r is not None] + list(self.device.entries.values())
        # where the prompt parts from a kept sequence inside it: one it shares whole (an earlier turn of its own
        # conversation, this prompt sent again) is served by the prompt-end entry (``after_prefill``), while the
        # point where it parts from other conversations (their system prompt) serves every new one
        shared = max((c for r in kept if (c := blocks.common_prefix(r.tokens, prompt)) < len(prompt)), default=0)
        return shared if shared >= self.cfg.block and shared > n else 0

    def chunk_end(self, slot: Slot) -> Optional[int]:
        """The position the slot's next prefill chunk must not pass (its branch point), None: no limit."""
        b = self.branch[slot.seq]
        return b if b > slot.n_past else None

    def _make_room(self) -> None:
        """Hold the kept cells to what they may cost (``_hold_to_budget``), then give up device entries until every
        running request's worst case (prompt + max_tokens + a block), every resident and every entry fit the KV
        together: without entries they always do (each slot's share is capped at n_ctx_slot), so no running request
        ever finds the KV short for kept sequences."""
        self._hold_to_budget()
        if self.device is None:
            return
        held = sum(r if r else (res.n if res is not None else 0) for r, res in zip(self.reserved, self.resident))
        while self.device.entries and held + self.device.used > self.n_ctx:
            self.device.evict_oldest()

    def _hold_to_budget(self) -> None:
        """Hold the kept cells, idle residents' and device entries', to what they may cost (``CacheConfig.
        kept_share``: in a unified KV every step's attention spans them). Device entries never hit within their
        probation leave; residents' answers (oldest released first) are cut while they hold more than the share
        alone allows (the floor is for prompts, such as a long system prompt, not for answers); then, while over:
        residents whose prompt never recurred (past the share, all but the newest one per running request), device
        entries no slot shares (least recently used), the other residents."""
        if self.device is not None:
            self.device.expire(self.admissions, self.cfg.probation(self.config.n_slots))
        if not any(self.reserved):
            return  # nothing runs, so nothing pays for them: the next admission holds them to its load
        # what the kept cells may cost at this load, times the share of it they have been earning (kept_useful)
        budget = int(self.cfg.kept_budget(self.reserved, self.config.n_ctx_slot)
                     * self.cfg.usefulness(self.reuse_rate))
        if not (self.cfg.bound_residents and self.config.kv_unified):  # KV streams: a resident costs only its slot
            self._evict_entries(lambda: self._entry_cells() <= budget)
            return
        now = self.clock()  # one moment for the whole pass: a grace ending within it would count what it cannot cut
        idle = sorted((seq for seq, r in enumerate(self.resident) if r is not None and not self._in_grace(seq, now)),
                      key=lambda s: self.released_at[s])
        answers = {seq: self.resident[seq].n - n for seq in idle if (n := self._prompt_end(seq, self.resident[seq]))}
        share = self.cfg.share(self.reserved)
        for seq in idle:
            if self._kept_cells(now) <= budget and sum(answers.values()) <= share:
                break
            if answers.pop(seq, 0):
                self._cut_to_prompt(seq)
        # Past the share, the floor keeps one prompt that never recurred per running request, the newest: what a
        # conversation's next turn comes back to. More of them (a request alone beside fifteen idle slots of
        # never-repeating traffic) cost every step and are almost never hit.
        once = [s for s in idle if self.resident[s] is not None and not self.resident[s].recurs]
        n_running = sum(1 for r in self.reserved if r)
        for i, seq in enumerate(once):
            kept = self._kept_cells(now)
            if kept <= budget and (kept <= share or len(once) - i <= n_running):
                break
            self._drop_resident(seq)
        if self._evict_entries(lambda: self._kept_cells(now) <= budget):
            return
        for seq in [s for s in idle if self.resident[s] is not None]:
            if self._kept_cells(now) <= budget:
                return
            self._drop_resident(seq)

    def _evict_entries(self, enough: Callable[[], bool]) -> bool:
        """Give up device entries no slot shares, least recently used first, until ``enough()``; returns it."""
        if self.device is not None:
            covered = self._covered()
            for key in [k for k, e in self.device.entries.items() if e not in covered]:
                if enough():
                    return True
                self.device.evict(key)
        return enough()

    def _kept_cells(self, now: Optional[float] = None) -> int:
        """KV cells idle residents and device entries hold beyond the running requests' own: an entry whose cells a
        slot's sequence holds too costs nothing more (an upper bound otherwise: cells shared by entries, or by a
        resident and a running request, count for each). Residents in their grace are not counted yet."""
        now = self.clock() if now is None else now  # a budget pass gives its own moment
        return (sum(r.n for seq, r in enumerate(self.resident) if r is not None and not self._in_grace(seq, now))
                + self._entry_cells())

    def tick(self) -> None:
        """An engine step that runs requests begins (the residents' grace is counted in these); a resident whose
        grace ends now is held to the budget with the others at once, not at the next admission or release."""
        self.steps += 1
        if self.graced:
            now = self.clock()
            ended = {seq for seq in self.graced if not self._in_grace(seq, now)}
            if ended:
                self.graced -= ended
                if any(self.resident[seq] is not None for seq in ended):
                    self._hold_to_budget()

    def _in_grace(self, seq: int, now: float) -> bool:
        """Whether slot ``seq``'s resident is a conversation's turn released under ``CacheConfig.release_grace``
        steps or ``release_grace_s`` seconds ago, whichever ends later: neither cut nor given up for the budget, nor
        counted in it, since a closed-loop client's next turn is on its way."""
        res = self.resident[seq]
        return res is not None and res.talks and (
            self.steps - self.released_at[seq] < self.cfg.release_grace
            or now - self.released_time[seq] < self.cfg.release_grace_s)

    def _entry_cells(self) -> int:
        """Cells of the device entries that no slot's sequence shares."""
        if self.device is None:
            return 0
        covered = self._covered()
        return sum(e.n for e in self.device.entries.values() if e not in covered)

    def _covered(self) -> set:
        return set().union(*self.cover)

    def _uncover(self, seq: int, kept: int) -> None:
        """Slot ``seq`` now holds only its first ``kept`` positions: entries longer than that are no longer its."""
        self.cover[seq] = {e for e in self.cover[seq] if e.n <= kept}

    def _cut_to_prompt(self, seq: int) -> None:
        """An idle resident keeps its prompt alone, where its caches can be cut there (``_prompt_part``)."""
        res = self.resident[seq]
        part = self._prompt_part(seq, res)
        if part is res:
            return
        try:
            self.target.seq_rm(seq, part.n)
            if self.dctx is not None:
                self.dctx.seq_rm(seq, part.n)  # the drafter's cells past n (all of them, if it started past n)
        except PydflashError as exc:
            log.info("slot %d: not cut back to its prompt: %s", seq, exc)
            self._drop_resident(seq)
            return
        self._uncover(seq, part.n)
        part.checkpoints = [c for c in res.checkpoints if c.n <= part.n]
        part.n_prompt = part.n
        self.resident[seq] = part
        self.residents_cut += 1

    def _drop_resident(self, seq: int) -> None:
        """An idle resident given up: into RAM where there is a RAM tier and no device tier (as an overwritten one
        goes), then out of both caches."""
        res, self.resident[seq] = self.resident[seq], None
        if self.ram is not None and self.device is None:
            self._to_ram(seq, res)
        self._clear(seq)
        self.residents_dropped += 1

    def _plan(self, src: Snapshot, swa_min: int, n_common: int,
              quiet: bool = False) -> tuple[int, Optional[Checkpoint]]:
        """How many leading positions of ``src`` can be reused for a prompt sharing n_common of them, and the
        checkpoint to restore first (None: trim only)."""
        # Positions past the snapshot's features (decoded while adaptive drafting had extraction paused) are
        # reused too: the target KV is exact, and the drafter's context restarts at the reuse point, as after any
        # pause (``_trim``). Re-prefilling them only to recover features would cost the whole prompt's time to
        # first token for a drafter that was not paying.
        p = n_common
        if p < self.cfg.block:
            # a shared BOS or so saves nothing, and prefilling the whole prompt keeps its batch shapes (and so
            # its float rounding) those of an uncached request
            return 0, None
        if self._swa_ok(swa_min, p):
            return p, None
        fits = [c for c in src.checkpoints if c.n <= p and self._swa_ok(c.swa_min, c.n)]
        if fits:
            best = max(fits, key=lambda c: c.n)
            return best.n, best
        if not quiet:
            self._fallback(f"the sliding window no longer holds position {max(0, p - self.n_swa + 1)} and no "
                           f"checkpoint fits", p)
        return 0, None

    def _with_context(self, seq: int, src: Snapshot, p: int, ckpt: Optional[Checkpoint],
                      lead: int) -> tuple[int, Optional[Checkpoint]]:
        """Where to reuse ``src`` (already in ``seq``) for a request about to draft. Reused past its features
        (cached while adaptive drafting had extraction paused), the drafter's context would restart at p with
        nothing before it: a request alone in an idle engine is probed right after its prompt, and a probe drafted
        blind judges the drafter by text it never saw, so a recurring prompt first sent during a pause would be
        judged blind each time it came back. So the reuse stops where the features end, or ``lead`` positions
        earlier, and those positions are prefilled again with features: what a pause's lead-in gives a probe
        (FEATURE_LEAD). Only where the sliding window allows it and it costs at most ``lead`` + a block more
        prefill."""
        f = src.features
        if f.keeps_context(p):
            return p, ckpt
        q = max(p - lead, f.context_end(p))
        q2, ckpt2 = self._plan(src, self._swa_min(seq, src.n), q, quiet=True)
        if p - q2 > lead + self.cfg.block:
            return p, ckpt  # the window holds no point near enough: restart the drafter at p (``_trim``)
        self.context_trims += 1
        return q2, ckpt2

    def _swa_ok(self, swa_min: int, p: int) -> bool:
        """The SWA layers, holding positions from swa_min, can attend for a token at position p (llama.cpp masks
        keys with p - key >= n_swa, so the token needs keys from p - n_swa + 1)."""
        return self.n_swa == 0 or swa_min <= max(0, p - self.n_swa + 1)

    def _live_swa_min(self, seq: int) -> int:
        return max(0, self.target.seq_pos_min(seq)) if self.n_swa else 0

    def _fallback(self, why: str, p: int) -> None:
        if p < self.cfg.block:
            return  # a shared BOS or so: not worth a log line
        self.fallbacks += 1
        log.info("prompt cache: not reusing %d cached positions: %s; prefilling them again", p, why)

    # --- restore and trim ---------------------------------------------------------------------------------
    def _restore(self, seq: int, snap: Snapshot) -> bool:
        """Both full states into ``seq`` (a device entry's cells shared, a RAM entry's bytes copied in), all or
        nothing; then checked against the snapshot's bookkeeping."""
        try:
            self.cover[seq] = set()
            if snap.seq >= 0:
                self.device.restore(snap, seq)
                self.cover[seq] = {snap}
            else:
                state.state_seq_set(self.target, seq, snap.target)
                if self.dctx is not None:
                    state.state_seq_set(self.dctx, seq, snap.drafter)
        except PydflashError as exc:
            self._clear(seq)
            self._fallback(f"restore refused ({exc})", snap.n)
            return False
        why = self._mismatch(seq, snap)
        if why:
            self._clear(seq)
            self._fallback(why, snap.n)
            return False
        return True

    def _mismatch(self, seq: int, snap: Snapshot) -> str:
        """Why the restored caches disagree with the snapshot's token count or feature bookkeeping ('' if not)."""
        if self.target.seq_pos_max(seq) != snap.n - 1:
            return f"target state holds {self.target.seq_pos_max(seq) + 1} positions, the snapshot {snap.n}"
        if self.dctx is not None:
            f = snap.features
            want = (-1, -1) if f.drafter_len == f.drafter_base else (f.drafter_base, f.drafter_len - 1)
            held = (self.dctx.seq_pos_min(seq), self.dctx.seq_pos_max(seq))
            if held != want:
                return f"drafter state holds positions {held}, the snapshot's bookkeeping says {want}"
        return ""

    def _trim(self, slot: Slot, src: Snapshot, p: int, ckpt: Optional[Checkpoint]) -> int:
        """Cut both caches (already holding ``src``) and the feature bookkeeping at p; returns p, or 0 when that
        fails (the caller clears both)."""
        seq, f = slot.seq, src.features
        try:
            if ckpt is not None:
                state.state_seq_set(self.target, seq, ckpt.target, state.PARTIAL)
            self.target.seq_rm(seq, p)
            self._uncover(seq, p)
            if self.dctx is not None and f.keeps_context(p):  # the drafter keeps its context up to p
                if f.drafter_len > p:
                    self.dctx.seq_rm(seq, p)
                slot.drafter_base = f.drafter_base
                slot.drafter_len = min(f.drafter_len, p)
                keep = f.positions < p
                slot.pending = [FeatureRows(f.rows[keep], f.positions[keep])] if keep.any() else []
                slot.feature_gap = False
            elif self.dctx is not None:  # features stop before p: the drafter's context restarts at p
                self.dctx.seq_rm(seq, 0)
                slot.drafter_base = slot.drafter_len = p
                slot.pending, slot.feature_gap = [], True
                self.drafter_restarts += 1
        except PydflashError as exc:
            self._fallback(f"trimming failed ({exc})", p)
            self._reset(slot)
            return 0
        slot.n_past = p
        if not self._swa_ok(self._live_swa_min(seq), p):  # belt and braces: never attend over a hole
            self._fallback(f"the sliding window starts at {self._live_swa_min(seq)} after the restore", p)
            self._reset(slot)
            return 0
        self.live_ckpts[seq] = [c for c in src.checkpoints if c.n <= p]
        return p

    def _reset(self, slot: Slot) -> None:
        slot.n_past = slot.drafter_base = slot.drafter_len = 0
        slot.pending, slot.feature_gap = [], False

    def _clear(self, seq: int) -> None:
        self.cover[seq] = set()
        self.target.seq_rm(seq, 0)
        if self.dctx is not None:
            self.dctx.seq_rm(seq, 0)

    # --- release, RAM, checkpoints --------------------------------------------------------------------
    def release(self, slot: Slot) -> None:
        """Keep a finished (or cancelled) slot's sequence resident: both caches trimmed to the tokens we know."""
        seq = slot.seq
        ckpts, self.live_ckpts[seq] = self.live_ckpts[seq], []
        self.reserved[seq] = 0
        if not (self.enabled and slot.request.cache_prompt):
            self.resident[seq] = None
            self._clear(seq)
            return
        # the KV holds prompt + committed tokens; committed past a stop (EOS, stop string, max_tokens) are unknown
        tokens = (list(slot.prompt) + list(slot.generated))[: slot.n_past]
        n = len(tokens)
        try:
            self.target.seq_rm(seq, n)
            self._uncover(seq, n)
            feats = self._features_at(slot, n)
        except PydflashError as exc:
            log.info("slot %d: not kept for reuse: %s", seq, exc)
            self.resident[seq] = None
            self._clear(seq)
            return
        self.resident[seq] = Snapshot(np.asarray(tokens, dtype=np.int32), feats,
                                      checkpoints=[c for c in ckpts if c.n <= n], recurs=self.recurs[seq],
                                      n_prompt=min(len(slot.prompt), n), talks=self.talks[seq])
        self.released_at[seq], self.released_time[seq] = self.steps, self.clock()
        self.recent.append((seq, self.resident[seq].tokens, self.resident[seq].n_prompt))
        if self.talks[seq] and (self.cfg.release_grace or self.cfg.release_grace_s):
            self.graced.add(seq)
        self._hold_to_budget()  # one request fewer running: the kept cells' share of the KV shrinks with the load

    def _features_at(self, slot: Slot, n: int) -> Features:
        """The slot's feature bookkeeping cut at n positions (the drafter KV trimmed with it)."""
        if self.dctx is None:
            return Features()
        dlen = slot.drafter_len
        if dlen > n:
            self.dctx.seq_rm(slot.seq, n)
            dlen = n
        rows = [p.array() for p in slot.pending]
        pos = np.concatenate([p.positions for p in slot.pending]) if rows else np.zeros(0, np.int32)
        rows = np.concatenate(rows) if rows else np.zeros((0, 0), np.float32)
        keep = pos < n
        f = Features(slot.drafter_base, dlen, False, rows[keep] if len(rows) else rows, pos[keep])
        f.gap = f.n_featured < n
        return f

    def _snapshot(self, seq: int, res: Snapshot) -> Snapshot:
        """Copy a resident sequence's (or a device entry's) live states out of both contexts."""
        swa_min = self._swa_min(seq, res.n)
        target = state.state_seq_get(self.target, seq)
        drafter = state.state_seq_get(self.dctx, seq) if self.dctx is not None else b""
        # checkpoints only where the full state cannot serve (before its window), else they are dead weight
        ckpts = [c for c in res.checkpoints if not self._swa_ok(swa_min, c.n)]
        return Snapshot(res.tokens.copy(), res.features, swa_min=swa_min, checkpoints=ckpts, target=target,
                        drafter=drafter, recurs=res.recurs)

    def _swa_min(self, seq: int, n: int) -> int:
        """Smallest position from which a kept sequence of n positions surely holds every SWA cell. llama.cpp may
        give a cell to another sequence once it is masked for its only owner (position <= n - n_swa), in cell order,
        not position order: such a sequence can have holes above its smallest position (seq_pos_min does not see
        them). Only the cells of [n - n_swa + 1, n) are safe, so past the window a kept sequence serves its whole
        length, not a trim back into it: the prompt-end entries and checkpoints serve those."""
        return max(self._live_swa_min(seq), n - self.n_swa + 1) if self.n_swa else 0

    def _save(self, seq: int, res: Optional[Snapshot], keep: int, protect: Optional[Snapshot] = None) -> None:
        """Keep a resident before its caches are cut to ``keep`` positions, if that loses enough: in the device tier
        where its prompt recurs (no copy; its prompt alone where it can be cut there), else in RAM where there is no
        device tier."""
        if res is None or res.n - keep < self.cfg.save_min_drop:
            return
        if self.device is not None:
            if not (res.recurs or self.cfg.keep_all):
                return
            part = self._prompt_part(seq, res)
            if part.n - keep >= self.cfg.save_min_drop:
                self._share(seq, self.device.keep(seq, part, protect, self.admissions))
            return
        if self.ram is not None:
            self._to_ram(seq, res)

    def _prompt_part(self, seq: int, res: Snapshot) -> Snapshot:
        """What of a resident the device tier keeps: its prompt, where its caches can be cut there. Recurring traffic
        comes back to a prompt, not to one answer to it, and every kept cell costs every later step's attention;
        past the SWA window the sequence serves its whole length only, so it is kept whole."""
        n = self._prompt_end(seq, res)
        return Snapshot(res.tokens[:n], res.features.cut(n), recurs=res.recurs) if n else res

    def _prompt_end(self, seq: int, res: Snapshot) -> int:
        """Where a resident's prompt ends, if its caches can be cut there (0: kept whole; see ``_prompt_part``)."""
        n = res.n_prompt
        if self.cfg.keep_answers or not 0 < n < res.n or not self._swa_ok(self._swa_min(seq, res.n), n):
            return 0
        return n

    def _spill(self, entry: Snapshot) -> None:
        """A device entry on its way out: into RAM, where there is a RAM tier (a copy out of the KV)."""
        if self.ram is not None:
            self._to_ram(entry.seq, entry)

    def _to_ram(self, seq: int, res: Snapshot) -> None:
        try:
            self.ram.put(self._snapshot(seq, res))
        except PydflashError as exc:
            log.info("slot %d: not copied to the RAM cache: %s", seq, exc)

    def after_prefill(self, slot: Slot) -> None:
        """A checkpoint at the end of the prompt: where the next turn of a chat is most likely to diverge. With a
        device tier, a device entry of the prompt (no copy), for a recurring prompt only, or for one that requests
        sharing it will reuse while it runs (``Request.share_prompt``: a resident serves only once released)."""
        if self.device is not None:
            keep = self._outgrows_window(slot) and self.recurs[slot.seq] or slot.request.share_prompt
            if keep and slot.request.cache_prompt and slot.n_past >= self.cfg.block:
                self._keep_live(slot)
            return
        ck = self.live_ckpts[slot.seq]
        if ck and ck[-1].n >= slot.n_past:
            return
        self._checkpoint(slot)

    def _keep_live(self, slot: Slot) -> None:
        """A device entry of a running slot's first n_past positions (they are all prompt), shared with it."""
        n = slot.n_past
        self._share(slot.seq, self.device.keep(slot.seq, Snapshot(np.asarray(slot.prompt[:n], dtype=np.int32),
                                                                   self._features_at(slot, n), recurs=True),
                                               admissions=self.admissions))

    def _share(self, seq: int, entry: Optional[Snapshot]) -> None:
        """A device entry just kept from slot ``seq``'s first positions: the slot holds its cells too."""
        if entry is not None:
            self.cover[seq].add(entry)

    def _outgrows_window(self, slot: Slot) -> bool:
        """Whether the sequence can run past the SWA window (then no later copy of it serves a trim to here)."""
        return self.n_swa > 0 and len(slot.prompt) + slot.request.max_tokens > self.n_swa

    def after_commit(self, slot: Slot) -> None:
        if self.device is not None:
            # state-copy checkpoints are the RAM tier's way: device entries at the branch point and the prompt's end
            if self.branch[slot.seq] and slot.n_past == self.branch[slot.seq]:
                self.branch[slot.seq] = 0
                self._keep_live(slot)
            return
        ck = self.live_ckpts[slot.seq]
        if slot.n_past - (ck[-1].n if ck else 0) >= self.cfg.checkpoint_every:
            self._checkpoint(slot)

    def _checkpoint(self, slot: Slot) -> None:
        if not (self.enabled and self.n_swa and self.cfg.checkpoint_every and self.cfg.max_checkpoints):
            return
        if not slot.request.cache_prompt or slot.n_past == 0:
            return
        if not self._outgrows_window(slot):
            # the sequence can never outgrow the window, so every snapshot of it keeps all its SWA cells and serves
            # any prefix without one. Skipping matters on a GPU: a PARTIAL state read of one sequence among 16
            # interleaved ones is thousands of small device-to-host copies (~70 ms on an H200, docs/benchmarks.md)
            return
        seq, n = slot.seq, slot.n_past
        data = state.state_seq_get(self.target, seq, state.PARTIAL)
        ck = self.live_ckpts[seq]
        ck.append(Checkpoint(n, self._swa_min(seq, n), data))
        del ck[: max(0, len(ck) - self.cfg.max_checkpoints)]

    # --- slot files -----------------------------------------------------------------------------------
    def save_slot(self, seq: int, path) -> dict:
        res = self._idle_resident(seq)
        if res is None:
            raise InvalidRequest(f"slot {seq} holds no prompt to save")
        n_bytes = slotfile.write(path, self._snapshot(seq, res), self.digests)
        return {"id_slot": seq, "n_saved": res.n, "n_written": n_bytes}

    def restore_slot(self, seq: int, path) -> dict:
        """Load a slot file into an idle slot, all or nothing: on any refusal the slot is left empty (and usable)."""
        self._idle_resident(seq)
        snap = slotfile.read(path, self.digests)  # CacheFileError before any state reaches a context
        if self.dctx is None and snap.drafter:
            raise CacheFileError("slot file carries a drafter state but this engine has no drafter")
        self.resident[seq] = None
        self.live_ckpts[seq] = []
        if not self._restore(seq, snap):
            raise CacheFileError("slot file state refused by llama.cpp or inconsistent with its bookkeeping")
        self.resident[seq] = Snapshot(snap.tokens, snap.features, checkpoints=snap.checkpoints)
        return {"id_slot": seq, "n_restored": snap.n}

    def erase_slot(self, seq: int) -> dict:
        """Drop an idle slot's kept sequence from both contexts (and its checkpoints)."""
        res = self._idle_resident(seq)
        self.resident[seq] = None
        self.live_ckpts[seq] = []
        self._clear(seq)
        # erased means forgotten: the conversation check keeps nothing released from this slot either
        self.recent = deque((r for r in self.recent if r[0] != seq), maxlen=self.recent.maxlen)
        return {"id_slot": seq, "n_erased": res.n if res is not None else 0}

    def _idle_resident(self, seq: int) -> Optional[Snapshot]:
        if not 0 <= seq < len(self.resident):
            raise InvalidRequest(f"no slot {seq}")
        if self.busy(seq):
            raise InvalidRequest(f"slot {seq} is busy")
        return self.resident[seq]

    def kept_now(self) -> tuple[int, int, int]:
        """(idle residents, their cells, device-entry cells no slot shares): what the KV holds beside the running
        requests at this moment, which every step's attention spans in a unified KV (the step trace records it)."""
        idle = [r.n for seq, r in enumerate(self.resident) if r is not None and not self.busy(seq)]
        return len(idle), sum(idle), self._entry_cells()

    def metrics(self) -> dict:
        out = {"n_reused_tokens": self.n_reused, "fallbacks": self.fallbacks, "drafter_restarts": self.drafter_restarts,
               "context_trims": self.context_trims,
               "resident_tokens": sum(r.n for r in self.resident if r is not None),
               "residents_cut": self.residents_cut, "residents_dropped": self.residents_dropped}
        if self.device is not None:
            out["device"] = self.device.metrics()
        if self.ram is not None:
            out["ram"] = self.ram.metrics()
        return out
