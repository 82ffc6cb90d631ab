"""Gemma-4 end to end on tiny factory pairs: the pinned gemma4 graph loads and runs the target (sliding window,
softcap, per-layer heads), speculation is lossless, and the drafter's inherited embedding scale and softcap are
the ones that work.

Two pairs:
- ``tiny("gemma4")``: a random target and drafter (factory/gemma4.py). Its drafts are almost never accepted, so
  every step rolls a whole block back: the losslessness tests.
- ``factory/scale_probe.py``: a target that (nearly) always picks one token T and a drafter that drafts T exactly
  when its noise embeddings are scaled once by sqrt(n_embd). Acceptance then measures the transform; with a
  weaker head (beta 1.85) the target leaves T at times and blocks are accepted in part (rollbacks mid-block).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers.compat_helpers import block_logits, rewrite_gguf
from gguf import GGUFValueType as T
from tests.helpers.oracle import Oracle
from pydflash import api
from pydflash.compat import inherit
from pydflash.compat.gguf_meta import read_metadata
from pydflash.config import EngineConfig
from pydflash.engine.request import Request
from pydflash.errors import IncompatibleDrafter
from pydflash.factory import write_tiny_pair
from pydflash.factory.scale_probe import write_scale_probe_pair
from pydflash.pair import load_pair

PROMPTS = ["hello world, the quick brown fox", "def add(a, b):\n    return a + b\n", "Once upon a time there was",
           "1, 2, 3, 4, 5, 6,", "the the the", "zq", "x = [i * i for i in range(10)]",
           "A longer prompt about nothing in particular, written so that it spans several tokens."]


@pytest.fixture(scope="module")
def g4(tiny):
    p = tiny("gemma4")
    oracle = Oracle(p.target, n_ctx=512)
    yield p, oracle
    oracle.close()


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """Scale-probe pairs by (embedding_scale_key, beta), written once per module."""
    root, made = tmp_path_factory.mktemp("probe"), {}

    def get(scale_key=None, beta=None):
        key = (scale_key, beta)
        if key not in made:
            kw = {} if beta is None else {"beta": beta}
            made[key] = write_scale_probe_pair(root / f"{scale_key}-{beta}", embedding_scale_key=scale_key, **kw)
        return made[key]

    return get


def spec_llm(target, drafter, **cfg):
    allow = cfg.pop("allow_scale_mismatch", False)
    cfg.setdefault("n_ctx_slot", 512)
    return api.load(target, drafter, config=EngineConfig(**cfg), allow_scale_mismatch=allow)


# ---------------------------------------------------------------- the target


def test_target_metadata_is_gemma4_shaped(g4):
    p, oracle = g4
    meta = read_metadata(p.target)
    assert meta.arch == "gemma4"
    assert meta.get("gemma4.attention.sliding_window_pattern") == [True, True, False, True, True, False]
    assert meta.get("gemma4.attention.head_count_kv") == [2, 2, 1, 2, 2, 1]
    assert (meta.get("gemma4.attention.key_length"), meta.get("gemma4.attention.key_length_swa")) == (32, 16)
    assert meta.get("gemma4.final_logit_softcapping") == 30.0
    assert "blk.2.attn_v.weight" not in meta.tensors and "blk.0.attn_v.weight" in meta.tensors  # K as V on full
    assert meta.tensors["rope_freqs.weight"].dims == (16,)
    assert oracle.model.arch == "gemma4" and oracle.model.n_layer == 6 and oracle.model.n_embd == 64
    out = oracle.greedy(oracle.llm.tokenize(PROMPTS[0]), 32)
    assert len(set(out)) >= 8, out  # a working forward, not one token forever


def test_factory_writes_the_same_bytes_for_the_same_seed(tmp_path):
    a, b = (write_tiny_pair(tmp_path / name, arch="gemma4", seed=3) for name in "ab")
    for name in ("target", "drafter", "safetensors", "config_json"):
        assert getattr(a, name).read_bytes() == getattr(b, name).read_bytes(), name
    assert json.loads(a.config_json.read_text())["dflash_config"]["final_logit_softcapping"] == 30.0
    assert a.logit_softcap == 30.0 and a.embedding_scale == 8.0


def test_softcap_is_applied_by_the_target_graph(probe):
    """The probe target's head gives T a raw logit near 8 * 6 = 48: the graph's tanh cap keeps it under 30."""
    o = Oracle(probe().target, n_ctx=128)
    try:
        logits = o.logits_after(o.llm.tokenize(PROMPTS[2]))
    finally:
        o.close()
    assert int(logits.argmax()) == probe().token
    assert 20.0 < logits.max() < 30.0


# ---------------------------------------------------------------- lossless speculation


def test_lossless_single_slot_past_the_sliding_window(g4):
    """Prompts of 10 and of 130 tokens (twice the 64-token window), prefilled in 32-row ubatches."""
    p, oracle = g4
    with spec_llm(p.target, p.drafter, n_batch=64, n_ubatch=32) as llm:
        for toks in (llm.tokenize(PROMPTS[0]), llm.tokenize(" ".join(PROMPTS) * 2)[:130]):
            res = llm.generate(toks, max_tokens=40, ignore_eos=True)
            assert len(res.tokens) == 40 and res.stats.n_drafted > 0
            oracle.check(toks, res.tokens)


def test_lossless_eight_slots_staggered(g4):
    p, oracle = g4
    max_tokens = [3, 40, 17, 64, 1, 33, 9, 50]
    with spec_llm(p.target, p.drafter, n_slots=8) as llm:
        reqs = [Request(llm.tokenize(pr), max_tokens=n, ignore_eos=True) for pr, n in zip(PROMPTS, max_tokens)]
        results = llm.generate_many(reqs)
    for req, res, n in zip(reqs, results, max_tokens):
        assert len(res.tokens) == n
        oracle.check(req.prompt, res.tokens)


def test_lossless_with_blocks_accepted_in_part(probe):
    """beta 1.85: the target picks T at some positions only, so blocks are cut inside (rollbacks mid-block)."""
    p = probe(beta=1.85)
    oracle = Oracle(p.target, n_ctx=512)
    with spec_llm(p.target, p.drafter, n_slots=4, lookup=False) as llm:
        eng = llm.engine
        reqs = [Request(llm.tokenize(pr), max_tokens=48, ignore_eos=True) for pr in PROMPTS[:4]]
        for r in reqs:
            eng.submit(r)
        commits, results = {r.id: [] for r in reqs}, {}
        while eng.has_work:
            for ev in eng.step():
                commits[ev.request_id].append(len(ev.tokens))
                if ev.finished:
                    results[ev.request_id] = ev.result
    for req in reqs:
        oracle.check(req.prompt, results[req.id].tokens)
    oracle.close()
    # a step committing 2..15 tokens before the request's last step accepted some of its drafts, not all
    cut = [n for c in commits.values() for n in c[:-1] if 1 < n < 16]
    full = [n for c in commits.values() for n in c if n == 16]
    assert cut and full, commits


def test_prompt_cache_hits_inside_and_past_the_window(g4):
    """A request extending a kept sequence prefills only the rest, short or past the 64-token window."""
    p, oracle = g4
    with spec_llm(p.target, p.drafter, n_slots=2) as llm:
        for n in (40, 100):
            prompt = [1] + np.random.default_rng(n).integers(5, 500, n - 1).tolist()
            first = llm.generate(prompt, max_tokens=12, ignore_eos=True)
            longer = prompt + first.tokens
            second = llm.generate(longer, max_tokens=12, ignore_eos=True)
            assert second.stats.n_cached >= n, (n, second.stats.n_cached)
            oracle.check(longer, second.tokens)


# ---------------------------------------------------------------- inherited transforms


def test_inherited_transforms(g4):
    p, _ = g4
    pair = load_pair(p.target, p.drafter)  # drafter.gguf states neither key
    try:
        assert pair.transforms == inherit.Transforms(8.0, 30.0)
    finally:
        pair.close()


@pytest.mark.parametrize("scale_key, accepts", [(None, True), (8.0, True), (1.0, False), (64.0, False)])
def test_acceptance_needs_the_scale_applied_once(probe, scale_key, accepts):
    """Inherited (no key) or stated 8.0: every draft accepted. Unscaled (1.0, a drafter written without the
    transform) or scaled twice (64): nothing accepted, and the output is still the target's."""
    p = probe(scale_key)
    with spec_llm(p.target, p.drafter, lookup=False, allow_scale_mismatch=scale_key is not None) as llm:
        results = [llm.generate(pr, max_tokens=32, ignore_eos=True) for pr in PROMPTS[:2]]
    drafted = sum(r.stats.n_drafted for r in results)
    accepted = sum(r.stats.n_accepted for r in results)
    assert all(set(r.tokens) == {p.token} for r in results)
    assert drafted > 0
    assert accepted == drafted if accepts else accepted == 0, (scale_key, accepted, drafted)


