"""Fork-era ``dflash-draft`` GGUFs: converted once to upstream layout, then indistinguishable from it."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from gguf import GGUFValueType as T

from tests.helpers.compat_helpers import block_logits, rewrite_gguf
from pydflash import api
from pydflash.compat import fork_layout
from pydflash.compat.gguf_meta import read_metadata
from pydflash.config import EngineConfig
from pydflash.errors import ModelLoadError
from pydflash.pair import load_pair

FORK = "dflash-draft"


def test_key_and_tensor_names():
    assert fork_layout.upstream_key(f"{FORK}.dflash.target_layer_ids") == "dflash.target_layers"
    assert fork_layout.upstream_key(f"{FORK}.target_layer_ids") == "dflash.target_layers"  # older spelling
    assert fork_layout.upstream_key(f"{FORK}.dflash.block_size") == "dflash.block_size"
    assert fork_layout.upstream_key(f"{FORK}.attention.head_count") == "dflash.attention.head_count"
    for dropped in ("mask_token_id", "n_target_layers", "n_target_features"):
        assert fork_layout.upstream_key(f"{FORK}.dflash.{dropped}") is None
    assert fork_layout.upstream_key("tokenizer.ggml.tokens") == "tokenizer.ggml.tokens"
    assert fork_layout.upstream_tensor_name("dflash_fc.weight") == "fc.weight"
    assert fork_layout.upstream_tensor_name("dflash_hidden_norm.weight") == "enc.output_norm.weight"
    assert fork_layout.upstream_tensor_name("blk.3.post_attention_norm.weight") == "blk.3.ffn_norm.weight"
    assert fork_layout.upstream_tensor_name("blk.3.attn_q.weight") == "blk.3.attn_q.weight"


@pytest.fixture
def fork_copy(tiny, tmp_path):
    p = tiny("gemma3")
    dst = tmp_path / "drafter-fork.gguf"
    shutil.copy(p.drafter_fork, dst)
    return p, dst


def _tensor_bytes(meta, name):
    t = meta.tensors[name]
    with open(meta.path, "rb") as f:
        f.seek(t.offset)
        return t.dims, t.ggml_type, f.read(t.nbytes)


def test_conversion_reproduces_the_upstream_file(fork_copy):
    """Same keys and values as the factory's upstream drafter (but general.name), same tensor bytes."""
    p, src = fork_copy
    up, conv = read_metadata(p.drafter), read_metadata(fork_layout.convert_cached(src))
    assert conv.arch == "dflash"
    diff = {k for k in set(up.kv) | set(conv.kv) if up.kv.get(k) != conv.kv.get(k)}
    assert diff == {"general.name"}
    assert conv.get("dflash.target_layers") == [i + 1 for i in p.target_layer_ids]
    assert set(up.tensors) == set(conv.tensors)
    for name in up.tensors:
        assert _tensor_bytes(up, name) == _tensor_bytes(conv, name), name


def test_conversion_is_cached_next_to_the_file(fork_copy):
    _, src = fork_copy
    first = fork_layout.convert_cached(src)
    assert first.parent == src.parent and first.name.startswith("drafter-fork.upstream-")
    mtime = first.stat().st_mtime_ns
    assert fork_layout.convert_cached(src) == first and first.stat().st_mtime_ns == mtime
    assert not list(src.parent.glob("*.tmp"))


@pytest.mark.parametrize("drop, expect", [
    ((f"{FORK}.dflash.mask_token_id",), 4),  # tokenizer.ggml.mask_token_id still there
    ((f"{FORK}.dflash.mask_token_id", "tokenizer.ggml.mask_token_id"), 4),  # found as "<mask>" in the vocab
])
def test_mask_token_is_supplied(fork_copy, tmp_path, drop, expect):
    _, src = fork_copy
    path = rewrite_gguf(src, tmp_path / "nomask.gguf", drop=drop)
    conv = read_metadata(fork_layout.convert_cached(path))
    assert conv.get("tokenizer.ggml.mask_token_id") == expect


def test_gemma_default_mask_when_nothing_names_one(fork_copy, tmp_path, caplog):
    _, src = fork_copy
    meta = read_metadata(src)
    tokens = [("<msk>" if t == "<mask>" else t) for t in meta.get("tokenizer.ggml.tokens")]
    path = rewrite_gguf(src, tmp_path / "anon.gguf",
                        drop=(f"{FORK}.dflash.mask_token_id", "tokenizer.ggml.mask_token_id"),
                        kv={"tokenizer.ggml.tokens": (tokens, T.ARRAY, T.STRING)})
    conv = read_metadata(fork_layout.convert_cached(path))
    assert conv.get("tokenizer.ggml.mask_token_id") == fork_layout.GEMMA_FORK_MASK
    assert "assuming Gemma's id 4" in caplog.text


def test_older_layer_key_spelling(fork_copy, tmp_path):
    p, src = fork_copy
    ids = read_metadata(src).get(f"{FORK}.dflash.target_layer_ids")
    path = rewrite_gguf(src, tmp_path / "old.gguf", drop=(f"{FORK}.dflash.target_layer_ids",),
                        kv={f"{FORK}.target_layer_ids": (ids, T.ARRAY, T.INT32)})
    assert read_metadata(fork_layout.convert_cached(path)).get("dflash.target_layers") == [i + 1 for i in ids]


def test_fork_file_without_layer_ids_is_refused(fork_copy, tmp_path):
    _, src = fork_copy
    path = rewrite_gguf(src, tmp_path / "nolayers.gguf", drop=(f"{FORK}.dflash.target_layer_ids",))
    with pytest.raises(ModelLoadError, match="none of dflash-draft.dflash.target_layer_ids"):
        fork_layout.convert_cached(path)


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_noise_block_logits_are_bit_identical(tiny, arch):
    p = tiny(arch)
    out = {}
    for name in ("drafter", "drafter_fork"):
        pair = load_pair(p.target, getattr(p, name))
        try:
            out[name] = block_logits(pair)
        finally:
            pair.close()
    assert np.array_equal(out["drafter"][0], out["drafter_fork"][0])  # same feature layers
    assert np.array_equal(out["drafter"][1], out["drafter_fork"][1])


def test_engine_runs_identically_with_either_layout(tiny):
    """Same generated tokens, same commit per step, same per-position draft/accept counts."""
    p = tiny("gemma3")
    runs = {}
    for name in ("drafter", "drafter_fork"):
        with api.load(p.target, getattr(p, name), config=EngineConfig(n_ctx_slot=512)) as llm:
            prompt = llm.tokenize("the quick brown fox jumps over the lazy dog and")
            steps = [ev.tokens for ev in llm.stream(prompt, max_tokens=48, ignore_eos=True)]
            last = llm.generate(prompt, max_tokens=48, ignore_eos=True)
        runs[name] = (steps, last.tokens, last.stats.drafted_hist, last.stats.accept_hist, last.stats.n_accepted)
    assert runs["drafter"] == runs["drafter_fork"]
    steps, tokens, drafted, _, _ = runs["drafter"]
    assert sum(steps, []) == tokens and len(tokens) == 48 and sum(drafted) > 0
