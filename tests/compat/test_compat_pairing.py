"""Pairing checks: each deliberately broken drafter GGUF fails load_pair with an IncompatibleDrafter naming the
mismatch, before the drafter is loaded or anything is decoded."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest
from gguf import GGUFValueType as T

from tests.helpers.compat_helpers import rewrite_gguf
from pydflash.compat import gguf_meta, pairing
from pydflash.compat.gguf_meta import read_metadata
from pydflash.errors import IncompatibleDrafter
from pydflash.pair import load_pair


@pytest.fixture(scope="module")
def p(tiny):
    return tiny("qwen3")


def broken(p, tmp_path, **kw):
    return rewrite_gguf(p.drafter, tmp_path / "broken.gguf", **kw)


def test_intact_pair_passes(p):
    pair = load_pair(p.target, p.drafter)
    try:
        assert pair.block_size == 16 and pair.mask_token == p.mask_token_id
        assert pair.feature_layers == p.target_layer_inputs
    finally:
        pair.close()


def _tokens(p, edit):
    toks = list(read_metadata(p.drafter).get("tokenizer.ggml.tokens"))
    edit(toks)
    return {"tokenizer.ggml.tokens": (toks, T.ARRAY, T.STRING)}


CASES = {
    "token text": (lambda p: {"kv": _tokens(p, lambda t: t.__setitem__(300, t[300] + "x"))}, "vocabularies differ"),
    "vocab size": (lambda p: {"kv": _tokens(p, lambda t: t.append("extra"))}, "vocab sizes differ"),
    "no vocab": (lambda p: {"drop": ("tokenizer.ggml.tokens",)}, "no tokenizer.ggml.tokens"),
    "layer past the end": (lambda p: {"kv": {"dflash.target_layers": ([1, 2, p.n_layer + 1], T.ARRAY, T.INT32)}},
                           r"inputs \[6\] lie outside the target's layers 1\.\.4"),
    "last layer output": (lambda p: {"kv": {"dflash.target_layers": ([1, 2, p.n_layer], T.ARRAY, T.INT32)}},
                          r"inputs \[5\] lie outside"),
    "raw HF ids": (lambda p: {"kv": {"dflash.target_layers": (list(p.target_layer_ids), T.ARRAY, T.INT32)}},
                   r"raw HF ids stored without the \+1"),
    "no target layers": (lambda p: {"drop": ("dflash.target_layers",)}, "no dflash.target_layers"),
    "fc width": (lambda p: {"tensors": {"fc.weight": np.zeros((p.n_embd, 2 * p.n_embd), np.float32)}},
                 r"fc input width 128 != 3 target layers x 64"),
    "fewer layers than fc": (lambda p: {"kv": {"dflash.target_layers": ([1, 2], T.ARRAY, T.INT32)}},
                             r"fc input width 192 != 2 target layers x 64"),
    "hidden size": (lambda p: {"kv": {"dflash.embedding_length": (32, T.UINT32)}}, "hidden size 32 != target 64"),
    "no mask token": (lambda p: {"drop": ("tokenizer.ggml.mask_token_id",)}, "no usable mask token"),
    "mask past vocab": (lambda p: {"kv": {"tokenizer.ggml.mask_token_id": (p.n_vocab, T.UINT32)}},
                        "no usable mask token"),
    "block size 1": (lambda p: {"kv": {"dflash.block_size": (1, T.UINT32)}}, r"block size 1 outside \[2, 64\]"),
    "block size 1000": (lambda p: {"kv": {"dflash.block_size": (1000, T.UINT32)}}, "block size 1000 outside"),
    "not a drafter": (lambda p: {"arch": "llama"}, "not a DFlash drafter"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_broken_drafter_is_refused(p, tmp_path, case):
    make, message = CASES[case]
    path = broken(p, tmp_path, **make(p))
    with pytest.raises(IncompatibleDrafter, match=message):
        load_pair(p.target, path)


def test_eos_difference_alone_is_a_warning(p, tmp_path, caplog):
    path = broken(p, tmp_path, kv={"tokenizer.ggml.eos_token_id": (3, T.UINT32)})
    with caplog.at_level(logging.WARNING, logger="pydflash.compat.pairing"):
        pair = load_pair(p.target, path)
    pair.close()
    assert "drafter EOS 3 differs from target EOS 2" in caplog.text


def test_target_given_as_drafter_is_refused(p):
    with pytest.raises(IncompatibleDrafter, match="'qwen3' model, not a DFlash drafter"):
        load_pair(p.target, p.target)


def test_digest_ignores_special_ids_but_not_merges(p, tmp_path):
    base = pairing.vocab_digest(read_metadata(p.drafter))
    assert base == pairing.vocab_digest(read_metadata(p.target))
    eos = broken(p, tmp_path, kv={"tokenizer.ggml.eos_token_id": (3, T.UINT32)})
    assert pairing.vocab_digest(read_metadata(eos)) == base
    merged = rewrite_gguf(p.drafter, tmp_path / "merges.gguf",
                          kv={"tokenizer.ggml.merges": (["a b"], T.ARRAY, T.STRING)})
    assert pairing.vocab_digest(read_metadata(merged)) != base


@pytest.mark.real_model
def test_vocab_digest_is_fast_on_gemma3(gemma_path):
    """262k tokens: gguf-py's GGUFReader takes over a minute here; our header walk + raw-byte hash < 1 s."""
    gguf_meta._read_cached.cache_clear()  # time a real read, not the session cache
    t0 = time.perf_counter()
    meta = read_metadata(gemma_path)
    t1 = time.perf_counter()
    digest = pairing.vocab_digest(meta)
    t2 = time.perf_counter()
    print(f"read_metadata {t1 - t0:.3f} s, vocab_digest {t2 - t1:.3f} s")
    assert len(meta.get("tokenizer.ggml.tokens")) == 262144 and len(digest) == 64
    assert t2 - t0 < 3.0  # ~0.5 s measured on the shared 2-core CPU; headroom for load
