"""Tests for pydflash.factory: determinism, on-disk layouts, and (when the native build
exists) that llama.cpp loads and runs every tiny target and its DFlash drafter.

The native tests use llama-cpp-python's low-level bindings against our libllama
(LLAMA_CPP_LIB_PATH, default .cache/native/current/lib). They skip, saying why, when the
library directory is absent.
"""

from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file

from pydflash.factory import ARCHS, TinyPair, build_vocab, write_tiny_pair
from pydflash.factory.drafter import gguf_name

ROOT = Path(__file__).resolve().parents[2]
LIB_DIR = Path(os.environ.get("LLAMA_CPP_LIB_PATH", ROOT / ".cache" / "native" / "current" / "lib"))
FILES = ("target", "drafter", "drafter_fork", "safetensors", "config_json")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict[str, TinyPair]:
    root = tmp_path_factory.mktemp("tiny")
    return {arch: write_tiny_pair(root / arch, arch=arch, seed=0) for arch in ARCHS}


def _fields(path: Path) -> dict:
    r = gguf.GGUFReader(path)
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}


def _tensors(path: Path) -> dict[str, np.ndarray]:
    return {t.name: np.array(t.data) for t in gguf.GGUFReader(path).tensors}


# ---------------------------------------------------------------- determinism and cache


@pytest.mark.parametrize("arch", ARCHS)
def test_same_seed_gives_identical_bytes(tmp_path, arch):
    a = write_tiny_pair(tmp_path / "a", arch=arch, seed=7, drafter_layers=2)
    b = write_tiny_pair(tmp_path / "b", arch=arch, seed=7, drafter_layers=2)
    for f in FILES:
        assert getattr(a, f).read_bytes() == getattr(b, f).read_bytes(), f


def test_different_seed_gives_different_weights(tmp_path):
    a = write_tiny_pair(tmp_path / "a", arch="qwen3", seed=1)
    b = write_tiny_pair(tmp_path / "b", arch="qwen3", seed=2)
    for f in ("target", "drafter", "safetensors"):
        assert getattr(a, f).read_bytes() != getattr(b, f).read_bytes(), f


def test_target_weights_do_not_depend_on_drafter_params(tmp_path):
    a = write_tiny_pair(tmp_path / "a", arch="llama", seed=3, drafter_layers=1)
    b = write_tiny_pair(tmp_path / "b", arch="llama", seed=3, drafter_layers=2, embedding_scale_key=2.0)
    assert a.target.read_bytes() == b.target.read_bytes()


def test_cache_skips_rewrite_and_rebuilds_on_new_params(tmp_path):
    p = write_tiny_pair(tmp_path, arch="qwen3", seed=0)
    stamp = {f: getattr(p, f).stat().st_mtime_ns for f in FILES}
    write_tiny_pair(tmp_path, arch="qwen3", seed=0)
    assert {f: getattr(p, f).stat().st_mtime_ns for f in FILES} == stamp

    q = write_tiny_pair(tmp_path, arch="qwen3", seed=0, embedding_scale_key=3.0)
    assert _fields(q.drafter)["dflash.embedding_scale"] == pytest.approx(3.0)
    assert json.loads((tmp_path / "manifest.json").read_text())["params"]["embedding_scale_key"] == 3.0


def test_cache_rewrites_a_truncated_file(tmp_path):
    p = write_tiny_pair(tmp_path, arch="llama", seed=0)
    good = p.target.read_bytes()
    p.target.write_bytes(good[:100])
    write_tiny_pair(tmp_path, arch="llama", seed=0)
    assert p.target.read_bytes() == good


def test_bad_arguments_raise(tmp_path):
    with pytest.raises(ValueError):
        write_tiny_pair(tmp_path, arch="gpt2")
    with pytest.raises(ValueError):
        write_tiny_pair(tmp_path, dtype="q4_0")
    with pytest.raises(ValueError):
        write_tiny_pair(tmp_path, drafter_layers=0)


# ---------------------------------------------------------------- on-disk layouts


