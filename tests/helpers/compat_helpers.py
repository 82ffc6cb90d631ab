"""Helpers for the compat and parity tests: one drafter noise block through our GGUF path, and GGUF rewriting.

Not a test module. The GGUF path is the engine's: target features of a context injected into the drafter's KV,
then one non-causal forward over the noise block [anchor, MASK x (B-1)] placed right after the context.
"""

from __future__ import annotations

import pathlib

import gguf
import numpy as np

from pydflash.compat.gguf_meta import read_metadata
from pydflash.native import Context, ContextParams, TokenBatch

CTX_TOKENS = [(i * 37 + 11) % 300 + 261 for i in range(12)]  # normal tokens of the tiny vocab
ANCHOR = 300


def block_logits(pair, ctx_tokens=CTX_TOKENS, anchor=ANCHOR, all_layers=False):
    """(target features [n, n_layers*E] in pair.feature_layers order, drafter logits [B, n_vocab]).

    all_layers: also return HF's ``output_hidden_states`` list as llama.cpp layer inputs ([n_layer+1] arrays of
    [n, E]; entry i = input of layer i = output of layer i-1), for the reference's own feature selection. Entries
    0 (the embeddings) and n_layer (HF applies the final norm there; llama.cpp only keeps output rows) are NaN:
    a drafter selecting them would fail parity loudly.
    """
    tgt, dft = pair.target, pair.drafter
    n, B = len(ctx_tokens), pair.block_size
    layers = tuple(range(1, tgt.n_layer)) if all_layers else pair.feature_layers
    tctx = Context(tgt, ContextParams(n_ctx=128, n_batch=64, n_ubatch=64, feature_layers=layers,
                                      backend_greedy=False))
    batch = TokenBatch(64)
    batch.add(ctx_tokens, 0, 0, False)
    tctx.decode(batch)
    every = tctx.features(n)
    E = tgt.n_embd
    per_layer = {lid: every[:, k * E : (k + 1) * E] for k, lid in enumerate(layers)}
    feats = np.concatenate([per_layer[lid] for lid in pair.feature_layers], axis=1)

    dctx = Context(dft, ContextParams(n_ctx=128, n_batch=64, n_ubatch=64, backend_greedy=False),
                   ctx_other=tctx, causal=False)
    dctx.inject(feats, np.arange(n), np.zeros(n, dtype=np.int32))
    batch.clear()
    batch.add([anchor] + [pair.mask_token] * (B - 1), n, 0, True)
    dctx.decode(batch)
    logits = np.stack([dctx.logits(i) for i in range(B)])
    dctx.close()
    tctx.close()
    hidden = None
    if all_layers:
        nan = np.full((n, E), np.nan, np.float32)
        hidden = [nan] + [per_layer[lid] for lid in layers] + [nan]
    return feats, logits, hidden


def rewrite_gguf(src, dst, kv: dict | None = None, drop: tuple = (), tensors: dict | None = None,
                 arch: str | None = None) -> pathlib.Path:
    """Copy a GGUF with some metadata set (kv: key -> (value, GGUFValueType[, element type])), keys dropped and
    tensors replaced (name -> float32 array in numpy order, or None to drop)."""
    meta = read_metadata(src)
    kv, tensors = kv or {}, tensors or {}
    w = gguf.GGUFWriter(str(dst), arch or meta.arch)
    for key, value in meta.kv.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.alignment") or key in drop:
            continue
        if key in kv:
            continue
        vtype, etype = meta.types[key]
        w.add_key_value(key, value, gguf.GGUFValueType(vtype),
                        sub_type=None if etype is None else gguf.GGUFValueType(etype))
    for key, spec in kv.items():
        w.add_key_value(key, spec[0], spec[1], sub_type=spec[2] if len(spec) > 2 else None)
    raw = np.memmap(src, np.uint8, "r")
    for t in meta.tensors.values():
        if t.name in tensors:
            if tensors[t.name] is not None:
                w.add_tensor(t.name, np.ascontiguousarray(tensors[t.name], dtype=np.float32))
            continue
        rows = int(np.prod(t.dims[1:]))
        data = raw[t.offset : t.offset + t.nbytes].reshape(*reversed(t.dims[1:]), t.nbytes // rows)
        w.add_tensor(t.name, data, raw_dtype=gguf.GGMLQuantizationType(t.ggml_type))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return pathlib.Path(dst)


def target_tables(target_path):
    """(token embedding [V, E], lm_head [V, E]) of a tiny F32 target, read with gguf-py."""
    reader = gguf.GGUFReader(str(target_path))
    t = {x.name: np.asarray(x.data, dtype=np.float32) for x in reader.tensors
         if x.name in ("token_embd.weight", "output.weight")}
    embd = t["token_embd.weight"]
    return embd, t.get("output.weight", embd)
