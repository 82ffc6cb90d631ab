"""The step engine: many concurrent requests ("slots"), one DFlash transaction per step.

    step():  admit -> plan drafts -> propose (one drafter forward; where a slot's text repeats itself, a chain
             copied from it may replace its block, lookup.py, or stand where the plan gave it none, copies.py)
             -> verify (one target forward, which also carries the next prompt chunk of slots still prefilling)
             -> accept + commit / rollback per slot

Chunked prefill: admission only assigns a slot. Its prompt goes through the target in chunks of at most
``n_batch`` tokens, one chunk per step, in the same forward as the other slots' verify spans, so a long prompt
never freezes the running streams. A slot drafts and verifies from the step after its last chunk.

Threading: an Engine is single-threaded (one owner calls submit / step / cancel); ``api.LLM`` adds the lock.

Terms (draft block, anchor, accepted, bonus, commit, rollback, target features) are defined in ``accept.py``.
"""

from __future__ import annotations

import functools
import itertools
import logging
import random
import time
from collections import deque
from typing import Callable, Iterable, Optional, Sequence

import numpy as np

from ..cache.config import CacheConfig
from ..config import EngineConfig
from ..errors import ContextOverflow, EngineClosed, InvalidRequest, InvariantError
from ..native import Context, ContextParams, spare, state
from ..native.handles import LLAMA_MAX_SEQ
from ..native.grammar import Grammar
from ..pair import Pair
from . import adaptive, lookup, prefix, proposal, rejection
from .copies import CopyPolicy
from .costs import StepCosts
from .accept import commit_tokens, greedy_accept, synthetic_accept, synthetic_rate
from .controlled import HostSampler
from .drafter import NO_COST, Drafter, ProposeCost
from .prefix import PromptCache
from .request import Event, Request, Result
from .slot import Slot
from .stats import Stats
from .text import TextStream
from .trace import StepTrace
from .verifier import Verifier
from .warmup import warm_up

log = logging.getLogger(__name__)


# ggml-cpu's flash attention takes a tiled kernel from this many query rows of one forward on (GGML_FA_TILE_Q), and
# the two kernels round differently: on an AVX2 host a row's logits moved by up to 2 nats between a 63- and a
# 64-row forward of Gemma-3-270M, enough to flip greedy picks that are no near-tie. Plain decoding runs 1 row per
# slot, so a CPU target forward is cut into ubatches below the switch: a verify then rounds as decoding does.
CPU_FA_TILE_ROWS = 64


def target_ubatch(config: EngineConfig, n_batch: int) -> int:
    n = min(config.n_ubatch, n_batch)
    on_cpu = config.n_gpu_layers == 0 and not config.rpc
    return min(n, CPU_FA_TILE_ROWS - 1) if on_cpu else n


