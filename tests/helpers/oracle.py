"""The losslessness oracle: plain greedy decoding through the same engine, plus a regret gate for float ties.

Batched (verify) and single-token forwards reduce in different orders, so at a genuine near-tie the two paths may
pick different tokens. At each divergence we measure the speculative pick's regret in the baseline's own
distribution (log p_best - log p_pick, which equals the logit gap); within ``max_regret`` nats it is a tie-flip:
we re-anchor the baseline on the speculative prefix and keep checking the following positions. Real bugs
(misaligned KV, mask leaks, stale features) land far outside that band.
"""

from __future__ import annotations

import numpy as np

from pydflash import api
from pydflash.config import EngineConfig
from pydflash.engine.engine import target_ubatch
from pydflash.native import Context, ContextParams, TokenBatch

MAX_REGRET = 0.2
TIE_EPS = 1e-6  # a regret this small is an exact tie with the forward's own argmax


class Oracle:
    def __init__(self, target_path, n_ctx=2048):
        self.llm = api.load(target_path, config=EngineConfig(n_ctx_slot=n_ctx, draft_max=0))
        self.model = self.llm.engine.model
        # ubatches below ggml-cpu's flash-attention tile switch, as the engine's CPU target forwards
        # (engine.target_ubatch): the regret is measured in the numerics plain decoding runs in, not in the tiled
        # kernel's, which moved Gemma-3's logits by up to 2 nats on an AVX2 host
        ub = target_ubatch(EngineConfig(), 512)
        self.ctx = Context(self.model, ContextParams(n_ctx=n_ctx, n_batch=512, n_ubatch=ub, backend_greedy=False))
        self.batch = TokenBatch(512)

    def greedy(self, prompt_tokens, n, ignore_eos=True):
        return self.llm.generate(list(prompt_tokens), max_tokens=n, ignore_eos=ignore_eos).tokens

    def logits_after(self, tokens) -> np.ndarray:
        self.ctx.clear()
        tokens = list(tokens)
        for i in range(0, len(tokens), 512):
            chunk = tokens[i : i + 512]
            self.batch.clear()
            self.batch.add(chunk, i, 0, [False] * (len(chunk) - 1) + [True])
            self.ctx.decode(self.batch)
        return self.ctx.logits(self.batch.n - 1)

    def check(self, prompt_tokens, spec_tokens, base_tokens=None, max_flips=4, max_regret=MAX_REGRET) -> int:
        """Assert spec_tokens is the greedy continuation up to tie-flips; returns the number of flips.

        max_regret: the tie band. A quantized real model batched several sequences at a time rounds further
        from its single-sequence forward than a tiny f32 one (plain decoding alone reaches ~0.3 nat on Gemma-3
        Q4_K_M), so real-model concurrency tests pass a wider band; real bugs still land far outside it."""
        prompt_tokens, spec = list(prompt_tokens), list(spec_tokens)
        base = list(base_tokens) if base_tokens is not None else self.greedy(prompt_tokens, len(spec))
        flips = 0
        self.regrets = []  # of each tie-flip, for the assertion messages
        i = 0
        while True:
            n = min(len(spec), len(base))
            j = next((k for k in range(i, n) if spec[k] != base[k]), None)
            if j is None:
                assert len(spec) <= len(base) or len(base) == n, "speculative output ran past the baseline"
                return flips
            logits = self.logits_after(prompt_tokens + spec[:j])
            regret = float(logits.max() - logits[spec[j]])
            assert regret <= max_regret, (
                f"divergence at generated token {j}: spec picked {spec[j]}, baseline {base[j]}, "
                f"regret {regret:.3f} nat > {max_regret}"
            )
            self.regrets.append((j, round(regret, 3)))
            # regret 0: the speculative pick is this forward's own argmax, and the baseline (a batched run, when
            # base_tokens come from one) rounded the other way: re-anchored, but not the speculative path's flip
            flips += regret > TIE_EPS
            assert flips <= max_flips, f"too many tie-flips for float noise: (token, regret) {self.regrets}"
            if j + 1 == len(spec):  # the flip was the last token: nothing after it to check
                return flips
            base = spec[: j + 1] + self.greedy(prompt_tokens + spec[: j + 1], len(spec) - j - 1)
            i = j + 1

    def close(self):
        self.ctx.close()
        self.llm.close()
