"""Write a GGUF from a tensor plan one tensor at a time, so that memory holds one tensor, not the model.

gguf-py's GGUFWriter takes every tensor's name, shape and type up front (add_tensor_info: the header and tensor
info table come first in the file), then the data in the same order (write_tensor_data). Each array is made from the
plan right before it is written and dropped right after: the peak is set by the largest tensor, whatever the model's
depth (Qwen3-4B's 151,936 x 2560 embedding, drawn in f32 and cast to f16: 3.1 GB peak RSS for the whole 8.05 GB F16
target and for a 9-layer cut of it alike, measured on a CPU).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import gguf
import numpy as np

from . import weights as W


def write_streamed(path: Path, arch: str, add_keys: Callable[[gguf.GGUFWriter], None], plan: list[W.Planned],
                   rng: np.random.Generator, dtype: str, rename: Callable[[str], str] = str) -> Path:
    """path from plan: add_keys writes the metadata; rename maps a plan name to its GGUF name (drafters: HF names).

    Values are drawn in f32 and cast once to their storage type (W.storage_dtype: matrices f16 when dtype is "f16",
    norms f32), so the file holds the same draws as W.materialize(plan, rng, "f32") would, stored at dtype."""
    W.check_dtype(dtype)
    w = gguf.GGUFWriter(str(path), arch)
    add_keys(w)
    for p in plan:
        st = np.dtype(W.storage_dtype(len(p.shape), dtype))
        w.add_tensor_info(rename(p.name), p.shape, st, int(np.prod(p.shape)) * st.itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for p in plan:
        arr = W.make(p, rng, "f32").astype(W.storage_dtype(len(p.shape), dtype), copy=False)
        w.write_tensor_data(arr)
        del arr
    w.close()
    return Path(path)


def planned_bytes(plan: list[W.Planned], dtype: str) -> int:
    """What write_streamed's tensor data takes on disk (the metadata, tokenizer included, comes on top)."""
    return sum(int(np.prod(p.shape)) * np.dtype(W.storage_dtype(len(p.shape), dtype)).itemsize for p in plan)
