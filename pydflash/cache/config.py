"""Prompt-cache options (llama-server: --cache-reuse, --cache-ram, --ctx-checkpoints; --cache-device is ours)."""

from __future__ import annotations

from dataclasses import dataclass


USEFUL_FLOOR = 0.125  # the least share of the kept-cell budget (``CacheConfig.kept_useful``)
USEFUL_DECAY = 0.97  # per admission: how fast the reuse rate that ``kept_useful`` compares forgets


@dataclass(frozen=True)
class CacheConfig:
    # A released slot keeps its tokens and both KV caches; a new request goes to the free slot sharing the
    # longest prefix and prefills only the rest.
    reuse: bool = True
    # The device tier (cache/device.py): a released slot's sequence that a new request is about to overwrite is kept
    # in the KV under a spare sequence id (a seq_cp: no copy), found later by longest prefix. At most this many KV
    # cells (-1: a quarter of the engine's KV, at least one slot's share; 0: off), and ``device_ids`` spare ids
    # (-1: two per slot, and one more).
    device_cells: int = -1
    device_ids: int = -1
    # Which released sequences the device tier keeps: those whose prompt's first block was seen in an earlier
    # request (second sight), or every one. Kept cells cost every step's attention mask (it spans the cells in
    # use), so traffic that never repeats a prefix should keep nothing.
    keep_all: bool = False
    # Keep a resident's whole sequence in the device tier, its answer too: what a conversation's next turn reuses
    # after another request took its slot, at the price of the answer's cells in every later step (default: the
    # prompt alone, what recurring traffic comes back to). Idle residents over the budget below then leave whole
    # rather than lose their answers.
    keep_answers: bool = False
    # What the kept cells may cost: idle slots' residents and device entries alike. In a unified KV every step's
    # attention spans the cells in use, so a kept cell costs every running request on every step, while a hit
    # saves one prefill. Kept cells are held to ``kept_share`` of the cells the running requests may come to hold,
    # or ``kept_floor`` cells spread over them (-1: one slot's share: few running requests pay little for it and
    # keep their conversations), whichever is more; idle residents' answers are held to the share alone (the floor
    # is for prompts such as a long system prompt; an answer serves only its own conversation's next turn), cut
    # oldest released first, and past the share the floor keeps at most one prompt that never recurred per running
    # request, the newest (a conversation's next turn; a request alone beside fifteen idle slots of one-off prompts
    # paid for all of them: 0.76x of the cache off on a CPU, 0.88x with one). Over the budget, the residents whose
    # prompt never recurred leave, then device entries no slot shares (least recently used), then the other
    # residents. An entry whose cells a slot's sequence holds too costs nothing of its own. A device entry not hit
    # within ``device_probation`` admissions after it was kept leaves (-1: as many as there are slots). On the H200
    # (2026-12-05) device entries kept up to a quarter of the KV, answers included, and almost never hit made
    # pydflash-server 0.59-0.85x of itself with the cache off on traffic that repeats nothing; on an H100 the same
    # day, with those bounded, eight idle slots' whole sequences beside eight running requests still cost 14 % of a
    # step.
    kept_share: float = 0.25
    kept_floor: int = -1
    device_probation: int = -1
    # The budget above pays only where later prompts reuse what is kept. Where fewer than ``kept_useful`` of the
    # recent admissions (decayed: ~the last 33) reused a kept prefix, the budget shrinks in proportion, to no less
    # than USEFUL_FLOOR of it (what is kept must still be able to show that it pays); 0: the whole budget always.
    # The benchmark's fresh prompt set recurs only after its 77 other prompts, later than anything is kept:
    # pydflash reused none of it, and with the cache on ran at 0.90-0.98x of itself with the cache off at 1-16
    # clients through HTTP (three H100 runs, 2026-12-05), 0.94-0.96x at 1 client, where the floor keeps a whole
    # slot's share. A conversation's turns reuse (most admissions of chat traffic do), so it keeps its budget.
    kept_useful: float = 0.25
    # Engine steps (that run requests) during which a conversation's released turn (a request whose reuse reached
    # into an earlier answer) is neither cut nor given up for that budget, nor counted in it: the client's next turn
    # comes back within a few steps of HTTP turnaround, and a budget pass at another request's admission in between
    # gave its whole transcript up (an H100 through HTTP, 8 chat clients with a ~1,100-token system prompt: 40 % of
    # prompt tokens reused where llama-server reused 87 %). Conversations only: graced, every released sequence cost
    # 10-16 % of a step on a CPU (the next request's cells land above it; the attention span stays wide after it).
    release_grace: int = 16
    # ... or for this many seconds, whichever ends later. Steps alone were too short on a GPU: 16 steps of 8 chat
    # clients are ~25 ms on an H100, under one HTTP turnaround (client, router, worker, tokenizer), and there
    # pydflash reused 69-74 % of prompt tokens at 4-8 chat clients where the same server on a CPU (80 ms steps)
    # reused 85 % and llama-server 87-89 %. A closed-loop client (an agent, a tool loop, the benchmark) comes back
    # well within a second; a person typing does not, and the budget then decides as for any idle slot.
    release_grace_s: float = 1.0
    # False: idle slots keep their whole sequences whatever they cost (llama-server's way), and only device entries
    # are held to the share
    bound_residents: bool = True
    # RAM tier (MiB of state snapshots, both contexts); 0 turns it off. It takes what the device tier evicts (or,
    # without a device tier, each released sequence about to be overwritten): each entry is a copy of the sequence's
    # state out of the KV, thousands of small device-to-host copies on a GPU, between steps.
    ram_mib: float = 0.0
    # SWA targets: a target checkpoint of the sliding-window layers every this many positions (0: none). Without
    # one, a sequence past the window cannot be trimmed back (the window no longer holds what a shorter prefix
    # needs) and the request re-prefills. These are state copies (the RAM tier's way); with a device tier the one
    # checkpoint that matters most, at the end of a recurring prompt, is a device-tier entry instead (no copy).
    checkpoint_every: int = 256
    max_checkpoints: int = 8  # per sequence; the oldest goes first
    # A resident sequence about to lose at least this many positions to a new request is kept first (device or RAM).
    save_min_drop: int = 64
    block: int = 32  # tokens per hash block (RAM lookups find prefixes of at least one block)

    def __post_init__(self):
        if self.ram_mib < 0:
            raise ValueError("ram_mib must be >= 0")
        if self.checkpoint_every < 0 or self.max_checkpoints < 0 or self.save_min_drop < 0:
            raise ValueError("checkpoint_every, max_checkpoints and save_min_drop must be >= 0")
        if self.device_cells < -1 or self.device_ids < -1:
            raise ValueError("device_cells and device_ids must be >= -1 (-1: automatic)")
        if self.block < 1:
            raise ValueError("block must be >= 1")
        if self.release_grace < 0 or self.release_grace_s < 0:
            raise ValueError("release_grace and release_grace_s must be >= 0")
        if not 0 <= self.kept_useful <= 1:
            raise ValueError("kept_useful must be in [0, 1]")
        if self.kept_share < 0 or self.kept_floor < -1 or self.device_probation < -1:
            raise ValueError("kept_share must be >= 0, kept_floor and device_probation >= -1 (-1: automatic)")

    def spare_ids(self, n_slots: int) -> int:
        """Spare sequence ids the engine's contexts need for the device tier."""
        if not self.reuse or self.device_cells == 0:
            return 0
        # two per slot (a slot's kept sequence, and an entry at a branch point or a prompt's end of its request)
        # and one more: a slot's resident can be kept while the entry restored into that slot holds its id. Each id
        # may hold a sliding window of cells (llama.cpp sizes an SWA cache by sequence ids).
        return 2 * n_slots + 1 if self.device_ids < 0 else self.device_ids

    def device_cap(self, n_ctx: int, n_ctx_slot: int) -> int:
        """KV cells the device tier may hold: by default a quarter of the KV, and at least one slot's share."""
        return max(n_ctx // 4, n_ctx_slot) if self.device_cells < 0 else self.device_cells

    def kept_budget(self, reserved: list[int], n_ctx_slot: int) -> int:
        """KV cells idle residents and device entries may hold while requests that may come to hold ``reserved``
        cells run: their attention spans the kept cells too, so the budget follows the load (see ``kept_share``)."""
        floor = n_ctx_slot if self.kept_floor < 0 else self.kept_floor
        return max(self.share(reserved), floor // max(1, sum(1 for r in reserved if r)))

    def usefulness(self, reuse_rate: float) -> float:
        """The share of the kept-cell budget earned by traffic whose recent admissions reused a kept prefix at
        ``reuse_rate`` (see ``kept_useful``)."""
        if self.kept_useful <= 0:
            return 1.0
        return max(USEFUL_FLOOR, min(1.0, reuse_rate / self.kept_useful))

    def share(self, reserved: list[int]) -> int:
        """``kept_share`` of the cells the running requests may come to hold: the budget without its floor, and all
        that idle residents' answers and (past one per running request) never-recurring prompts may hold."""
        return int(self.kept_share * sum(reserved))

    def probation(self, n_slots: int) -> int:
        return n_slots if self.device_probation < 0 else self.device_probation

    @property
    def ram_bytes(self) -> int:
        return int(self.ram_mib * 1024 * 1024)
