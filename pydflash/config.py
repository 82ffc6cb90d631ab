"""Frozen configuration, validated on construction (ValueError, never assert)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .rpc_endpoints import parse_endpoints


@dataclass(frozen=True)
class EngineConfig:
    n_slots: int = 1  # concurrent requests
    n_ctx_slot: int = 4096  # context window of each slot (prompt + generation + one draft block)
    n_batch: int = 512  # prefill chunk
    n_ubatch: int = 512
    n_threads: int = 0  # 0 = llama.cpp default
    n_gpu_layers: int = 0  # layers offloaded to the local GPUs and the RPC servers together (-1 = all)
    # llama.cpp RPC servers ("host:port") that take the target's offloaded layers with the local GPUs (the drafter
    # stays local); unauthenticated, so private addresses only unless rpc_allow_public (pydflash/rpc_endpoints.py)
    rpc: tuple[str, ...] = ()
    rpc_allow_public: bool = False
    # Drafts per step: None = the drafter's trained block size - 1; 0 = plain decoding through the same engine.
    draft_max: Optional[int] = None
    # Shrink drafting (down to none) while the measured acceptance does not pay for the draft.
    adaptive: bool = False
    # Verify a continuation copied from the slot's own text instead of the drafter's block where it looks better
    # (engine/lookup.py): the drafter does not copy text it saw once. Greedy and sample-and-match requests only.
    lookup: bool = True
    # Benchmarking only: force this mean acceptance length (counting the bonus); the text becomes invalid.
    synth_len: Optional[float] = None
    seed: int = 0
    # Check the feature/KV invariants after every commit (two cheap native calls per slot).
    check_invariants: bool = True
    # One KV pool for all slots (the default), or a stream of n_ctx_slot cells per slot, where each slot's attention
    # spans only its own cells. Streams are for plain decoding only (no drafter): training-data generation at
    # 100+ slots (pydflash.train.generate).
    kv_unified: bool = True
    # Run each context's largest batch once at load (engine/warmup.py): None = on a GPU (n_gpu_layers != 0), where a
    # batch shape's first run costs ~100x a later one; on a CPU it costs the same and would only delay the load.
    warm_up: Optional[bool] = None

    def __post_init__(self):
        if self.n_slots < 1:
            raise ValueError("n_slots must be >= 1")
        if self.n_ctx_slot < 8:
            raise ValueError("n_ctx_slot must be >= 8")
        if self.n_ubatch < 1 or self.n_batch < self.n_ubatch:
            raise ValueError("need 1 <= n_ubatch <= n_batch")
        if self.n_threads < 0:
            raise ValueError("n_threads must be >= 0")
        if self.draft_max is not None and self.draft_max < 0:
            raise ValueError("draft_max must be >= 0")
        if self.synth_len is not None and self.synth_len < 1.0:
            raise ValueError("synth_len must be >= 1 (it counts the bonus token)")
        if not isinstance(self.rpc_allow_public, bool):
            raise ValueError("rpc_allow_public must be true or false")
        # a list, or "a:1,b:2" as llama.cpp's --rpc takes it; syntax here, and the policy on numeric hosts
        rpc = parse_endpoints(self.rpc, self.rpc_allow_public) if isinstance(self.rpc, str) or self.rpc else ()
        object.__setattr__(self, "rpc", tuple(str(e) for e in rpc))
        if self.rpc and self.n_gpu_layers == 0:
            raise ValueError("rpc: with n_gpu_layers = 0 no layer goes to the RPC servers; set n_gpu_layers (-1 = all)")