@pytest.mark.parametrize("arch", ARCHS)
def test_target_gguf_keys_and_shapes(pairs, arch):
    p = pairs[arch]
    kv = _fields(p.target)
    assert kv["general.architecture"] == arch
    assert kv[f"{arch}.embedding_length"] == p.n_embd == 64
    assert kv[f"{arch}.block_count"] == p.n_layer
    assert kv[f"{arch}.attention.head_count_kv"] == 2
    assert kv["tokenizer.ggml.model"] == "llama"
    assert kv["tokenizer.ggml.mask_token_id"] == p.mask_token_id
    assert kv["tokenizer.ggml.eos_token_id"] == p.eos_id
    assert 300 <= len(kv["tokenizer.ggml.tokens"]) == p.n_vocab <= 600

    t = _tensors(p.target)
    assert t["token_embd.weight"].shape == (p.n_vocab, 64)
    assert t["blk.0.attn_k.weight"].shape == (32, 64)  # 2 KV heads x 16
    assert t["blk.0.ffn_down.weight"].shape == (64, 128)
    assert "output.weight" in t  # untied by default: tied tiny models loop sooner
    assert ("blk.0.attn_q_norm.weight" in t) == (arch != "llama")
    if arch == "gemma3":
        assert kv["gemma3.attention.sliding_window"] == 64
        assert kv["gemma3.attention.sliding_window_pattern"] == 3
        assert "blk.0.post_ffw_norm.weight" in t


@pytest.mark.parametrize("arch", ARCHS)
def test_upstream_drafter_layout(pairs, arch):
    p = pairs[arch]
    kv = _fields(p.drafter)
    assert kv["general.architecture"] == "dflash"
    assert kv["dflash.target_layers"] == [i + 1 for i in p.target_layer_ids]  # layer-input convention
    assert len(set(p.target_layer_ids)) == 3 and max(p.target_layer_ids) < p.n_layer
    assert kv["dflash.block_size"] == 16
    assert kv["dflash.embedding_length"] == p.n_embd
    assert "dflash.embedding_scale" not in kv  # default: compat supplies it
    assert kv["tokenizer.ggml.tokens"] == _fields(p.target)["tokenizer.ggml.tokens"]

    t = _tensors(p.drafter)
    assert "token_embd.weight" not in t and "output.weight" not in t  # borrowed via ctx_other
    assert t["fc.weight"].shape == (64, 3 * 64)
    for name in ("enc.output_norm.weight", "output_norm.weight", "blk.0.ffn_norm.weight", "blk.0.attn_k_norm.weight"):
        assert name in t


def test_tied_output_drops_the_head(tmp_path):
    p = write_tiny_pair(tmp_path, arch="gemma3", tied_output=True)
    assert p.tied_output and "output.weight" not in _tensors(p.target)
    assert json.loads((tmp_path / "manifest.json").read_text())["params"]["tied_output"] is True


def test_embedding_scale_key_written_on_request(tmp_path):
    p = write_tiny_pair(tmp_path, arch="gemma3", embedding_scale_key=8.0)
    assert _fields(p.drafter)["dflash.embedding_scale"] == pytest.approx(8.0)
    assert p.embedding_scale == pytest.approx(8.0)  # sqrt(64)
    assert "dflash-draft.embedding_scale" not in _fields(p.drafter_fork)


def test_fork_drafter_layout(pairs):
    p = pairs["gemma3"]
    kv = _fields(p.drafter_fork)
    assert kv["general.architecture"] == "dflash-draft"
    assert kv["dflash-draft.dflash.target_layer_ids"] == list(p.target_layer_ids)  # raw HF ids
    assert kv["dflash-draft.dflash.block_size"] == 16
    assert kv["dflash-draft.dflash.n_target_features"] == 3 * p.n_embd
    assert kv["dflash-draft.dflash.mask_token_id"] == p.mask_token_id
    t = _tensors(p.drafter_fork)
    assert {"dflash_fc.weight", "dflash_hidden_norm.weight", "blk.0.post_attention_norm.weight"} <= set(t)
    assert "blk.0.ffn_norm.weight" not in t and "fc.weight" not in t


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_safetensors_equal_both_gguf_layouts(tmp_path, dtype):
    p = write_tiny_pair(tmp_path, arch="qwen3", drafter_layers=2, dtype=dtype)
    hf = load_file(p.safetensors)
    up, fork = _tensors(p.drafter), _tensors(p.drafter_fork)
    assert len(hf) == len(up) == len(fork) == 3 + 2 * 11
    for name, arr in hf.items():
        assert arr.dtype == (np.float16 if dtype == "f16" else np.float32)
        for layout, got in (("upstream", up), ("fork", fork)):
            g = got[gguf_name(name, layout)]
            assert g.shape == arr.shape, (name, layout)
            np.testing.assert_array_equal(g.astype(np.float32), arr.astype(np.float32))


def test_config_json(pairs):
    for arch, p in pairs.items():
        cfg = json.loads(p.config_json.read_text())
        dc = cfg["dflash_config"]
        assert dc["target_layer_ids"] == list(p.target_layer_ids)
        assert dc["mask_token_id"] == p.mask_token_id and dc["block_size"] == 16
        assert dc["input_embedding_scale"] == pytest.approx(8.0 if arch == "gemma3" else 1.0)
        assert cfg["hidden_size"] == p.n_embd and cfg["vocab_size"] == p.n_vocab
        assert cfg["num_hidden_layers"] == p.drafter_layers


