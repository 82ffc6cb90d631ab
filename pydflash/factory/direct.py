"""A quantized GGUF written straight from a tensor plan: each tensor drawn, quantized by ggml and written in turn.

factory/scale.py first writes a target in F16 and quantizes that file with llama_model_quantize. At Gemma-4-31B's
size the F16 file alone is 61 GB, and with its Q4_K_M (~19 GB) beside it a 64 GB disk is full. Here no F16 file
exists: every tensor is drawn in f32 (threads over fixed runs of rows, each run its own seeded stream, so the values
do not depend on the thread count), quantized row by row by ggml's own quantizer (pydflash.native.quantize
.quantize_rows) and written; memory holds one tensor (Gemma-4-31B's 262,144 x 5,376 embedding: 5.6 GB in f32), disk
the output alone.

The type of each tensor follows llama.cpp's mix for the file type (src/llama-quant.cpp, llama_tensor_get_type_impl),
for the tensors factory plans contain:
  - 1-D tensors (norms, rope factors, layer scalars) stay F32;
  - Q8_0 / F16: every matrix that type;
  - Q4_K_M: Q4_K, except the head (``output``, or ``token_embd`` where the head is tied to it) at Q6_K, and attn_v
    and ffn_down at Q6_K in the layers ``use_more_bits`` picks (the first and last eighth, and every third between;
    attn_v counted over the layers that have one: Gemma-4's full layers use K as V).
``tests/compat/test_scale_direct.py`` checks tensor by tensor that a file written here from an F16 file's values holds
the bytes llama_model_quantize writes from that file.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import gguf
import numpy as np

from . import weights as W

FILE_TYPES = {"F16": gguf.LlamaFileType.MOSTLY_F16, "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
              "Q4_K_M": gguf.LlamaFileType.MOSTLY_Q4_K_M}
ROWS_PER_STREAM = 1024  # rows drawn from one seeded stream: the unit of parallel drawing


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama-quant.cpp's choice of the layers that get more bits in the _M mixes."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def mix_types(plan: list[W.Planned], ftype: str) -> dict[str, str]:
    """GGUF tensor name -> storage type ("F32", "F16", "Q8_0", "Q4_K", "Q6_K") for a target plan at ftype."""
    if ftype not in FILE_TYPES:
        raise ValueError(f"unknown file type {ftype!r}; choose one of {sorted(FILE_TYPES)}")
    names = {p.name for p in plan}
    head = "output.weight" if "output.weight" in names else "token_embd.weight"
    n_layer = 1 + max((_layer(p.name) for p in plan if p.name.startswith("blk.")), default=-1)
    wv = [p.name for p in plan if p.name.endswith(".attn_v.weight")]
    types = {}
    for p in plan:
        if len(p.shape) < 2:
            types[p.name] = "F32"
            continue
        t = {"F16": "F16", "Q8_0": "Q8_0"}.get(ftype, "Q4_K")
        if ftype == "Q4_K_M":
            if p.name == head:
                t = "Q6_K"
            elif p.name in wv and use_more_bits(wv.index(p.name), len(wv)):
                t = "Q6_K"
            elif p.name.endswith(".ffn_down.weight") and use_more_bits(_layer(p.name), n_layer):
                t = "Q6_K"
        if p.shape[-1] % gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[t]][0]:
            # llama.cpp would fall back to another type for such a row; the factory's shapes never need one
            raise ValueError(f"{p.name}: rows of {p.shape[-1]} values do not make whole {t} blocks")
        types[p.name] = t
    return types


def _layer(name: str) -> int:
    return int(re.match(r"blk\.(\d+)\.", name).group(1))


def draw(p: W.Planned, seed: int, index: int, n_threads: int) -> np.ndarray:
    """The f32 array of planned tensor p (index: its place in the plan): runs of ROWS_PER_STREAM rows, each from
    rng_for(seed, 200, index, run), drawn on n_threads threads. The recipes are weights.make's (std gain / sqrt(in)
    for a matrix, std for an embedding); norms and fixed values are small and drawn as there."""
    if p.kind not in ("matrix", "embedding"):
        return W.make(p, W.rng_for(seed, 200, index, 0), "f32")
    rows, cols = p.shape
    std = p.scale / np.sqrt(cols) if p.kind == "matrix" else p.scale
    out = np.empty((rows, cols), dtype=np.float32)

    def run(r: int) -> None:
        part = out[r * ROWS_PER_STREAM:(r + 1) * ROWS_PER_STREAM]
        W.rng_for(seed, 200, index, r).standard_normal(part.shape, dtype=np.float32, out=part)
        part *= np.float32(std)

    n_runs = -(-rows // ROWS_PER_STREAM)
    with ThreadPoolExecutor(max(1, min(n_threads, n_runs))) as pool:
        list(pool.map(run, range(n_runs)))
    return out


def write_quantized(path: Path, arch: str, add_keys: Callable[[gguf.GGUFWriter], None], plan: list[W.Planned],
                    ftype: str, source: Callable[[int, W.Planned], np.ndarray], n_threads: int = 1) -> Path:
    """path at ftype from plan: add_keys writes the metadata (its file type is replaced by ftype's), source(i, p)
    makes the f32 array of the plan's i-th tensor right before it is quantized and written."""
    from ..native.quantize import quantize_rows, row_bytes  # loads libllama: not at import (scale --f16-only)

    types = mix_types(plan, ftype)
    w = gguf.GGUFWriter(str(path), arch)
    add_keys(w)
    # add_keys wrote the F16 / F32 file type of the staging path; a second add_file_type would log a warning
    w.kv_data[0][gguf.Keys.General.FILE_TYPE] = gguf.GGUFValue(int(FILE_TYPES[ftype]), gguf.GGUFValueType.UINT32)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for p in plan:
        t = types[p.name]
        if t == "F32":
            w.add_tensor_info(p.name, p.shape, np.dtype(np.float32), int(np.prod(p.shape)) * 4)
        else:
            rows = int(np.prod(p.shape[:-1]))
            nbytes = rows * row_bytes(t, p.shape[-1])
            w.add_tensor_info(p.name, (*p.shape[:-1], nbytes // rows), np.dtype(np.uint8), nbytes,
                              raw_dtype=gguf.GGMLQuantizationType[t])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for i, p in enumerate(plan):
        arr = np.asarray(source(i, p), dtype=np.float32).reshape(p.shape)
        t = types[p.name]
        data = arr if t == "F32" else quantize_rows(arr.reshape(-1, p.shape[-1]), t, n_threads)
        del arr
        w.write_tensor_data(data)
        del data
    w.close()
    return Path(path)
