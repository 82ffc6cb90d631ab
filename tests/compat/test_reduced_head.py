"""A drafter with its own reduced lm_head (d2t): drafts stay in the subset, output stays the target's."""

from __future__ import annotations

import pytest

from tests.helpers.oracle import Oracle
from pydflash import api
from pydflash.compat.reduced_head import choose_tokens, token_counts, write_reduced_head
from pydflash.config import EngineConfig
from pydflash.engine import drafter as drafter_mod

PROMPTS = ["hello world, the quick brown fox", "def add(a, b):\n    return a + b\n", "1, 2, 3, 4, 5,"]


def test_choose_tokens():
    counts = token_counts([[5, 5, 7, 9], [7, 5, 1]])
    assert choose_tokens(counts, 2) == [5, 7]
    assert choose_tokens(counts, 2, always=[0]) == [0, 5]


def test_full_subset_reproduces_the_shared_head(tiny, tmp_path, monkeypatch):
    """All ids, F32 head: the same matrix as the shared head, so the same drafts step by step."""
    p = tiny("qwen3")
    out = write_reduced_head(p.drafter, p.target, range(p.n_vocab), tmp_path / "d.gguf", head_type="F32")
    seen = {}
    real = drafter_mod.Drafter.propose

    def spy(self, plan, **kw):
        d = real(self, plan, **kw)
        seen.setdefault(self.ctx.model.path, []).append(d)
        return d

    monkeypatch.setattr(drafter_mod.Drafter, "propose", spy)
    cfg = EngineConfig(n_ctx_slot=512)
    for drafter in (p.drafter, out):
        with api.load(p.target, drafter, config=cfg) as llm:
            llm.generate(llm.tokenize(PROMPTS[0]), max_tokens=32, ignore_eos=True)
    assert seen[p.drafter] == seen[out]


@pytest.mark.parametrize("head_type", ["Q8_0", "F16", "Q4_0"])
def test_subset_drafts_stay_inside_and_output_is_lossless(tiny, tmp_path, monkeypatch, head_type):
    p = tiny("gemma3")
    oracle = Oracle(p.target)
    # the subset: tokens the target itself generates on a few prompts, plus filler ids
    base = [oracle.greedy(oracle.llm.tokenize(pr), 48) for pr in PROMPTS]
    ids = choose_tokens(token_counts(base), 64, always=range(8))
    out = write_reduced_head(p.drafter, p.target, ids, tmp_path / f"d-{head_type}.gguf", head_type=head_type)
    drafted = []
    real = drafter_mod.Drafter.propose
    monkeypatch.setattr(drafter_mod.Drafter, "propose",
                        lambda self, plan, **kw: drafted.append(real(self, plan, **kw)) or drafted[-1])
    with api.load(p.target, out, config=EngineConfig(n_ctx_slot=512)) as llm:
        for pr, b in zip(PROMPTS, base):
            res = llm.generate(llm.tokenize(pr), max_tokens=48, ignore_eos=True)
            oracle.check(llm.tokenize(pr), res.tokens, base_tokens=b)
    allowed = set(ids)
    all_drafts = [t for step in drafted for ds in step.values() for t in ds]
    assert all_drafts and set(all_drafts) <= allowed
    oracle.close()


def test_refuses_a_drafter_with_its_own_head(tiny, tmp_path):
    p = tiny("qwen3")
    once = write_reduced_head(p.drafter, p.target, [1, 2, 3], tmp_path / "once.gguf")
    with pytest.raises(Exception, match="own head"):
        write_reduced_head(once, p.target, [1, 2, 3], tmp_path / "twice.gguf")


def test_the_shipped_drafter_has_its_own_head_inside_the_size_cap():
    """The shipped Gemma drafter carries a reduced head (scripts/reduce_drafter_head.py): sorted unique target ids
    (I32), one Q8_0 row each, the end-of-turn and end-of-text ids among them (a drafter must be able to propose the
    end of a reply); and everything in pydflash/models stays inside the 60 MB cap on pydflash/models."""
    import gguf
    import numpy as np

    from pydflash.compat.gguf_meta import read_metadata
    from pydflash.defaults import MODELS_DIR, SHIPPED_DRAFTER

    meta = read_metadata(SHIPPED_DRAFTER)
    tokens = meta.get("tokenizer.ggml.tokens")
    info = meta.tensors["d2t"]  # gguf's reader would also parse the 262k-token vocabulary: ~15 s
    # I32: what our llama.cpp's greedy drafter picks map through without a vocabulary scatter (patches/0011)
    assert info.ggml_type == gguf.GGMLQuantizationType.I32
    d2t = np.fromfile(SHIPPED_DRAFTER, dtype=np.int32, count=info.dims[0], offset=info.offset)
    head = meta.tensors["output.weight"]
    assert head.dims == (640, len(d2t)) and head.ggml_type == gguf.GGMLQuantizationType.Q8_0
    assert np.all(np.diff(d2t) > 0) and d2t[0] >= 0 and d2t[-1] < len(tokens)
    eot = tokens.index("<end_of_turn>")
    assert {int(meta.get("tokenizer.ggml.eos_token_id")), eot} <= set(d2t.tolist())
    assert sum(p.stat().st_size for p in MODELS_DIR.iterdir() if p.is_file()) <= 60_000_000