def test_vocab_has_byte_fallback_and_specials():
    v = build_vocab()
    assert v.tokens[v.mask_id] == "<mask>" and v.tokens[v.eos_id] == "</s>"
    assert all(f"<0x{b:02X}>" in v.tokens for b in range(256))


# ---------------------------------------------------------------- llama.cpp (native)


class _Native:
    """Just enough of llama.cpp's C API (via llama_cpp.llama_cpp) to run a target and a drafter."""

    def __init__(self):
        import llama_cpp.llama_cpp as L

        self.L = L
        lib = L._lib
        # exported with C linkage by patches/0002; llama-cpp-python does not declare them
        lib.llama_set_embeddings_layer_inp.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_bool]
        lib.llama_set_embeddings_layer_inp.restype = None
        lib.llama_get_embeddings_layer_inp.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
        lib.llama_get_embeddings_layer_inp.restype = ctypes.POINTER(ctypes.c_float)
        self.lib = lib
        # pydflash.native owns the process-wide log callback (a callback set here would dangle once this
        # module-scoped object is collected, and crash the next test that logs)
        import pydflash.native._lib  # noqa: F401
        L.llama_backend_init()

    def load(self, path: Path):
        model = self.L.llama_model_load_from_file(str(path).encode(), self.L.llama_model_default_params())
        assert model, f"llama.cpp failed to load {path}"
        return model

    def context(self, model, n_ctx: int = 512, other=None):
        cp = self.L.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = n_ctx
        cp.n_threads = cp.n_threads_batch = 2
        if other is not None:
            cp.ctx_other = other
        ctx = self.L.llama_init_from_model(model, cp)
        assert ctx, "llama_init_from_model failed"
        return ctx

    def tokenize(self, model, text: str, add_special: bool = True) -> list[int]:
        vocab = self.L.llama_model_get_vocab(model)
        raw = text.encode()
        buf = (self.L.llama_token * (len(raw) + 8))()
        n = self.L.llama_tokenize(vocab, raw, len(raw), buf, len(buf), add_special, False)
        assert n >= 0
        return list(buf[:n])

    def detokenize(self, model, tokens: list[int]) -> str:
        vocab = self.L.llama_model_get_vocab(model)
        arr = (self.L.llama_token * len(tokens))(*tokens)
        buf = ctypes.create_string_buffer(4096)
        n = self.L.llama_detokenize(vocab, arr, len(tokens), buf, len(buf), False, False)
        assert n >= 0
        return buf.raw[:n].decode(errors="replace")  # random models emit stray bytes

    def decode(self, ctx, tokens: list[int]) -> None:
        arr = (self.L.llama_token * len(tokens))(*tokens)
        assert self.L.llama_decode(ctx, self.L.llama_batch_get_one(arr, len(tokens))) == 0

    def logits(self, ctx, i: int, n_vocab: int) -> np.ndarray:
        return np.ctypeslib.as_array(self.L.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).copy()

    def greedy(self, ctx, prompt: list[int], n: int, n_vocab: int) -> list[int]:
        self.decode(ctx, prompt)
        out = []
        for _ in range(n):
            logits = self.logits(ctx, -1, n_vocab)
            assert np.isfinite(logits).all()
            out.append(int(np.argmax(logits)))
            self.decode(ctx, out[-1:])
        return out

    def process(self, ctx, rows: list[tuple[int | np.ndarray, int, bool]]) -> int:
        """llama_process one llama_batch_ext of (token id | feature row, pos, want logits) on seq 0."""
        L = self.L
        batch = L.llama_batch_ext_init(ctx)
        try:
            for item, pos, out in rows:
                if isinstance(item, np.ndarray):  # a feature row must stay alive until process()
                    embd = L.llama_embd(item.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, item.size)
                    idx = L.llama_batch_ext_add_embd(batch, 0, embd)
                else:
                    idx = L.llama_batch_ext_add_token(batch, 0, item)
                assert idx >= 0
                assert L.llama_batch_ext_set_pos(batch, idx, (L.llama_pos * 4)(pos, pos, pos, 0))
                if out:
                    L.llama_batch_ext_set_output_logits(batch, idx, True)
            return L.llama_process(ctx, L.LLAMA_PROCESS_TYPE_DECODE, batch)
        finally:
            L.llama_batch_ext_free(batch)