def test_the_wrong_scale_drafts_differently(probe):
    logits = {}
    for key in (None, 1.0):
        p = probe(key)
        pair = load_pair(p.target, p.drafter, allow_scale_mismatch=key is not None)
        try:
            logits[key] = block_logits(pair)[1][1:]  # the 15 mask positions
        finally:
            pair.close()
    assert (logits[None].argmax(axis=1) == probe().token).all()
    assert not (logits[1.0].argmax(axis=1) == probe().token).any()


# ---------------------------------------------------------------- wrong pairings


def _wrong(p, tmp_path, **kw):
    return rewrite_gguf(p.drafter, tmp_path / "wrong.gguf", **kw)


@pytest.mark.parametrize("case, message", [
    ("deeper target", r"inputs \[12, 23\] lie outside the target's layers 1\.\.5"),
    ("other softcap", "final logit softcap is 20 but the gemma4 target needs 30"),
    ("other scale", "embedding scale is 73.3 but the gemma4 target needs 8"),
    ("wider drafter", "hidden size 128 != target 64"),
])
def test_wrong_pairing_is_refused(g4, tmp_path, case, message):
    p, _ = g4
    kv = {
        "deeper target": {"dflash.target_layers": ([1, 12, 23], T.ARRAY, T.INT32)},  # a 31B drafter's layout
        "other softcap": {inherit.SOFTCAP_KEY: (20.0, T.FLOAT32)},
        "other scale": {inherit.SCALE_KEY: (73.3, T.FLOAT32)},  # sqrt(5376): made for Gemma-4-31B's width
        "wider drafter": {"dflash.embedding_length": (128, T.UINT32)},
    }[case]
    with pytest.raises(IncompatibleDrafter, match=message):
        load_pair(p.target, _wrong(p, tmp_path, kv=kv))


