"""Target features for every decoder architecture (patches/0001) and the C-linkage ext API (patches/0002).

- On architectures upstream already fills (llama, qwen3), our generic l_out path gives bit-identical features.
- On gemma3 (not filled upstream; stock llama.cpp aborts) the features exist and are finite.
- The last layer's output, through the target's own output norm and lm_head read with gguf-py in numpy,
  reproduces llama.cpp's logits.
"""

from __future__ import annotations

import os
import subprocess
import sys

import gguf
import numpy as np
import pytest

from pydflash.native import Context, ContextParams, Model, TokenBatch

PROBE = os.path.join(os.path.dirname(__file__), "_probe_features.py")


def probe(model_path, out, layers, n_ubatch=16, generic=False):
    env = dict(os.environ)
    env.pop("PYDFLASH_LAYER_INP_FROM_L_OUT", None)
    if generic:
        env["PYDFLASH_LAYER_INP_FROM_L_OUT"] = "1"
    subprocess.run([sys.executable, PROBE, str(model_path), str(out), ",".join(map(str, layers)), str(n_ubatch)],
                   check=True, env=env, capture_output=True, timeout=120)
    return np.load(out)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_generic_path_is_bit_identical_to_upstream(arch, tiny, tmp_path):
    p = tiny(arch)
    layers = list(range(1, p.n_layer))
    upstream = probe(p.target, tmp_path / "up.npy", layers)
    generic = probe(p.target, tmp_path / "gen.npy", layers, generic=True)
    assert upstream.shape == (48, len(layers) * p.n_embd)
    assert np.array_equal(upstream, generic)
    # and the rows really differ between layers (not one tensor served for all)
    n = p.n_embd
    assert not np.array_equal(upstream[:, :n], upstream[:, n : 2 * n])


def test_gemma3_features_exist_and_are_finite(tiny, tmp_path):
    p = tiny("gemma3")
    layers = list(range(1, p.n_layer))
    feats = probe(p.target, tmp_path / "g.npy", layers, n_ubatch=16)  # 48 tokens = 3 ubatches
    assert feats.shape == (48, len(layers) * p.n_embd)
    assert np.isfinite(feats).all()
    assert np.abs(feats).max() > 0
    # every ubatch's rows were kept, not only the last one's
    assert np.abs(feats[:16]).sum() > 0 and np.abs(feats[16:32]).sum() > 0


@pytest.mark.real_model
def test_real_gemma3_features_finite(gemma_path, tmp_path):
    feats = probe(gemma_path, tmp_path / "real.npy", [1, 9, 16], n_ubatch=32)
    assert feats.shape == (48, 3 * 640)
    assert np.isfinite(feats).all()


def _rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
def test_last_layer_features_reproduce_logits(arch, tiny):
    """logits == lm_head(output_norm(output of the last layer)) within 1e-3 relative (F32 tiny model)."""
    p = tiny(arch)
    model = Model(p.target)
    L = model.n_layer
    ctx = Context(model, ContextParams(n_ctx=128, n_batch=32, n_ubatch=32, feature_layers=(L,), backend_greedy=False))
    tokens = [(i * 13 + 5) % (model.n_vocab - 16) + 8 for i in range(24)]
    b = TokenBatch(32)
    b.add(tokens, 0, 0, True)  # every position outputs logits, so the last layer keeps all rows
    ctx.decode(b)
    h = ctx.features(len(tokens))
    reader = gguf.GGUFReader(str(p.target))
    t = {x.name: np.asarray(x.data, dtype=np.float32) for x in reader.tensors}
    eps = float(reader.fields[f"{arch}.attention.layer_norm_rms_epsilon"].contents())
    head = t.get("output.weight", t["token_embd.weight"])  # tied embeddings when there is no output tensor
    logits_np = _rms_norm(h, t["output_norm.weight"], eps) @ head.T
    for i in range(len(tokens)):
        ref = ctx.logits(i)
        err = np.abs(logits_np[i] - ref).max() / (np.abs(ref).max() + 1e-9)
        assert err < 1e-3, f"position {i}: relative error {err:.2e}"
        assert int(np.argmax(logits_np[i])) == int(np.argmax(ref))


def test_ext_api_has_c_linkage():
    """patches/0002: the DFlash ext functions are exported under their plain C names."""
    from pydflash.native import _lib

    for name in ("llama_set_embeddings_layer_inp", "llama_get_embeddings_layer_inp",
                 "llama_model_target_layer_ids", "llama_model_target_layer_ids_n", "llama_get_ctx_other"):
        assert hasattr(_lib.lib, name), name
