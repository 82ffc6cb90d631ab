"""Sampling parameters at their bounds reach llama.cpp only in forms it accepts (a native assert kills the process,
and in the server the whole worker)."""

from __future__ import annotations

from pydflash import api
from pydflash.config import EngineConfig


def test_top_k_past_the_vocabulary_means_no_top_k(tiny):
    p = tiny("gemma3")
    with api.load(p.target, p.drafter, EngineConfig(n_ctx_slot=256)) as llm:
        ref = llm.generate("hello", max_tokens=12, temperature=1.0, seed=7, top_k=0)
        for k in (p.n_vocab, p.n_vocab + 1, 2**31 - 1):  # ggml_top_k asserted k <= n_vocab: SIGABRT
            out = llm.generate("hello", max_tokens=12, temperature=1.0, seed=7, top_k=k)
            assert out.tokens == ref.tokens