def test_reference_applies_the_inherited_softcap(g4):
    """z-lab's reference (config: input_embedding_scale 8, final_logit_softcapping 30) against our drafter, which
    states neither and inherits both: equal once our logits are capped with the inherited value, not before.
    (llama.cpp's DFlash-1 graph leaves the cap to whoever samples; greedy picks are the same either way.)"""
    pytest.importorskip("torch", reason="the reference needs torch (pip install -e .[parity])")
    pytest.importorskip("dflash.model", reason="the reference needs z-lab dflash 0.1.0")
    from tests.helpers.zlab_helpers import REL_TOL, reference_logits, rel_diff

    p, _ = g4
    pair = load_pair(p.target, p.drafter)
    try:
        cap = pair.transforms.logit_softcap
        feats, logits, hidden = block_logits(pair, all_layers=True)
    finally:
        pair.close()
    ref_feats, ref = reference_logits(p.config_json.parent, p.target, hidden)
    assert np.array_equal(ref_feats, feats)
    assert cap == 30.0 and np.abs(logits).max() > 5.0  # large enough for the cap to show
    assert rel_diff(cap * np.tanh(logits / cap), ref).max() < REL_TOL
    assert rel_diff(logits, ref).min() > 5 * REL_TOL
    assert (logits.argmax(axis=1) == ref.argmax(axis=1)).all()