class Engine:
    # EngineConfig is a frozen dataclass of immutable fields, so one default instance shared by all engines is safe
    def __init__(
        self, pair: Pair, config: EngineConfig = EngineConfig(), cache: Optional[CacheConfig] = None  # noqa: B008
    ):
        self.pair = pair
        self.config = config
        self.model = pair.target
        self.block_size = pair.block_size if pair.drafter is not None else 0
        self.default_draft = self._clamp_draft(config.draft_max)
        spec = pair.drafter is not None and (self.default_draft > 0 or config.adaptive)
        if not config.kv_unified and pair.drafter is not None:
            raise ValueError("kv_unified=False (a KV stream per slot) is for plain decoding: load no drafter")
        span = max(self.block_size, 1)  # most positions a slot verifies in one step: anchor + drafts
        n_batch = max(config.n_batch, config.n_slots * span)
        n_ctx = config.n_slots * config.n_ctx_slot
        cache = cache or CacheConfig()
        n_spare = prefix.spare_ids(pair, config, cache)  # sequence ids of the prompt cache's device tier
        # a drafting SWA target needs one more id, after the device tier's: the verifier's window guard
        n_swa = state.n_swa(pair.target) if spec and config.kv_unified else 0
        if n_swa:
            n_spare = min(n_spare, LLAMA_MAX_SEQ - config.n_slots - 1)
        self.target_ctx = Context(
            pair.target,
            ContextParams(
                n_ctx=n_ctx, n_batch=n_batch, n_ubatch=target_ubatch(config, n_batch), n_seq_max=config.n_slots,
                n_outputs_max=config.n_slots * span, n_outputs_max_per_seq=span,
                n_threads=config.n_threads, feature_layers=tuple(pair.feature_layers) if spec else (),
                kv_unified=config.kv_unified, n_seq_spare=n_spare + (n_swa > 0),
            ),
        )
        self.verifier = Verifier(self.target_ctx, with_features=spec,
                                 window_guard=(config.n_slots + n_spare, n_swa) if n_swa else None)
        self.drafter: Optional[Drafter] = None
        if spec:
            # non-causal batches must fit one ubatch: the whole noise batch and every injection chunk
            n_ub = max(config.n_ubatch, config.n_slots * self.block_size)
            dctx = Context(
                pair.drafter,
                ContextParams(n_ctx=n_ctx, n_batch=n_ub, n_ubatch=n_ub, n_seq_max=config.n_slots,
                              n_outputs_max=config.n_slots * span, n_outputs_max_per_seq=span,
                              n_threads=config.n_threads, n_seq_spare=n_spare, spare_sched=spare.for_drafter()),
                ctx_other=self.target_ctx,
                causal=False,
            )
            self.drafter = Drafter(dctx, self.block_size, pair.mask_token)
        self.closed = False
        self.slots: list[Optional[Slot]] = [None] * config.n_slots
        self._admissions = itertools.count()  # admission order: the oldest prefilling slot gets the batch first
        self.queue: deque[tuple[Request, list[int]]] = deque()
        self.stats = Stats()
        # step costs, engine-wide acceptance, the shared pause; CPU steps need no warm-up sample dropped
        self.drafting = adaptive.DraftPolicy(StepCosts(drop_first=config.n_gpu_layers != 0))
        self.rng = random.Random(config.seed)
        self.synth_p = None
        # copied chains (lookup.py) where a drafter drafts for real: synthetic acceptance ignores what is drafted
        self._looks_up = config.lookup and self.drafter is not None and config.synth_len is None
        # copies where the plan drafts nothing (copies.py): they need the adaptive policy's cost curves
        self.copies = CopyPolicy(self.drafting.costs) if self._looks_up and config.adaptive else None
        self.drafter_restarts = 0  # drafter contexts started over after a feature gap (see _keep_features)
        if config.synth_len is not None:
            if self.drafter is None:
                raise ValueError("synthetic acceptance needs a drafter and draft_max > 0")
            self.synth_p = synthetic_rate(config.synth_len, self.default_draft)
        # prefix reuse: slots, device and RAM tiers
        self.prompt_cache = PromptCache(self.target_ctx, self.drafter.ctx if self.drafter else None, pair, config,
                                        cache, n_spare, self.block_size, busy=lambda seq: self.slots[seq] is not None,
                                        check=self._check if config.check_invariants else None)
        self._rngs: dict[int, random.Random] = {}  # slot seq -> its request's host stream (rejection sampling)
        # The owner's hook right before each step's target forward (the server delivers the last step's events
        # there, see server/engine_thread.py); None: nothing
        self.before_verify: Optional[Callable[[], None]] = None
        self.trace = StepTrace.from_env()  # PYDFLASH_STEP_TRACE: a JSON line per step (trace.py)
        self.first_why = ""  # the last step's stand-in decision (_copy_first), for the trace
        self.warm_up_s = 0.0
        if config.warm_up if config.warm_up is not None else config.n_gpu_layers != 0:
            self.warm_up_s = warm_up(self.target_ctx, self.drafter.ctx if self.drafter else None, config.n_slots,
                                     span, self.block_size, max(self.model.bos, 0))

    # --- requests -------------------------------------------------------------------------------------
    def _clamp_draft(self, k: Optional[int]) -> int:
        if self.block_size == 0:
            return 0
        return self.block_size - 1 if k is None else min(k, self.block_size - 1)

    def tokenize(self, req: Request) -> list[int]:
        self._check_open()
        if isinstance(req.prompt, str):
            if not req.prompt:
                raise InvalidRequest("empty prompt")
            return self.model.tokenize(req.prompt, add_special=req.add_special, parse_special=req.parse_special)
        return [int(t) for t in req.prompt]

    def prepare(self, req: Request) -> list[int]:
        """Check that a request can run here and return its prompt tokens; raises InvalidRequest / ContextOverflow.
        Nothing is queued."""
        if not isinstance(req, Request):
            raise InvalidRequest(f"expected a Request, got {type(req).__name__}")
        tokens = self.tokenize(req)
        if not tokens:
            raise InvalidRequest("empty prompt")
        n_vocab = self.model.n_vocab
        bad = [t for t in tokens if not 0 <= t < n_vocab]
        if bad:
            raise InvalidRequest(f"token id {bad[0]} outside the vocabulary [0, {n_vocab})")
        need = len(tokens) + req.max_tokens + self.block_size
        if need > self.config.n_ctx_slot:
            raise ContextOverflow(
                f"prompt ({len(tokens)}) + max_tokens ({req.max_tokens}) + draft block ({self.block_size}) = {need} "
                f"exceeds the slot context ({self.config.n_ctx_slot})"
            )
        if self.is_live(req.id):
            raise InvalidRequest(f"request {req.id} is already queued or running")
        self._check_controls(req)
        return tokens

    def _check_controls(self, req: Request) -> None:
        """What only the model can tell: logit_bias ids inside its vocabulary, a grammar llama.cpp can parse."""
        n_vocab = self.model.n_vocab
        bad = next((t for t, _ in req._bias if t >= n_vocab), None)
        if bad is not None:
            raise InvalidRequest(f"logit_bias: token id {bad} outside the vocabulary [0, {n_vocab})")
        if req._gbnf is not None:
            Grammar.parse(self.model, req._gbnf, "grammar" if req.grammar is not None else "json_schema").close()

    def submit(self, req: Request) -> int:
        """Validate and queue a request; raises InvalidRequest / ContextOverflow before any decoding."""
        self.queue.append((req, self.prepare(req)))
        return req.id

    def submit_all(self, requests: Iterable[Request]) -> list[int]:
        """Validate every request, then queue them all: one bad request queues none of them."""
        reqs = list(requests)
        ids = [r.id for r in reqs if isinstance(r, Request)]
        if len(set(ids)) != len(ids):
            raise InvalidRequest("the same request was given twice")
        prepared = [(r, self.prepare(r)) for r in reqs]
        self.queue.extend(prepared)
        return ids

    def cancel(self, request_id: int) -> bool:
        """Drop a queued or running request (its slot is freed at once); False if it is neither."""
        for i, (req, _) in enumerate(self.queue):
            if req.id == request_id:
                del self.queue[i]
                return True
        for slot in self.slots:
            if slot is not None and slot.request.id == request_id:
                self._release(slot)
                return True
        return False

    def is_live(self, request_id: int) -> bool:
        """Whether a request is queued or in a slot (it will still produce events)."""
        return any(req.id == request_id for req, _ in self.queue) or any(
            s is not None and s.request.id == request_id for s in self.slots)

    @property
    def has_work(self) -> bool:
        return bool(self.queue) or any(s is not None for s in self.slots)

    # --- the step -------------------------------------------------------------------------------------
    def step(self) -> list[Event]:
        """One transaction for every slot; returns an event for each running request (none while prefilling)."""
        self._check_open()
        self._admit()
        active = [s for s in self.slots if s is not None]
        if not active:
            return []
        self.prompt_cache.tick()
        clock = self._clock()
        running = [s for s in active if s.prefilled]
        prefilling = sorted((s for s in active if not s.prefilled), key=lambda s: s.admitted)
        plan, features = self._schedule(running)                                            # schedule
        plan = self._copy_first(plan)                                                        # (or copy, no drafter)
        chunks = self._prefill_chunks(plan, prefilling)
        self._extract_features_if_needed(plan, chunks, features, len(active))
        drafts = self._propose(plan, prefilling)                                             # propose
        others = self._copy_where_better(plan, drafts)                                       # (or copy)
        copied = self._copy_where_idle(plan, drafts, chunks)
        self._trim_to_max_tokens(running, drafts)
        self._settle_features(active)
        self._before_verify()
        verdicts = self.verifier.verify([(s, drafts.get(s.seq, [])) for s in running], chunks,  # verify (+ prefill)
                                        during=self._while_verifying)
        for slot, chunk in chunks:
            self._prefilled(slot, len(chunk), *verdicts[slot.seq])
        t_commit = time.perf_counter()
        events = [self._commit(s, drafts.get(s.seq, []), *verdicts[s.seq], others.get(s.seq),  # accept + commit
                               s.seq in copied) for s in running]
        self._account(plan, prefilling, clock, time.perf_counter() - t_commit, sum(copied.values()), events)
        return events

    def _propose(self, plan: list[tuple[Slot, int]], prefilling: list[Slot]) -> dict[int, list[int]]:
        """The drafter's part: pending features injected, draft blocks; the last step's target rollbacks are made
        while the block forward runs on the device. A paused step with extraction off has nothing for it (no slot
        drafts, and pending rows only grow in steps with features, which do come here and keep them under
        MAX_PENDING_ROWS): skipped, as most of a paused engine's steps are."""
        if self.drafter is None:
            return {}
        if not self.target_ctx.features_on and not any(k for _, k in plan):
            self.drafter.last_cost = NO_COST
            return {}
        return self.drafter.propose(plan + [(s, 0) for s in prefilling], during=self.target_ctx.flush_rollbacks)

    def _copy_first(self, plan: list[tuple[Slot, int]]) -> list[tuple[Slot, int]]:
        """The plan with no drafts where every slot it drafts for would verify a copy of its own text anyway
        (copies.CopyPolicy.first): the drafter's forward is skipped, and _copy_where_idle gives those slots their
        copies. Target features stay as scheduled, so the drafter's context has no gap when drafting resumes."""
        drafting = [(slot, k) for slot, k in plan if k]
        self.first_why = ""  # for the step trace: what kept the drafter's forward, or "copy" where copies stood in
        if self.copies is None or not drafting:
            return plan
        if not self.drafting.regular:  # a probe or calibration measures the drafter's block
            self.first_why = "irregular"
            return plan
        stand_in = self.copies.first([(slot.copies, slot.copy_edge, slot.history, k) for slot, k in drafting])
        self.first_why = self.copies.why
        if not stand_in:
            return plan
        self.drafting.blocks_replaced()
        return [(slot, 0) for slot, _ in plan]

    def _copy_where_better(self, plan: list[tuple[Slot, int]],
                           drafts: dict[int, list[int]]) -> dict[int, tuple[list[int], bool]]:
        """Swap a drafting slot's block for a continuation copied from its own text where lookup.choose prefers it
        (the drafter does not copy text seen once). Returns, for each slot that had a candidate copy, the chain not
        verified and whether the verified one is the copy."""
        others = {}
        for slot, k in plan:
            if k and slot.history is not None:
                drafts[slot.seq], other, is_copy = lookup.choose(drafts.get(slot.seq, []), slot.history, k,
                                                                 slot.copy_edge)
                if other is not None:
                    others[slot.seq] = (other, is_copy)
        return others

    def _copy_where_idle(self, plan: list[tuple[Slot, int]], drafts: dict[int, list[int]],
                         chunks: list[tuple[Slot, list[int]]]) -> dict[int, int]:
        """Give a slot the plan left without drafts the chain copied from its own text, where that text repeats and
        copying pays at plain decoding's rate (copies.py), in what the target batch has left after the verify spans
        and the prompt chunks (a prompt is never held up by a copy), the step's batch a multiple of copies.SHAPE_STEP
        tokens (graphs are reused per batch size). Returns the copying slots' seqs and copy lengths."""
        if self.copies is None:
            return {}
        found = [(slot, chain) for slot, k in plan if not k
                 for chain in (self.copies.candidate(slot.copies, slot.history, slot.draft_room),) if chain]
        if not found:
            return {}
        ks = self.copies.choose(len(plan), [(slot.copies, len(chain)) for slot, chain in found],
                                self.target_ctx.features_on)
        base = sum(1 + len(drafts.get(slot.seq, ())) for slot, _ in plan) + sum(len(chunk) for _, chunk in chunks)
        room = capacity = self.target_ctx.params.n_batch - base  # what the batch has left for copies
        for i, k in enumerate(ks):  # in order, as far as the room goes
            ks[i] = max(0, min(k, room))
            room -= ks[i]
        ks = self.copies.fit_shape(base, ks, [len(chain) for _, chain in found], capacity)
        copied = {}
        for (slot, chain), k in zip(found, ks):
            if k > 0:
                drafts[slot.seq] = chain[:k]
                copied[slot.seq] = k
        return copied

    @staticmethod
    def _trim_to_max_tokens(running: list[Slot], drafts: dict[int, list[int]]) -> None:
        """Drafts past what max_tokens lets out are not verified: they would be cut after the verify (llama-server
        caps its drafts the same way), and counted as accepted. Only the verify span is cut: a DFlash block is
        non-causal, so its first drafts depend on its length, and a shorter block drafts worse (on the frozen set,
        blocks shortened at each request's end cost code 3.69 -> 3.66)."""
        for slot in running:
            d = drafts.get(slot.seq)
            if d and len(d) > slot.draft_room:
                drafts[slot.seq] = d[: slot.draft_room]

    def _settle_features(self, active: list[Slot]) -> None:
        """Feature rows a slot keeps pending past this step (it did not inject them) are still in the target's
        buffers, which the verify forward overwrites: copied out first. A drafting slot injected its rows straight
        from those buffers (``LayerRows``), so in a drafting engine there is nothing to copy."""
        if self.drafter is not None:
            for slot in active:
                slot.settle_pending()

    def _while_verifying(self) -> None:
        """Host work that needs nothing of the verify, done while the device runs it: the drafter's noise blocks
        leave its KV (they must before its next forward)."""
        if self.drafter is not None:
            self.drafter.drop_blocks()

    def _before_verify(self) -> None:
        """The target forward is a step's longest native call, and the GIL is free while it runs: work another
        thread does then (the server's streams) does not hold this thread up."""
        if self.before_verify is not None:
            self.before_verify()

    def _prefill_chunks(self, plan: list[tuple[Slot, int]], prefilling: list[Slot]) -> list[tuple[Slot, list[int]]]:
        """The next prompt chunk of each prefilling slot, oldest admission first, in what the target batch has
        left after the verify spans (each at most n_batch tokens). Spans take at most (n_slots - 1) x block when
        a slot is prefilling and the target's n_batch is >= n_slots x block, so the oldest always progresses."""
        room = self.target_ctx.params.n_batch - sum(1 + k for _, k in plan)
        chunks = []
        for slot in prefilling:
            n = min(len(slot.prefill), room, self.config.n_batch)
            end = self.prompt_cache.chunk_end(slot)  # a chunk ends where the prompt cache keeps a prefix
            if end is not None:
                n = min(n, end - slot.n_past)
            if n <= 0:
                break
            chunks.append((slot, slot.prefill[:n]))
            room -= n
        return chunks

    def _prefilled(self, slot: Slot, n: int, _picks, rows, pos0: int) -> None:
        """n more prompt tokens of a prefilling slot are in the target KV (their features queued for the drafter)."""
        if self.drafter is not None:
            self._keep_features(slot, rows, pos0, n)
        slot.n_past = pos0 + n
        del slot.prefill[:n]
        self.prompt_cache.after_commit(slot)  # SWA checkpoints every CacheConfig.checkpoint_every positions
        if slot.prefilled:
            self.prompt_cache.after_prefill(slot)  # and one at the end of the prompt

    def _schedule(self, running: list[Slot]) -> tuple[list[tuple[Slot, int]], bool]:
        """Drafts per running slot (chosen for all slots together when adaptive), and whether they need target
        features this step (each slot's ``keeps_features``: in a pause's lead-in only the probing slots')."""
        if self.drafter is None:
            return [(s, 0) for s in running], False
        if not self.config.adaptive:
            return [(s, s.draft_max) for s in running], True
        if any(s.draft_max for s in running) and self.drafting.paused_step(len(running)):
            for s in running:  # what a plan without ``keep`` says
                s.keeps_features = True
            return [(s, 0) for s in running], False
        plan = self.drafting.plan([(s.policy, s.draft_max) for s in running])
        for s, kept in zip(running, plan.keep or itertools.repeat(True)):
            s.keeps_features = kept
        return list(zip(running, plan.drafts)), plan.features

    def _extract_features_if_needed(self, plan: list[tuple[Slot, int]], chunks: list, features: bool,
                                    n_active: int) -> None:
        """Target features are needed this step if the schedule says so (drafting, or a probe is near), or a prompt
        chunk goes through while new slots are likely to draft at the engine's load (n_active slots, prefilling
        ones included); a slot left without them records a gap, and its drafter context restarts where they
        resume (``_keep_features``)."""
        if self.drafter is None:
            return
        need = features or (bool(chunks) and (not self.config.adaptive or self.drafting.expects_drafting(n_active)))
        self.target_ctx.set_features(need)
        for slot, k in plan:
            if k > 0 and slot.feature_gap:  # drafting before any feature resumed (rare): start from no context
                self._restart_drafter(slot, slot.n_past)

    def _keep_features(self, slot: Slot, rows, pos0: int, n: int) -> None:
        """Queue the features of the n committed positions from pos0 for the drafter."""
        if rows is None:
            slot.skip_features()
            return
        if slot.feature_gap:
            self._restart_drafter(slot, pos0)
        slot.add_features(rows.sub(0, n), np.arange(pos0, pos0 + n, dtype=np.int32))

    def _restart_drafter(self, slot: Slot, pos: int) -> None:
        log.debug("slot %d: drafter context restarts at position %d after a feature gap", slot.seq, pos)
        self.drafter_restarts += 1
        self.drafter.ctx.seq_rm(slot.seq, 0)
        slot.restart_features(pos)

    def _commit(self, slot: Slot, drafts: list[int], picks: list[int], rows, pos0: int,
                other: Optional[tuple[list[int], bool]] = None, copy_only: bool = False) -> Event:
        """other: where the slot had a candidate copy (lookup.py), the chain not verified and whether the verified
        one was the copy; copy_only: the drafts are a copy the plan did not ask for (copies.py)."""
        k = len(drafts)
        m, committed = self._accept(slot, drafts, picks)
        m_drafter = m  # what the drafter's block earned: adaptive drafting sizes blocks by it
        n_tested = k  # how many of the block's drafts the target's picks tested
        copied = copy_only  # whether the verified chain is a copy
        if other is not None:  # score the unverified chain on the target's picks
            chain, copied = other
            m_other = lookup.would_accept(chain, drafts, picks, m)
            m_copy, m_drafter = (m, m_other) if copied else (m_other, m)
            slot.copy_edge.observe(m_copy, m_drafter)
            if copied and m_other > m:
                # the block held the bonus too: accepted through it, untested past it (the target's picks end
                # there). Counted as a rejection after it, this lower bound taught adaptive drafting that the
                # drafter fails wherever copies go in (a perfect block shrank to 4 drafts: test_lookup.py)
                n_tested = m_other
        if copied:
            slot.stats.n_lookup_steps += 1
            slot.stats.n_lookup_accepted += m
        if copy_only:  # what copies earn teaches copies, never the drafter's evidence
            self.copies.observe(slot.copies, k, m)
        self.target_ctx.accept(slot.seq, committed)
        if m < k:  # rollback: the target wrote [pos0, pos0 + k]; keep up to the last accepted draft (made during
            self.target_ctx.seq_rm_later(slot.seq, pos0 + m + 1)  # the next drafter forward, or before any KV use)
        if self.drafter is not None:
            rows = rows if slot.keeps_features else None
            self._keep_features(slot, rows, pos0, m + 1)
            slot.stats.n_feature_steps += rows is not None
        slot.n_past = pos0 + m + 1
        slot.anchor = committed[-1]
        new_tokens, text = self._emit(slot, committed)
        if slot.history is not None:
            slot.history.extend(new_tokens)
        slot.stats.record_step(k, m, len(new_tokens))
        if self.config.adaptive and not copy_only:
            self.drafting.observe(slot.policy, n_tested, m_drafter)
        if self.config.check_invariants:
            self._check(slot)
        self.prompt_cache.after_commit(slot)  # an SWA checkpoint every CacheConfig.checkpoint_every positions
        if slot.finish_reason is None:
            return Event(slot.request.id, text, new_tokens)
        text += slot.text.finish()
        if slot.text.stopped:  # the flush completed a stop string (TextStream.finish)
            slot.finish_reason = "stop"
        result = Result(slot.request.id, slot.text.text, list(slot.generated), slot.finish_reason, slot.stats,
                        synthetic=self.synth_p is not None)
        self._release(slot)
        return Event(slot.request.id, text, new_tokens, finished=True, result=result)

    def _accept(self, slot: Slot, drafts: list[int], picks: list[int]) -> tuple[int, list[int]]:
        """Accepted count and committed tokens. Greedy and sample-and-match keep the drafts equal to the target's
        picks (its argmax, or its samples); rejection sampling compares the drafter's q with the target's p."""
        k = len(drafts)
        if slot.host is not None:  # picks drawn on the host from the target's logits rows (controlled.py)
            return slot.host.commit(drafts, lambda i: self.verifier.logits(slot.seq, i))
        if self.synth_p is not None and k:
            m = synthetic_accept(k, self.synth_p, self.rng)
        elif k and slot.request.rejection:
            return self._rejection(slot, drafts, picks)
        else:  # picks are the target's argmax, or its samples when the request samples (see Request)
            m = greedy_accept(drafts, picks)
        return m, commit_tokens(drafts, picks, m)

    def _rejection(self, slot: Slot, drafts: list[int], picks: list[int]) -> tuple[int, list[int]]:
        """Rejection sampling over the block (rejection.py) from the proposal the slot drafted with (proposal.py).
        p and q are read from llama.cpp's backend-sampled probabilities (already on the host); a vocabulary-sized
        vector is built only at a rejected row, and for row 0's acceptance rates."""
        seq, n_vocab = slot.seq, self.model.n_vocab
        # each row read once: a read checks the row (O(vocabulary) for a top-p row), and rows are read again for
        # the whole row (a rejection) and for row 0's rates
        p = functools.lru_cache(maxsize=None)(lambda i: self.verifier.p(seq, i))
        q = functools.lru_cache(maxsize=None)(lambda i: self.drafter.q(seq, i))
        if slot.proposal.argmax:  # a point-mass proposal: the rule reduces to sample-and-match
            m = greedy_accept(drafts, picks)
            out = m, commit_tokens(drafts, picks, m)
        else:
            out = rejection.speculative_commit(
                drafts, picks,  # picks: the target chain's own samples; the last is the bonus
                p_of=lambda i: rejection.prob_of(p(i), drafts[i]),
                q_of=lambda i: rejection.prob_of(q(i), drafts[i]),
                rows=lambda i: (rejection.dense(p(i), n_vocab), rejection.dense(q(i), n_vocab)),
                rng=self._rngs[seq],
            )
        slot.proposal.observe(proposal.row0_rates(p(0), q(0), n_vocab))
        return out

    def _emit(self, slot: Slot, committed: list[int]) -> tuple[list[int], str]:
        """Append committed tokens until EOS, a stop string or max_tokens; nothing past them is emitted."""
        req = slot.request
        if not slot.text.stops:  # the cut is known from the tokens alone: the block's text is decoded in one go
            out = committed[: req.max_tokens - len(slot.generated)]
            if not req.ignore_eos:
                eog = next((i for i, tok in enumerate(out) if self.model.is_eog(tok)), None)
                if eog is not None:
                    out, slot.finish_reason = out[:eog], "stop"
            slot.generated += out
            if slot.finish_reason is None and len(slot.generated) >= req.max_tokens:
                slot.finish_reason = "length"
            return out, slot.text.push(b"".join(map(self.model.token_to_piece, out))) if out else ""
        out, text = [], ""
        for tok in committed:
            if not req.ignore_eos and self.model.is_eog(tok):
                slot.finish_reason = "stop"
                break
            out.append(tok)
            slot.generated.append(tok)
            text += slot.text.push(self.model.token_to_piece(tok))
            if slot.text.stopped:
                slot.finish_reason = "stop"
                break
            if len(slot.generated) >= req.max_tokens:
                slot.finish_reason = "length"
                break
        return out, text

    def _check(self, slot: Slot) -> None:
        """rows == committed positions, and target/drafter aligned on them."""
        if self.target_ctx.seq_pos_max(slot.seq) != slot.n_past - 1:
            raise InvariantError(
                f"slot {slot.seq}: target KV ends at {self.target_ctx.seq_pos_max(slot.seq)}, "
                f"expected {slot.n_past - 1}"
            )
        if self.drafter is not None:
            featured = slot.n_featured
            if featured > slot.n_past or (featured != slot.n_past and not slot.feature_gap):
                raise InvariantError(
                    f"slot {slot.seq}: feature rows end at {featured} (injected up to {slot.drafter_len}, "
                    f"{slot.n_pending} pending) but {slot.n_past} positions are committed"
                )
            # two native calls per slot in every step, though the drafter KV changes only when it drafts or takes
            # features: with drafting paused at 16 slots, part of the ~80 us a step this change saved on a CPU host
            # (~1 % of a GPU step). Skip the query while neither the drafter context (no write since) nor this
            # slot's expectation moved: the answer would be the same
            ctx = self.drafter.ctx
            seen = (ctx.n_writes, ctx.seq_writes.get(slot.seq, 0), slot.drafter_base, slot.drafter_len)
            if seen == slot.drafter_checked:
                return
            empty = slot.drafter_len == slot.drafter_base
            span = (-1, -1) if empty else (slot.drafter_base, slot.drafter_len - 1)
            held = (self.drafter.ctx.seq_pos_min(slot.seq), self.drafter.ctx.seq_pos_max(slot.seq))
            if held != span:
                raise InvariantError(f"slot {slot.seq}: drafter KV holds positions {held}, expected {span}")
            slot.drafter_checked = seen

    def _clock(self) -> tuple[float, float, float]:
        dn = self.drafter.ctx.t_native if self.drafter else 0.0
        return time.perf_counter(), dn, self.target_ctx.t_native

    def _account(self, plan: list[tuple[Slot, int]], prefilling: list[Slot], clock, t_commit: float,
                 n_copied: int = 0, events: Sequence[Event] = ()) -> None:
        """Split the step: draft = drafter native time, verify = target forward, commit = accept/rollback/emit,
        host = the rest (batch building, feature copies, Python bookkeeping). A slot still prefilling counts the
        whole step as prefill time. Adaptive drafting learns its cost curves from the decode-only steps.
        n_copied: verify tokens copied where the plan drafted nothing (copies.py); events: the running slots'
        (the trace records what each emitted, so that a step's worth shows beside its cost)."""
        t0, dn0, tn0 = clock
        now, dn1, tn1 = self._clock()
        total = now - t0
        t_draft, t_verify = dn1 - dn0, tn1 - tn0
        split = (t_draft, t_verify, t_commit, max(0.0, total - t_draft - t_verify - t_commit))
        for slot in prefilling:
            slot.stats.t_prefill += total
        if self.config.adaptive and self.drafter is not None and plan and not prefilling:
            self._observe_costs(plan, total, n_copied)
        for st in [s.stats for s, _ in plan] + [self.stats]:
            st.t_draft += split[0]
            st.t_verify += split[1]
            st.t_commit += split[2]
            st.t_host += split[3]
        if self.trace is not None:
            pol = self.drafting
            self.trace.write(t=round(t0, 6), n=len(plan), prefilling=len(prefilling), ks=[k for _, k in plan],
                             copied=n_copied, features=self.target_ctx.features_on, s=round(total, 6),
                             split=[round(x, 6) for x in split], predicted=pol.predicted,
                             overhead=round(pol.overhead_at(len(plan)), 3) if plan else None, pause=pol.pause,
                             first=self.first_why, emitted=[len(e.tokens) for e in events],
                             kept=list(self.prompt_cache.kept_now()))

    def _observe_costs(self, plan: list[tuple[Slot, int]], total: float, n_copied: int = 0) -> None:
        """Teach adaptive drafting this decode step's measured cost: the drafter's part (its injection and block
        forward, host work included) is D's, everything else scales with the verify tokens and is V's (costs.py).
        A step with copies is always taught: copies choose their length by the verify curve's longer shapes."""
        if not self.drafting.samples_costs() and not n_copied:  # most of a long pause's steps (PAUSED_SAMPLE_EVERY)
            return
        cost = self.drafter.last_cost
        self._teach_costs(plan, total - cost.inject_s - cost.block_s, cost, n_copied)

    def _teach_costs(self, plan: list[tuple[Slot, int]], t_verify: float, cost: ProposeCost,
                     n_copied: int = 0) -> None:
        """One decode step's V and D for the policy's cost curves (a replay with modelled costs can pass its own).

        A drafting slot injects what it committed since it last drafted: at most a block per step while it keeps
        drafting. More is catch-up, the feature rows of the steps it sat out (a probe after a pause, the first draft
        after a prompt): a one-off that a drafting step does not repeat. Counted in D, it made each probe, the only
        drafting a paused engine does, look dearer than drafting is, and so the next pause longer. In
        a replay with the H200's costs (1 slot, 4 requests) it cost 1.64x -> 1.45x modelled while the
        whole block went unmeasured; with the block measured in calibration (``adaptive``) the two rules model alike
        (1.62x / 1.63x). A catch-up step teaches D its block forward only."""
        drafting = [k for _, k in plan if k]
        steady = cost.rows <= self.block_size * len(drafting)
        t_draft = cost.inject_s + cost.block_s if steady else cost.block_s
        n_verify, n_block = sum(1 + k for _, k in plan) + n_copied, sum(1 + k for k in drafting)
        kept = self.drafting.costs.observe(len(plan), n_verify, self.target_ctx.features_on, t_verify, n_block,
                                           t_draft, self.drafting.costs_are_upper_bounds())
        # the whole step against what the curves predicted for it (adaptive: realized against modelled); copies'
        # verify tokens were not in the prediction
        self.drafting.observe_step(len(plan), t_verify + cost.inject_s + cost.block_s,
                                   steady and kept and not n_copied, (len(plan), n_verify, n_block))

    # --- slots ----------------------------------------------------------------------------------------
    def _admit(self) -> None:
        if self.queue and self.config.adaptive and self.drafter is not None and not any(self.slots):
            # new texts in an idle engine: their own evidence, not the last texts' pause
            self.drafting.alone(min(len(self.queue), len(self.slots)))
        while self.queue and None in self.slots:
            req, tokens = self.queue.popleft()
            # the free slot whose kept sequence shares the longest prefix with this prompt
            free = [j for j, s in enumerate(self.slots) if s is None]
            i = self.prompt_cache.pick_slot(tokens, free, req.cache_prompt)
            draft = self._clamp_draft(req.draft_max if req.draft_max is not None else self.config.draft_max)
            # the prompt but its last token goes through the target in chunks (step); the last is the first anchor
            slot = Slot(seq=i, request=req, prompt=tokens, draft_max=draft, stats=Stats(n_prompt=len(tokens)),
                        text=TextStream(req.stop), policy=adaptive.SlotPolicy(),
                        prefill=list(tokens[:-1]), anchor=tokens[-1], admitted=next(self._admissions),
                        proposal=proposal.Proposal() if req.rejection and self.drafter is not None and not req.on_host
                        else None, host=self._host_sampler(req, tokens),
                        # rejection sampling needs the drafter's q for each draft, a host-sampled request the
                        # drafter's rows: no copied chains
                        history=lookup.History(tokens) if self._looks_up and not req.rejection and not req.on_host
                        else None)
            self.target_ctx.set_sampling(i, req.sampling)
            if self.drafter is not None:  # q for rejection sampling, else the drafter's argmax
                self.drafter.ctx.set_sampling(i, req.draft_sampling)
            if req.rejection:  # the host stream for acceptance uniforms and recovered tokens
                self._rngs[i] = rejection.seeded_rng(req._seed, 1)
            # both KV caches and the feature bookkeeping brought to the longest usable cached prefix: only the rest
            # of the prompt goes through the target
            n_cached = slot.stats.n_cached = self.prompt_cache.admit(slot, tokens, req.cache_prompt,
                                                                     self._drafter_lead(draft))
            del slot.prefill[:n_cached]
            if slot.prefilled:
                self.prompt_cache.after_prefill(slot)
            self.slots[i] = slot

    def _drafter_lead(self, draft_max: int) -> int:
        """Positions before a reused prefix's end whose target features a request admitted now should give its
        drafter (``PromptCache.admit``): a probe's lead-in where it is likely to draft soon, else none (a reuse
        past the features costs a paused engine nothing: its drafter restarts when features resume)."""
        if self.drafter is None or not draft_max:
            return 0
        if self.config.adaptive and not self.drafting.expects_drafting(sum(s is not None for s in self.slots) + 1):
            return 0
        return adaptive.FEATURE_LEAD

    def _host_sampler(self, req: Request, tokens: list[int]) -> Optional[HostSampler]:
        """Penalties and grammars depend on the path through the block: such a request is sampled on the host."""
        if not req.on_host:
            return None
        grammar = Grammar.parse(self.model, req._gbnf) if req._gbnf is not None else None
        return HostSampler(req, tokens, grammar, self.model.eos)

    def _release(self, slot: Slot) -> None:
        if slot.host is not None:
            slot.host.close()
        if self.drafter is not None:  # a step cut short between propose and verify left its noise blocks
            self.drafter.drop_blocks()
        self.prompt_cache.release(slot)  # keeps the sequence in both caches for reuse (or clears them)
        self.slots[slot.seq] = None
        self.stats.merge_tokens(slot.stats)

    # --- slot files (llama-server's /slots/{id}?action=save|restore) ---------------------------------
    def save_slot(self, seq: int, path) -> dict:
        """Write an idle slot's kept sequence (both states, tokens, feature bookkeeping) to a slot file."""
        return self.prompt_cache.save_slot(seq, path)

    def restore_slot(self, seq: int, path) -> dict:
        """Load a slot file into an idle slot; CacheFileError (a 400) leaves the slot empty and usable."""
        return self.prompt_cache.restore_slot(seq, path)

    def erase_slot(self, seq: int) -> dict:
        """Forget an idle slot's kept sequence (both KV caches); InvalidRequest if the slot is busy."""
        return self.prompt_cache.erase_slot(seq)

    # --- convenience ----------------------------------------------------------------------------------
    def run(self, requests: Iterable[Request]) -> dict[int, Result]:
        """Submit all (all validated first), step until done; results by request id."""
        self.submit_all(requests)
        results = {}
        while self.has_work:
            for ev in self.step():
                if ev.finished:
                    results[ev.request_id] = ev.result
        return results

    def generate(self, prompt, **kw) -> Result:
        req = Request(prompt, **kw)
        return self.run([req])[req.id]

    def _check_open(self) -> None:
        if self.closed:
            raise EngineClosed("this engine is closed: its contexts and models were freed")

    def close(self) -> None:
        """Free the contexts (idempotent); any later call raises EngineClosed."""
        if self.closed:
            return
        self.closed = True
        if self.trace is not None:
            self.trace.close()
        if self.drafter is not None:
            self.drafter.ctx.close()
        self.target_ctx.close()
