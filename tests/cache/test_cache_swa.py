"""Sliding-window layers (Gemma-3): why a cached sequence cannot simply be trimmed back past the window, and the
checkpoints that make reuse exact again. Tiny factory Gemma-3 pair: window 64."""

from __future__ import annotations

import numpy as np
import pytest

from pydflash.cache import CacheConfig
from pydflash.config import EngineConfig
from pydflash.engine.engine import Engine
from pydflash.engine.request import Request
from pydflash.native import Context, ContextParams, Model, TokenBatch, state
from pydflash.pair import load_pair

N = 64  # the tiny Gemma-3's window


@pytest.fixture(scope="module")
def gemma3(tiny):
    return tiny("gemma3")


def feed(ctx, batch, tokens, p0):
    """Decode tokens at positions p0.. in chunks of 64; logits of the last one."""
    for i in range(0, len(tokens), 64):
        ch = tokens[i : i + 64]
        batch.clear()
        batch.add(ch, p0 + i, 0, [False] * (len(ch) - 1) + [True])
        ctx.decode(batch)
    return ctx.logits(batch.n - 1)


def test_trimming_past_the_window_without_a_checkpoint_gives_wrong_logits(gemma3):
    """The failing proof: a 400-token sequence's state keeps only the last 64 positions of the SWA layers; trimmed
    back to 200, llama.cpp's seq_rm does not refuse (no RollbackError) and the next tokens attend over nothing in
    those layers. A checkpoint of the SWA layers taken at 192 restores the exact state."""
    model = Model(gemma3.target)
    assert state.n_swa(model) == N
    rng = np.random.default_rng(0)
    toks = [2] + rng.integers(5, model.n_vocab, 399).tolist()
    batch = TokenBatch(64)

    def new_ctx():
        return Context(model, ContextParams(n_ctx=1024, n_batch=64, n_ubatch=64, backend_greedy=False))

    fresh = feed(new_ctx(), batch, toks[:210], 0)
    src = new_ctx()
    feed(src, batch, toks[:192], 0)
    ckpt = state.state_seq_get(src, 0, state.PARTIAL)
    feed(src, batch, toks[192:], 192)
    full = state.state_seq_get(src, 0)

    ctx = new_ctx()
    state.state_seq_set(ctx, 0, full)
    assert (ctx.seq_pos_min(0), ctx.seq_pos_max(0)) == (400 - N, 399)  # the SWA layers hold the last window
    ctx.seq_rm(0, 200)  # accepted without complaint
    wrong = feed(ctx, batch, toks[200:210], 200)
    assert np.abs(wrong - fresh).max() > 1.0  # far beyond float noise (~1e-2 here)

    ctx.seq_rm(0, 0)
    state.state_seq_set(ctx, 0, full)
    state.state_seq_set(ctx, 0, ckpt, state.PARTIAL)  # the SWA layers at 192 positions
    ctx.seq_rm(0, 192)  # the full-attention layers cut to the same point
    right = feed(ctx, batch, toks[192:210], 192)
    assert np.abs(right - fresh).max() < 1e-3
    for c in (ctx, src):
        c.close()


def engines(gemma3, **cache):
    pair = load_pair(gemma3.target, gemma3.drafter)
    cfg = EngineConfig(n_slots=1, n_ctx_slot=640)
    on = Engine(pair, cfg, cache=CacheConfig(**cache))
    off = Engine(pair, cfg, cache=CacheConfig(reuse=False, ram_mib=0))
    return on, off


@pytest.mark.parametrize("checkpoints", [True, False])
def test_chat_past_the_window_restored_from_ram(gemma3, checkpoints):
    """The RAM tier alone (no device tier). Conversation A grows past the window; B takes the only slot (A goes to
    RAM); A's next turn re-renders the last tokens of its answer, so its prefix ends inside A's snapshot: with
    checkpoints the nearest one is restored and only the rest prefilled; without them the request re-prefills.
    Output equals the cache-off engine's."""
    on, off = engines(gemma3, checkpoint_every=48 if checkpoints else 0, save_min_drop=8, block=16, ram_mib=256,
                      device_cells=0)
    rng = np.random.default_rng(1)
    a = [2] + rng.integers(5, 500, 150).tolist()
    b = [2] + rng.integers(5, 500, 90).tolist()
    got = []
    for turn in range(3):
        for conv in ("a", "b"):
            prompt = a if conv == "a" else b
            r = on.generate(prompt, max_tokens=12, ignore_eos=True)
            assert r.tokens == off.generate(prompt, max_tokens=12, ignore_eos=True).tokens, (turn, conv)
            got.append((conv, len(prompt), r.stats.n_cached))
            grown = prompt + r.tokens[:-6] + rng.integers(5, 500, 20).tolist()
            a, b = (grown, b) if conv == "a" else (a, grown)
    later = [n for conv, length, n in got[2:]]
    if checkpoints:
        assert on.prompt_cache.ram.hits == 4, got
        assert all(n >= length - 40 for _, length, n in got[2:]), got  # the last checkpoint <= 48 back
        assert on.prompt_cache.fallbacks == 0
    else:
        assert all(n <= 1 for n in later), got  # only the shared BOS
        assert on.prompt_cache.fallbacks == 4, got  # refused: the window no longer holds the trim point
    on.close()
    off.close()


def test_no_checkpoints_for_a_sequence_that_cannot_outgrow_the_window(gemma3):
    """State-copy checkpoints (without a device tier): prompt + max_tokens within the window: every snapshot keeps
    all SWA cells, so checkpoints (costly GPU state reads) are skipped; one that can run past the window still takes
    them at the prompt's end and every N."""
    on, off = engines(gemma3, checkpoint_every=16, save_min_drop=8, block=16, device_cells=0)
    cache = on.prompt_cache
    short = [2] + list(range(10, 40))  # 31 prompt + 24 generated positions stay within the 64-token window
    on.submit(Request(short, max_tokens=24, ignore_eos=True))
    seen = 0
    while on.has_work:
        on.step()
        seen = max(seen, len(cache.live_ckpts[0]))
    assert seen == 0
    long = [2] + list(range(10, 60))
    on.submit(Request(long, max_tokens=40, ignore_eos=True))
    while on.has_work:
        on.step()
        seen = max(seen, len(cache.live_ckpts[0]))
    assert seen >= 2
    on.close()
    off.close()
