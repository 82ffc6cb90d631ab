"""Embedding-scale and softcap inheritance at load (the "exactly once" proof is in test_parity_reference.py)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from gguf import GGUFValueType as T

from tests.helpers.compat_helpers import block_logits, rewrite_gguf
from pydflash.compat import inherit
from pydflash.compat.gguf_meta import read_metadata
from pydflash.errors import IncompatibleDrafter
from pydflash.native import Model
from pydflash.pair import load_pair


def overrides_for(target_path, drafter_path, **kw):
    target = Model(target_path)
    try:
        return inherit.drafter_overrides(target, read_metadata(drafter_path), **kw)
    finally:
        target.close()


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_non_gemma_targets_get_nothing(tiny, arch):
    p = tiny(arch)
    assert overrides_for(p.target, p.drafter) == ({}, inherit.Transforms(None, None))


def test_gemma3_scale_is_inherited_and_logged(tiny, caplog):
    p = tiny("gemma3")
    with caplog.at_level(logging.INFO, logger="pydflash.compat.inherit"):
        overrides, eff = overrides_for(p.target, p.drafter)
    assert overrides == {inherit.SCALE_KEY: 8.0}  # sqrt(n_embd = 64); gemma3 has no logit softcap
    assert eff == inherit.Transforms(8.0, None)
    assert "embedding_scale=8.0 (inherited)" in caplog.text


def test_gemma3_drafter_stating_the_right_scale_gets_no_override(tiny):
    p = tiny("gemma3", embedding_scale_key=8.0)
    assert overrides_for(p.target, p.drafter) == ({}, inherit.Transforms(8.0, None))


def test_stored_zero_means_unset_and_is_inherited(tiny):
    p = tiny("gemma3", embedding_scale_key=0.0)
    assert overrides_for(p.target, p.drafter)[0] == {inherit.SCALE_KEY: 8.0}


@pytest.mark.parametrize("arch, stored, need", [("gemma3", 64.0, "8"), ("qwen3", 8.0, "none")])
def test_disagreeing_scale_is_refused_unless_allowed(tiny, caplog, arch, stored, need):
    p = tiny(arch, embedding_scale_key=stored)
    with pytest.raises(IncompatibleDrafter, match=f"embedding scale is {stored:g} but the {arch} target needs {need}"):
        load_pair(p.target, p.drafter)
    with caplog.at_level(logging.WARNING, logger="pydflash.compat.inherit"):
        pair = load_pair(p.target, p.drafter, allow_scale_mismatch=True)
    assert pair.transforms.embedding_scale == stored
    pair.close()
    assert "using the drafter's value as asked" in caplog.text


@pytest.fixture
def softcapped_target(tiny, tmp_path):
    """The tiny gemma3 target declaring a Gemma-2/4 style final logit softcap of 30."""
    p = tiny("gemma3")
    return p, rewrite_gguf(p.target, tmp_path / "target-cap.gguf",
                           kv={"gemma3.final_logit_softcapping": (30.0, T.FLOAT32)})


def test_softcap_is_inherited(softcapped_target):
    p, target = softcapped_target
    overrides, eff = overrides_for(target, p.drafter)
    assert overrides == {inherit.SCALE_KEY: 8.0, inherit.SOFTCAP_KEY: 30.0}
    assert eff == inherit.Transforms(8.0, 30.0)
    pair = load_pair(target, p.drafter)  # llama.cpp accepts the override for a key the file lacks
    assert pair.transforms == eff
    pair.close()


def test_disagreeing_softcap_is_refused(softcapped_target, tmp_path):
    p, target = softcapped_target
    drafter = rewrite_gguf(p.drafter, tmp_path / "d.gguf", kv={inherit.SOFTCAP_KEY: (20.0, T.FLOAT32)})
    with pytest.raises(IncompatibleDrafter, match="final logit softcap is 20 but the gemma3 target needs 30"):
        load_pair(target, drafter)


def test_override_acts_like_the_stored_key(tiny):
    """kv_overrides reach dflash.cpp's load_arch_hparams for a key the file lacks: the inherited 8.0 gives
    bit-identical drafter logits to a file storing 8.0, and different ones from an unscaled drafter."""
    runs = {}
    for name, kw, allow in (("inherited", {}, False), ("stored", {"embedding_scale_key": 8.0}, False),
                            ("unscaled", {"embedding_scale_key": 1.0}, True)):
        p = tiny("gemma3", **kw)
        pair = load_pair(p.target, p.drafter, allow_scale_mismatch=allow)
        try:
            runs[name] = block_logits(pair)[1]
        finally:
            pair.close()
    assert np.array_equal(runs["inherited"], runs["stored"])
    assert np.abs(runs["inherited"] - runs["unscaled"]).max() > 1.0
