"""Give a drafter its own, reduced lm_head: the target's embedding rows for a chosen subset of tokens.

Why: a drafter shares the target's lm_head, so every draft position multiplies by the full vocabulary. For a
small target with a huge vocabulary (Gemma-3-270M: 262144 x 640) that head is about as large as the rest of the
model, and the drafter's forward costs nearly as much as the target's. Upstream's dflash graph already supports
a reduced draft vocabulary: an ``output.weight`` of [n_embd, n_draft] rows plus a ``d2t`` tensor mapping draft
rows to target ids, scattered back into full-vocabulary logits (-inf elsewhere). Drafts are then restricted to the
subset; verification is unchanged, so output stays exactly the target's. Pick the subset by frequency in text the
target generates (``token_counts`` below), so that nearly every token the target would accept remains draftable.

``d2t`` is written as I32 by default: with it, our llama.cpp (patches/0011) answers a greedy drafter with the
argmax of the reduced logits mapped through d2t, and never scatters 262,144 floats per row. Upstream reads only an
I64 ``d2t``; ``d2t_type="I64"`` writes that (the scatter then always runs).
"""

from __future__ import annotations

import pathlib
from collections import Counter
from typing import Iterable, Sequence

import gguf
import numpy as np

from ..errors import IncompatibleDrafter
from .gguf_meta import read_metadata

HEAD_TYPES = {"F32": gguf.GGMLQuantizationType.F32, "F16": gguf.GGMLQuantizationType.F16,
              "Q8_0": gguf.GGMLQuantizationType.Q8_0,
              "Q4_0": gguf.GGMLQuantizationType.Q4_0}
D2T_TYPES = {"I32": np.int32, "I64": np.int64}


def token_counts(token_lists: Iterable[Sequence[int]]) -> Counter:
    c: Counter = Counter()
    for toks in token_lists:
        c.update(toks)
    return c


def choose_tokens(counts: Counter, n: int, always: Iterable[int] = ()) -> list[int]:
    """The n most frequent ids (ties by id), plus any ids that must stay draftable, sorted."""
    keep = set(always)
    for tok, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(keep) >= n:
            break
        keep.add(int(tok))
    return sorted(keep)


def _embedding_rows(target: pathlib.Path, ids: Sequence[int]) -> np.ndarray:
    """Dequantized rows of the target's output head (its own ``output.weight``, else the tied ``token_embd``)."""
    meta = read_metadata(target)
    info = meta.tensors.get("output.weight") or meta.tensors["token_embd.weight"]
    n_embd, n_vocab = info.dims[0], info.dims[1]
    qtype = gguf.GGMLQuantizationType(info.ggml_type)
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    row_bytes = n_embd // block * type_size
    mm = np.memmap(target, dtype=np.uint8, mode="r", offset=info.offset, shape=(n_vocab, row_bytes))
    rows = np.asarray(mm[np.asarray(ids)])  # only the chosen rows are read
    return gguf.quants.dequantize(rows, qtype).reshape(len(ids), n_embd).astype(np.float32)


def write_reduced_head(drafter: str | pathlib.Path, target: str | pathlib.Path, ids: Sequence[int],
                       out: str | pathlib.Path, head_type: str = "Q8_0", d2t_type: str = "I32") -> pathlib.Path:
    """Copy ``drafter`` to ``out`` with an own lm_head restricted to ``ids`` (target token ids)."""
    drafter, target, out = pathlib.Path(drafter), pathlib.Path(target), pathlib.Path(out)
    dmeta = read_metadata(drafter)
    if dmeta.arch != "dflash":
        raise IncompatibleDrafter(f"{drafter.name} is '{dmeta.arch}', not an upstream-layout dflash drafter")
    if "output.weight" in dmeta.tensors or "d2t" in dmeta.tensors:
        raise IncompatibleDrafter(f"{drafter.name} already has its own head")
    if d2t_type not in D2T_TYPES:
        raise ValueError(f"d2t type must be one of {sorted(D2T_TYPES)}")
    ids = sorted({int(i) for i in ids})
    n_vocab = len(dmeta.get("tokenizer.ggml.tokens") or [])
    if not ids or ids[0] < 0 or (n_vocab and ids[-1] >= n_vocab):
        raise ValueError("token ids must be inside the vocabulary")
    head = _embedding_rows(target, ids)
    w = gguf.GGUFWriter(str(out), "dflash")
    for key, value in dmeta.kv.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.alignment"):
            continue
        vtype, etype = dmeta.types[key]
        w.add_key_value(key, value, gguf.GGUFValueType(vtype),
                        sub_type=gguf.GGUFValueType(etype) if etype is not None else None)
    with open(drafter, "rb") as f:
        for t in dmeta.tensors.values():
            f.seek(t.offset)
            qt = gguf.GGMLQuantizationType(t.ggml_type)
            block, type_size = gguf.GGML_QUANT_SIZES[qt]
            # bytes copied untouched; GGUFWriter takes uint8 data with its byte shape (numpy order)
            byte_shape = [*reversed(t.dims[1:]), t.dims[0] // block * type_size]
            data = np.frombuffer(f.read(t.nbytes), dtype=np.uint8).reshape(byte_shape)
            w.add_tensor(t.name, data, raw_dtype=qt)
    qtype = HEAD_TYPES[head_type]
    if qtype == gguf.GGMLQuantizationType.F32:
        w.add_tensor("output.weight", head)
    elif qtype == gguf.GGMLQuantizationType.F16:
        w.add_tensor("output.weight", head.astype(np.float16))
    else:
        w.add_tensor("output.weight", gguf.quants.quantize(head, qtype), raw_dtype=qtype)
    w.add_tensor("d2t", np.asarray(ids, dtype=D2T_TYPES[d2t_type]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