@pytest.fixture(scope="module")
def native() -> _Native:
    if not (LIB_DIR / "libllama.so").exists():
        pytest.skip(f"native llama.cpp not built: no libllama.so in {LIB_DIR}")
    os.environ.setdefault("LLAMA_CPP_LIB_PATH", str(LIB_DIR))  # read once, at import of llama_cpp
    pytest.importorskip("llama_cpp")
    return _Native()


PROMPT = "the people of the water made a long day"


@pytest.mark.parametrize("arch", ARCHS)
def test_llama_cpp_tokenizer_round_trips(native, pairs, arch):
    model = native.load(pairs[arch].target)
    try:
        text = "Hello, the world! 123 \u00fcn\u00efc\u00f6de \u2192 \U0001F600\nnext line"
        toks = native.tokenize(model, text, add_special=False)
        assert native.detokenize(model, toks) == text
        assert len(toks) < len(text.encode())  # word pieces actually merge
        assert native.tokenize(model, "x")[0] == pairs[arch].bos_id
    finally:
        native.L.llama_model_free(model)


@pytest.mark.parametrize("arch,tied", [(a, False) for a in ARCHS] + [("gemma3", True)])
def test_llama_cpp_target_greedy_generates_varied_tokens(native, pairs, tmp_path, arch, tied):
    p = write_tiny_pair(tmp_path, arch=arch, tied_output=True) if tied else pairs[arch]
    model = native.load(p.target)
    ctx = native.context(model)
    try:
        assert native.L.llama_vocab_n_tokens(native.L.llama_model_get_vocab(model)) == p.n_vocab
        out = native.greedy(ctx, native.tokenize(model, PROMPT), 32, p.n_vocab)
        assert len(set(out)) >= (4 if tied else 8), out  # not one token repeated forever
    finally:
        native.L.llama_free(ctx)  # free the context before its model
        native.L.llama_model_free(model)


@pytest.mark.parametrize("arch,scale_key,tied", [(a, None, False) for a in ARCHS] + [("gemma3", 8.0, True)])
def test_llama_cpp_drafter_decodes_a_noise_block(native, pairs, tmp_path, arch, scale_key, tied):
    if scale_key is None and not tied:
        p = pairs[arch]
    else:  # drafter carries dflash.embedding_scale; its head is the target's token_embd
        p = write_tiny_pair(tmp_path, arch=arch, embedding_scale_key=scale_key, tied_output=tied)
    L, B = native.L, p.block_size
    t_model = native.load(p.target)
    t_ctx = native.context(t_model)
    d_model = native.load(p.drafter)
    d_ctx = None
    try:
        # target features: inputs of the stored (layer-input) indices, for every prompt token
        for lid in p.target_layer_inputs:
            native.lib.llama_set_embeddings_layer_inp(t_ctx, lid, True)
        prompt = native.tokenize(t_model, PROMPT)
        native.decode(t_ctx, prompt)
        n = len(prompt)
        feats = np.concatenate([
            np.ctypeslib.as_array(native.lib.llama_get_embeddings_layer_inp(t_ctx, lid), shape=(n, p.n_embd)).copy()
            for lid in p.target_layer_inputs
        ], axis=1)  # [n, n_target_layers * n_embd]
        assert feats.shape == (n, p.n_embd_features) and np.isfinite(feats).all()

        d_ctx = native.context(d_model, other=t_ctx)  # borrows token_embd / output from the target
        L.llama_set_causal_attn(d_ctx, False)
        assert L.llama_vocab_mask(L.llama_model_get_vocab(d_model)) == p.mask_token_id

        def draft(rows: np.ndarray) -> np.ndarray:
            assert native.process(d_ctx, [(np.ascontiguousarray(r), i, False) for i, r in enumerate(rows)]) == 0
            anchor = prompt[-1]
            block = [(anchor if i == 0 else p.mask_token_id, n + i, True) for i in range(B)]
            assert native.process(d_ctx, block) == 0
            logits = np.stack([native.logits(d_ctx, i, p.n_vocab) for i in range(1, B)])
            L.llama_memory_seq_rm(L.llama_get_memory(d_ctx), 0, 0, -1)
            return logits  # [B-1, n_vocab]: positions 1..B-1 carry the drafts

        logits = draft(feats)
        assert logits.shape == (B - 1, p.n_vocab) and np.isfinite(logits).all()
        # the drafter must actually read the injected features
        assert not np.allclose(draft(feats[::-1].copy()), logits)
    finally:
        if d_ctx is not None:
            L.llama_free(d_ctx)
        L.llama_free(t_ctx)
        L.llama_model_free(d_model)
        L.llama_model_free(t_model)
