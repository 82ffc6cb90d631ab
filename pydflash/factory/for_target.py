"""A random DFlash drafter for any target GGUF (e.g. the real Gemma-3-270M), in upstream layout.

Its drafts are useless, which is the point: it exercises the whole speculative machinery at the target's real
sizes (vocabulary, hidden width, feature layers) so that cost splits and synthetic-acceptance benchmarks measure
what a trained drafter of the same shape would cost. The target's tokenizer metadata is copied verbatim, so the
pairing check's vocabulary digest matches.
"""

from __future__ import annotations

from pathlib import Path

import gguf

from . import weights as W
from .drafter import DrafterSpec, _finish, drafter_weights

# Gemma's vocabulary reserves id 4 for "<mask>"; other targets fall back to their unknown/pad token.
DEFAULT_MASK_IDS = ("tokenizer.ggml.mask_token_id", "tokenizer.ggml.unknown_token_id",
                    "tokenizer.ggml.padding_token_id")


def _field(reader: gguf.GGUFReader, key: str):
    f = reader.fields.get(key)
    return f.contents() if f is not None else None


def write_random_drafter_for(target: str | Path, out: str | Path, n_layer: int = 1, seed: int = 0,
                             block_size: int = 16, head_dim: int = 64, n_ff: int = 1024) -> Path:
    out = Path(out)
    if out.exists():
        return out
    reader = gguf.GGUFReader(str(target))
    arch = _field(reader, "general.architecture")
    n_embd = int(_field(reader, f"{arch}.embedding_length"))
    n_tgt_layers = int(_field(reader, f"{arch}.block_count"))
    mask = next((int(v) for v in (_field(reader, k) for k in DEFAULT_MASK_IDS) if v is not None), 0)
    if arch in ("gemma", "gemma2", "gemma3"):
        mask = 4
    # spread between layer 1 and L-3 (HF ids), like the training recipe
    ids = tuple(sorted({1, n_tgt_layers // 2, n_tgt_layers - 3}))
    spec = DrafterSpec(
        n_layer=n_layer, n_embd=n_embd, n_head=max(1, n_embd // (2 * head_dim)), n_head_kv=1, head_dim=head_dim,
        n_ff=n_ff, n_ctx=int(_field(reader, f"{arch}.context_length") or 4096), rms_eps=1e-6, rope_base=1e6,
        target_layer_ids=ids, n_target_layers=n_tgt_layers, mask_token_id=mask,
        n_vocab=len(_field(reader, "tokenizer.ggml.tokens")), input_embedding_scale=1.0, block_size=block_size,
    )
    tensors = drafter_weights(spec, W.rng_for(seed, 7), "f32")
    tmp = out.with_suffix(".tmp")
    w = gguf.GGUFWriter(str(tmp), "dflash")
    w.add_name("pydflash-random-drafter")
    w.add_file_type(W.file_type("f32"))
    for key, val in (("context_length", spec.n_ctx), ("embedding_length", n_embd), ("block_count", n_layer),
                     ("feed_forward_length", n_ff), ("attention.head_count", spec.n_head),
                     ("attention.head_count_kv", spec.n_head_kv), ("attention.key_length", head_dim),
                     ("attention.value_length", head_dim)):
        w.add_uint32(f"dflash.{key}", val)
    w.add_float32("dflash.attention.layer_norm_rms_epsilon", spec.rms_eps)
    w.add_float32("dflash.rope.freq_base", spec.rope_base)
    w.add_uint32("dflash.block_size", block_size)
    w.add_array("dflash.target_layers", list(spec.layer_inputs))
    for name, field in reader.fields.items():
        if name.startswith("tokenizer."):
            vtype = field.types[0]
            w.add_key_value(name, field.contents(), vtype,
                            sub_type=field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None)
    if _field(reader, "tokenizer.ggml.mask_token_id") is None:
        w.add_uint32("tokenizer.ggml.mask_token_id", mask)
    _finish(w, tensors, "upstream", "f32")
    tmp.replace(out)
    return out
